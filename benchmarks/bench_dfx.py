"""Per-step cost of the DFX helpers (otel_rl.dfx) on a 4096-sample batch of CPU tensors.

    python benchmarks/bench_dfx.py                 # a table
    python benchmarks/bench_dfx.py --json          # the measurements as JSON
    python benchmarks/bench_dfx.py --response-len 1024 --quick

What is measured (best of several rounds, same process): for each family of helpers, the
training thread's cost of one step's calls plus ``StepStats.flush()`` (computing the small
results, the one batched host read, and handing the values to the telemetry queue); then all
families together as one step with a single flush; then the telemetry worker's own share of
that step (binning histograms, setting gauges), which runs off the training thread. The caller
is measured with the telemetry worker held, so the two do not interleave.

Torch runs on one CPU thread by default (``--threads``): the figures are per-op costs, not a
race for the machine's cores. On a GPU the tensor reductions take microseconds; the host-side
parts (engine outputs, timelines, recording) cost the same as here.

For scale, ``reference_read_ms`` is the time of one plain ``sum()`` over every [B, R] tensor the
step checks: any per-tensor check costs at least about one such read.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import otel_rl  # noqa: E402
from otel_rl import dfx  # noqa: E402


def make_batch(batch: int, response_len: int, prompt_len: int, seed: int = 0) -> dict[str, Any]:
    """A GRPO step's tensors and engine outputs: B samples, left-padded prompts, right-padded responses."""
    g = torch.Generator().manual_seed(seed)
    resp_lens = torch.randint(1, response_len + 1, (batch,), generator=g)
    prompt_lens = torch.randint(prompt_len // 4, prompt_len + 1, (batch,), generator=g)
    mask = (torch.arange(response_len)[None, :] < resp_lens[:, None]).long()
    attention = torch.cat([(torch.arange(prompt_len)[None, :] >= prompt_len - prompt_lens[:, None]).long(), mask], 1)
    input_ids = torch.randint(0, 32_000, attention.shape, generator=g) * attention
    old_logp = -torch.rand(batch, response_len, generator=g) * mask
    ref_logp = old_logp + 0.01 * torch.randn(batch, response_len, generator=g) * mask
    rollout_logp = old_logp + 0.001 * torch.randn(batch, response_len, generator=g) * mask  # the engine's, for the mismatch
    advantages = torch.randn(batch, 1, generator=g) * mask
    rewards = torch.randn(batch, generator=g)
    now = time.time()
    outputs = [  # vLLM RequestOutput-shaped stand-ins (V0 metrics), one completion each
        SimpleNamespace(
            prompt_token_ids=range(int(p)),
            outputs=[SimpleNamespace(token_ids=range(int(r)), finish_reason="length" if int(r) == response_len else "stop")],
            metrics=SimpleNamespace(
                arrival_time=now,
                first_token_time=now + 0.2,
                last_token_time=now + 0.2 + 0.01 * int(r),
                finished_time=now + 0.21 + 0.01 * int(r),
            ),
        )
        for p, r in zip(prompt_lens.tolist(), resp_lens.tolist())
    ]
    return {
        "mask": mask,
        "attention": attention,
        "input_ids": input_ids,
        "old_logp": old_logp,
        "ref_logp": ref_logp,
        "rollout_logp": rollout_logp,
        "advantages": advantages,
        "rewards": rewards,
        "resp_lens": resp_lens,
        "prompt_lens": prompt_lens,
        "sample_ids": torch.arange(batch),
        "engine_lens": resp_lens.tolist(),
        "outputs": outputs,
        "versions": torch.full((batch,), 7),
        "response_len": response_len,
    }


def families(b: dict[str, Any]) -> dict[str, Callable[[dfx.StepStats, Any], None]]:
    """Each family's helpers as one step calls them. ``ctx`` holds long-lived helper objects."""
    mask, n = b["mask"], b["mask"].shape[0]
    micro = [b["attention"][i : i + 512].sum() for i in range(0, n, 512)]

    def correctness(stats, ctx):
        dfx.count_nonfinite(
            stats, {"old_log_probs": b["old_logp"], "ref_log_probs": b["ref_logp"], "advantages": b["advantages"], "rewards": b["rewards"]}
        )
        ctx.step += 1
        for stage, extra in (
            ("compute_log_probs", {"old_log_probs": b["old_logp"]}),
            ("compute_ref_log_probs", {"ref_log_probs": b["ref_logp"]}),
            ("train_step", {"old_log_probs": b["old_logp"], "advantages": b["advantages"]}),
        ):
            dfx.token_alignment(stats, stage, mask, logprobs=b["old_logp"], response_lengths=b["engine_lens"])
            ctx.ledger.record(
                dfx.batch_id(ctx.step), stage, {"input_ids": b["input_ids"], "response_mask": mask, **extra}, sample_ids=b["sample_ids"]
            )

    def data_quality(stats, ctx):
        dfx.lengths(stats, prompt_lengths=b["prompt_lens"], response_lengths=b["resp_lens"], max_response_length=b["response_len"])
        dfx.reward_distribution(stats, b["rewards"])

    def performance(stats, ctx):
        dfx.throughput(stats, seconds=30.0, tokens=b["attention"].sum(), samples=n)
        dfx.mfu(stats, ctx.spec, b["attention"].sum(-1).repeat(4), 20.0, peak_flops=989.4e12, num_devices=8)
        tl = dfx.StepTimeline()
        tl.begin(at=0.0)
        for i, cluster in enumerate(("actor_infer", "reward", "actor_train", "reference", "actor_train", "actor_infer")):
            tl.add(cluster, i * 5.0, i * 5.0 + 4.0)
        dfx.pipeline_bubble(stats, tl, end=30.0)

    def load_balance(stats, ctx):
        per_rank = [mask[i::8].sum() for i in range(8)]  # what all_gather of each rank's token count gives
        dfx.rank_balance(
            stats, tokens=per_rank, active_time=[10.0 + 0.1 * r for r in range(8)], communication_time=[1.0] * 8, step_time=12.0
        )
        dfx.queue_depth(stats, "rollout", n)

    def memory(stats, ctx):
        dfx.kv_cache(
            stats, [{"kv_cache_usage": u, "num_gpu_blocks": 8000, "block_size": 16, "kv_bytes_per_token": 131072} for u in (0.3, 0.9, 0.6)]
        )
        dfx.comm_buffer_peak(stats, 2 * 7e9)
        dfx.fragmentation(stats, allocated=60e9, reserved=70e9, device=0)

    def rollout(stats, ctx):
        dfx.record_requests(stats, b["outputs"])

    def reward(stats, ctx):
        guarded = ctx.guarded
        for r in b["engine_lens"]:
            guarded(r)
        dfx.reward_batch(stats, seconds=2.0, tokens=b["attention"].sum())

    def training(stats, ctx):
        for stage, logp in (("compute_log_probs", b["old_logp"]), ("compute_ref_log_probs", b["ref_logp"])):
            dfx.logprob_stage(stats, stage, logp, mask, micro_batch_tokens=micro)
        dfx.train_infer_mismatch(stats, b["old_logp"], b["rollout_logp"], mask)
        dfx.response_mask_ratio(stats, "train_step", mask)
        for _ in range(16):  # 16 micro-batches of forward / backward
            with ctx.timer.op("forward"):
                pass
            with ctx.timer.op("backward"):
                pass
        with ctx.timer.op("optimizer_step"):
            pass
        dfx.grad_norm(stats, b["rewards"].norm())
        dfx.losses(stats, {"policy": b["rewards"][0], "kl": b["rewards"][1], "entropy": b["rewards"][2], "total": b["rewards"][3]})

    def asynchronous(stats, ctx):
        dfx.policy_lag(stats, b["versions"], 8, max_lag=1)

    return {
        "correctness": correctness,
        "data_quality": data_quality,
        "performance": performance,
        "load_balance": load_balance,
        "memory": memory,
        "rollout": rollout,
        "reward": reward,
        "training": training,
        "asynchronous": asynchronous,
    }


def context(stats: dfx.StepStats) -> SimpleNamespace:
    return SimpleNamespace(
        step=0,
        ledger=dfx.ShapeLedger(stats),
        spec=dfx.ModelSpec(7_000_000_000, 32, 4096),
        timer=dfx.ComputeTimer(stats, "train_step", device="cpu"),
        guarded=dfx.guard_reward(stats, lambda r: float(r > 10), 0.0, name="rule"),
    )


def best_ms(fn: Callable[[], None], rounds: int, between: Callable[[], None]) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
        between()
    return best * 1e3


def run(batch: int = 4096, response_len: int = 512, prompt_len: int = 256, quick: bool = False, threads: int = 1) -> dict[str, Any]:
    rounds = 3 if quick else 10
    logging.getLogger("otel_rl").setLevel(logging.ERROR)
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    tel = otel_rl.init(service_name="bench-dfx", run_dir=tempfile.mkdtemp(prefix="otel-rl-bench-dfx-"), exporters="none", console=False)
    pipeline = tel._pipeline
    b = make_batch(batch, response_len, prompt_len)
    fams = families(b)
    out: dict[str, Any] = {
        "batch": batch,
        "response_len": response_len,
        "prompt_len": prompt_len,
        "threads": torch.get_num_threads(),
        "families_ms": {},
    }

    def drain() -> None:
        pipeline.drain()

    for name, fam in fams.items():
        stats = dfx.StepStats(tel)
        ctx = context(stats)

        def one() -> None:
            fam(stats, ctx)
            stats.flush()

        one()
        drain()
        out["families_ms"][name] = _held(pipeline, lambda: best_ms(one, rounds, lambda: None), drain)

    stats = dfx.StepStats(tel)
    ctx = context(stats)

    def whole_step() -> None:
        for fam in fams.values():
            fam(stats, ctx)
        stats.flush()

    whole_step()
    drain()
    before = stats.transfers
    out["step_ms"] = _held(pipeline, lambda: best_ms(whole_step, rounds, lambda: None), drain)
    out["transfers_per_step"] = (stats.transfers - before) / rounds
    # the worker's share of one step, off the training thread
    worker = float("inf")
    for _ in range(rounds):
        with pipeline._drain_lock:
            whole_step()
        t0 = time.perf_counter()
        drain()
        worker = min(worker, time.perf_counter() - t0)
    out["worker_ms_per_step"] = worker * 1e3
    checked = [b["old_logp"], b["ref_logp"], b["advantages"], b["mask"], b["input_ids"]]
    out["reference_read_ms"] = best_ms(lambda: [t.sum() for t in checked], rounds, lambda: None)
    tel.shutdown()
    return out


def _held(pipeline: Any, measure: Callable[[], float], drain: Callable[[], None]) -> float:
    """Measure with the telemetry worker held (it takes the drain lock), then let it drain."""
    with pipeline._drain_lock:
        value = measure()
    drain()
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print the measurements as JSON")
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run, noisier)")
    parser.add_argument("--batch", type=int, default=4096, help="samples per step (default 4096)")
    parser.add_argument("--response-len", type=int, default=512, help="padded response width (default 512)")
    parser.add_argument("--prompt-len", type=int, default=256, help="padded prompt width (default 256)")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch CPU threads (default 1: on a shared machine, multi-threaded reductions mostly measure waits for a free core)",
    )
    args = parser.parse_args(argv)
    r = run(args.batch, args.response_len, args.prompt_len, quick=args.quick, threads=args.threads)
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(
        f"DFX helpers, one step of {r['batch']} samples x {r['response_len']} response tokens "
        f"(+{r['prompt_len']} prompt), CPU, {r['threads']} threads"
    )
    for name, ms in r["families_ms"].items():
        print(f"  {name:<14} {ms:9.2f} ms")
    print(f"  {'whole step':<14} {r['step_ms']:9.2f} ms   ({r['transfers_per_step']:.0f} batched host read per step)")
    print(f"  worker, off-thread: {r['worker_ms_per_step']:.2f} ms per step")
    print(f"  for scale: one sum() over each checked [B, R] tensor: {r['reference_read_ms']:.2f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
