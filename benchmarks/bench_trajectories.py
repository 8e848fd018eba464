"""What agent trajectories (``Telemetry.trajectory``) cost the whole process, side by side in one process.

    python benchmarks/bench_trajectories.py            # the table
    python benchmarks/bench_trajectories.py --quick    # fewer rounds (a smoke run)
    python benchmarks/bench_trajectories.py --json

A trajectory here is what an agent loop records per rollout: two turns (tokens, engine, finish
reason) and one tool call, and a reward: four spans. Every way runs in the same process, in
interleaved rounds; a round's figure is the CPU of every thread (``time.process_time``) from its
first call until everything it owes is written (``Telemetry.flush()``: the worker has decided the
step, recorded the metrics, built the kept spans and written them). That flush also exports the
telemetry's metrics once per round (a run does it every 10 s): counted in the ways that flush a
telemetry (otel-rl's, and the SDK's to the run folder, which flush the telemetry whose writer they
share). Reported: the median round.

1. A kept trajectory span (rounds of 200 trajectories in a step, every one kept: ratio 1), per span:
   - otel-rl, run folder: recorded on the caller's threads, built on the worker, written as OTLP/JSON;
   - OTel SDK, run folder: four ``start_as_current_span`` blocks with the same attributes on the
     same telemetry's tracer provider, so the same processor and writer take them;
   - otel-rl, no destination (``exporters="none"``): recording, the decision and the building alone;
   - OTel SDK, no destination: the same SDK spans on a provider with no processor.
2. 10,000 sampled-out trajectory spans in one step (2,500 trajectories, ratio 0, no slowest
   kept): the step's whole cost, the metrics of every trajectory included:
   - otel-rl; OTel SDK spans recorded and exported to the run folder (no sampling);
   - OTel SDK with the ALWAYS_OFF sampler (non-recording spans: the SDK's cheapest, with no tail
     rule and no metrics).

Targets: a kept trajectory span <= 10 us (otel-rl, no destination: what the trajectory machinery
adds before an exporter); 10,000 sampled-out spans <= 50 ms in all.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from opentelemetry.sdk.trace import TracerProvider  # noqa: E402
from opentelemetry.sdk.trace.sampling import ALWAYS_OFF  # noqa: E402

import otel_rl  # noqa: E402
from otel_rl.semconv import attributes as A  # noqa: E402
from otel_rl.semconv import metrics as M  # noqa: E402
from otel_rl.semconv import names as N  # noqa: E402

R = A.RlTrajectoryReasonValues
OP = A.GenAiOperationNameValues

TARGET_KEPT_SPAN_US = 10.0
TARGET_SAMPLED_OUT_MS = 50.0
SPANS_PER_TRAJECTORY = 4
KEPT_PER_ROUND = 200
SAMPLED_OUT_TRAJECTORIES = 2500  # 10,000 spans


def otel_rl_trajectory(tel: otel_rl.Telemetry, i: int) -> None:
    with tel.trajectory(i, group=i // 8) as traj:
        with traj.turn(tokens_in=512, engine="10.0.0.3:8000") as turn:
            turn.done(tokens_out=87, finish_reason="tool_calls")
        with traj.tool("search", call_id=f"call-{i}"):
            pass
        with traj.turn(tokens_in=640, engine="10.0.0.3:8000") as turn:
            turn.done(tokens_out=12, finish_reason="stop")
        traj.reward(0.5, components={"format": 1.0, "answer": 0.5})


def sdk_trajectory(tracer: Any, i: int) -> None:
    """The same four spans as SDK spans, with the attributes otel-rl's carry."""
    root = {
        A.GEN_AI_OPERATION_NAME: OP.INVOKE_AGENT.value,
        A.RL_SAMPLE_ID: str(i),
        A.RL_STEP: 1,
        A.RL_SAMPLE_GROUP_ID: str(i // 8),
        A.RL_TRAJECTORY_REWARD: 0.5,
        f"{A.RL_TRAJECTORY_REWARDS}.format": 1.0,
        f"{A.RL_TRAJECTORY_REWARDS}.answer": 0.5,
    }
    with tracer.start_as_current_span(N.RL_TRAJECTORY_SPAN, attributes=root) as span:
        with tracer.start_as_current_span(
            N.RL_TURN_SPAN, attributes={A.GEN_AI_OPERATION_NAME: OP.CHAT.value, A.GEN_AI_USAGE_INPUT_TOKENS: 512}
        ) as turn:
            turn.set_attributes({A.GEN_AI_USAGE_OUTPUT_TOKENS: 87, A.GEN_AI_RESPONSE_FINISH_REASONS: ("tool_calls",)})
        with tracer.start_as_current_span(
            N.RL_TOOL_SPAN, attributes={A.GEN_AI_OPERATION_NAME: OP.EXECUTE_TOOL.value, A.GEN_AI_TOOL_NAME: "search"}
        ):
            pass
        with tracer.start_as_current_span(
            N.RL_TURN_SPAN, attributes={A.GEN_AI_OPERATION_NAME: OP.CHAT.value, A.GEN_AI_USAGE_INPUT_TOKENS: 640}
        ) as turn:
            turn.set_attributes({A.GEN_AI_USAGE_OUTPUT_TOKENS: 12, A.GEN_AI_RESPONSE_FINISH_REASONS: ("stop",)})
        span.set_attributes({A.RL_TRAJECTORY_TURN_COUNT: 2, A.RL_TRAJECTORY_TOOL_CALL_COUNT: 1})


def telemetry(**options: Any) -> otel_rl.Telemetry:
    options.setdefault("run_dir", tempfile.mkdtemp(prefix="otel-rl-bench-"))
    return otel_rl.Telemetry(otel_rl.resolve_config({"console": False, "service_name": "bench", "max_queue": 0, **options}))


def round_cpu(run: Callable[[], None], settle: Callable[[], Any]) -> float:
    t0 = time.process_time()
    run()
    settle()
    return time.process_time() - t0


def interleaved(ways: dict[str, tuple[Callable[[], None], Callable[[], Any]]], rounds: int) -> dict[str, float]:
    """Each way's median round CPU (s), the order of the ways alternating from round to round."""
    seen: dict[str, list[float]] = {name: [] for name in ways}
    names = list(ways)
    for r in range(rounds):
        for name in names if r % 2 == 0 else reversed(names):
            run, settle = ways[name]
            seen[name].append(round_cpu(run, settle))
    return {name: statistics.median(values) for name, values in seen.items()}


def run(quick: bool = False) -> dict[str, float]:
    logging.getLogger("otel_rl").setLevel(logging.ERROR)
    rounds = 5 if quick else 21
    kept_file = telemetry(trajectory_sample_ratio=1.0)
    kept_none = telemetry(trajectory_sample_ratio=1.0, exporters="none")
    sampled_out = telemetry(trajectory_sample_ratio=0.0, trajectory_keep_slowest=0)
    sdk_file = kept_file._providers.tracer_provider.get_tracer("bench.sdk")  # the same processor and writer
    sdk_none = TracerProvider(resource=kept_file.resource).get_tracer("bench.sdk")
    sdk_off = TracerProvider(resource=kept_file.resource, sampler=ALWAYS_OFF).get_tracer("bench.sdk")
    step = [0]

    def trajectories(tel: otel_rl.Telemetry, n: int) -> Callable[[], None]:
        def go() -> None:
            step[0] += 1
            with tel.step(step[0]):
                for i in range(n):
                    otel_rl_trajectory(tel, i)

        return go

    def sdk(tracer: Any, n: int) -> Callable[[], None]:
        def go() -> None:
            for i in range(n):
                sdk_trajectory(tracer, i)

        return go

    def nothing() -> None:
        pass

    for tel in (kept_file, kept_none, sampled_out):  # warm: the first step plans, opens files, builds caches
        trajectories(tel, 50)()
        tel.flush()
    kept = interleaved(
        {
            "otel_rl_file": (trajectories(kept_file, KEPT_PER_ROUND), kept_file.flush),
            "sdk_file": (sdk(sdk_file, KEPT_PER_ROUND), kept_file.flush),
            "otel_rl_none": (trajectories(kept_none, KEPT_PER_ROUND), kept_none.flush),
            "sdk_none": (sdk(sdk_none, KEPT_PER_ROUND), nothing),
        },
        rounds,
    )
    per_span = {name: seconds / (KEPT_PER_ROUND * SPANS_PER_TRAJECTORY) * 1e6 for name, seconds in kept.items()}
    big = interleaved(
        {
            "otel_rl": (trajectories(sampled_out, SAMPLED_OUT_TRAJECTORIES), sampled_out.flush),
            "sdk_file": (sdk(sdk_file, SAMPLED_OUT_TRAJECTORIES), kept_file.flush),
            "sdk_always_off": (sdk(sdk_off, SAMPLED_OUT_TRAJECTORIES), nothing),
        },
        max(3, rounds // 3),
    )
    # what the tail rule kept of the sampled-out steps: the highest and the lowest reward of each
    counts = {
        reason.value: sampled_out.latest(
            M.RL_TRAJECTORY_COUNT, {A.RL_TRAJECTORY_KEPT: reason is not R.SAMPLED_OUT, A.RL_TRAJECTORY_REASON: reason.value}
        )
        or 0.0
        for reason in R
    }
    for tel in (kept_file, kept_none, sampled_out):
        tel.shutdown()
    results = {
        "kept_span_us": per_span["otel_rl_none"],
        "kept_span_sdk_us": per_span["sdk_none"],
        "kept_span_vs_sdk": per_span["otel_rl_none"] / per_span["sdk_none"],
        "kept_span_file_us": per_span["otel_rl_file"],
        "kept_span_file_sdk_us": per_span["sdk_file"],
        "kept_span_file_vs_sdk": per_span["otel_rl_file"] / per_span["sdk_file"],
        "sampled_out_10k_ms": big["otel_rl"] * 1e3,
        "sampled_out_10k_sdk_exported_ms": big["sdk_file"] * 1e3,
        "sampled_out_10k_sdk_always_off_ms": big["sdk_always_off"] * 1e3,
        "sampled_out_vs_sdk_exported": big["otel_rl"] / big["sdk_file"],
        "sampled_out_vs_sdk_always_off": big["otel_rl"] / big["sdk_always_off"],
    }
    results["sampled_out_kept_share"] = sum(v for k, v in counts.items() if k != R.SAMPLED_OUT.value) / max(1.0, sum(counts.values()))
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the measurements and ratios as JSON")
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run, noisier)")
    args = parser.parse_args(argv)
    r = run(quick=args.quick)
    met = {"kept_span_us": r["kept_span_us"] <= TARGET_KEPT_SPAN_US, "sampled_out_10k_ms": r["sampled_out_10k_ms"] <= TARGET_SAMPLED_OUT_MS}
    if args.json:
        targets = {"kept_span_us": f"<= {TARGET_KEPT_SPAN_US}", "sampled_out_10k_ms": f"<= {TARGET_SAMPLED_OUT_MS}"}
        print(json.dumps({"results": r, "targets": targets, "met": met}, indent=2))
        return 0
    print("Whole-process CPU (every thread), median of interleaved rounds")
    print(
        f"kept trajectory span, no destination:  {r['kept_span_us']:7.2f} us   SDK span {r['kept_span_sdk_us']:.2f} us   "
        f"ratio {r['kept_span_vs_sdk']:.2f}   (target <= {TARGET_KEPT_SPAN_US:g} us) {'ok' if met['kept_span_us'] else 'MISSED'}"
    )
    print(
        f"kept trajectory span, run folder:      {r['kept_span_file_us']:7.2f} us   SDK span {r['kept_span_file_sdk_us']:.2f} us   "
        f"ratio {r['kept_span_file_vs_sdk']:.2f}"
    )
    print(
        f"10,000 sampled-out spans in a step:    {r['sampled_out_10k_ms']:7.2f} ms   SDK, all exported {r['sampled_out_10k_sdk_exported_ms']:.1f} ms "
        f"(ratio {r['sampled_out_vs_sdk_exported']:.2f})   SDK, ALWAYS_OFF {r['sampled_out_10k_sdk_always_off_ms']:.1f} ms "
        f"(ratio {r['sampled_out_vs_sdk_always_off']:.2f})   (target <= {TARGET_SAMPLED_OUT_MS:g} ms) "
        f"{'ok' if met['sampled_out_10k_ms'] else 'MISSED'}"
    )
    print(f"  of those trajectories the tail rule kept {r['sampled_out_kept_share']:.2%} (each step's highest and lowest reward)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
