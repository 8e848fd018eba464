"""The alert rules evaluated live by vmalert against the stack's VictoriaMetrics.

A demo run with an injected instability (``run_demo(inject_spike_at=N)``: a real learning-rate
blow-up) must fire RLTrainingDivergence; a healthy demo run must fire nothing at all. The stack's
own vmalert must have loaded the committed rule file.

The committed rules are written for real training, where a step takes minutes (10-minute
windows, a 1-hour baseline, ``for: 2m``, evaluation every minute). A demo run lasts seconds, so
this test runs the same rules with every duration divided by 60 (``otel_rl.ops.alerts``, time scale
60: 10 s windows, a 1-minute baseline, ``for: 2s``, evaluation every second) in a vmalert of its
own, each evaluation as of EVAL_DELAY_S ago: a sample takes a few seconds from the demo through
the agent and gateway collectors into VictoriaMetrics, nothing against 10-minute windows but most of a 2-second
one. Thresholds, floors and expressions are otherwise identical (tests/alerts checks that).
"""

from __future__ import annotations

import json
import statistics
import subprocess
import threading
import time
import urllib.error
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from stack_support import http_json, poll

import otel_rl
import otel_rl.ops.alerts as _alerts
from otel_rl.semconv import attributes as A
from otel_rl.semconv import metrics as M
from otel_rl.stack.process import free_port

pytestmark = pytest.mark.e2e

SCALE = _alerts.FAST_TIME_SCALE
EVAL_S = _alerts.INTERVAL_S // SCALE
RECENT_S = _alerts.RECENT_S // SCALE
# demo -> agent -> gateway -> VictoriaMetrics takes 2-4 s on a busy 2-core machine (1 s batches
# each), and more under CI's load: the KL threshold's 2 s window sees a one-sample spike at two
# evaluations only if the sample is stored by the first of them
EVAL_DELAY_S = 8
# Gauges export the latest value per export: a step must outlast an export, or its value (the
# spike's, say) may never leave the process. The demo's own pace on 2 cores is 0.1-3 s a step.
EXPORT_S = 0.25
STEP_PERIOD_S = 0.4
HEALTHY_STEPS = 30  # 12 s or more: longer than the 10 s window, so later evaluations have a baseline
SPIKE_AT = 20  # 8 s or more after the first step; VictoriaMetrics makes a new series searchable within ~10 s
SPIKE_STEPS = SPIKE_AT + 4  # entropy collapses on the rollouts after the bad update (SPIKE_AT + 1)
DIVERGENCE = "RLTrainingDivergence"
RUN_ID_LABEL = _alerts.label(A.RL_RUN_ID)


def demo_config() -> Any:
    """A smaller batch than the demo's default, so a step stays well under a second on 2 cores."""
    from otel_rl.demo import DemoConfig

    return DemoConfig(prompts_per_step=16, group_size=4, ppo_epochs=2, mini_batches=2, val_every=10_000, checkpoint_every=10_000)


class PacedTelemetry:
    """The run's telemetry with each step's ``log`` held until ``period_s`` after the previous one.

    Records the wall time at which each step was logged (the spike's, to compare alert times with).
    """

    def __init__(self, telemetry: Any, period_s: float) -> None:
        self._telemetry = telemetry
        self._period_s = period_s
        self._last = 0.0
        self.logged_at: dict[int, float] = {}

    def log(self, values: Any, step: int | None = None) -> None:
        wait = self._last + self._period_s - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self._last = time.monotonic()
        if step is not None:
            self.logged_at[step] = time.time()
        self._telemetry.log(values, step=step)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._telemetry, name)


@dataclass
class Seen:
    """One alert (name, run) as vmalert reported it: first pending / firing times, last report."""

    name: str
    run_id: str
    first: dict[str, float] = field(default_factory=dict)  # state -> wall time first seen
    last: float = 0.0
    summary: str = ""


class AlertWatcher(threading.Thread):
    """Polls vmalert's /api/v1/alerts every half second and remembers every alert it reported."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.seen: dict[tuple[str, str], Seen] = {}
        self.errors: list[str] = []
        self._stop_event = threading.Event()
        self._lock = threading.Lock()

    def run(self) -> None:
        while not self._stop_event.is_set():
            try:
                alerts = http_json(f"{self.url}/api/v1/alerts", timeout_s=5)["data"]["alerts"] or []
            except Exception as exc:  # keep polling; the test reports it if nothing is seen
                self.errors.append(str(exc))
                alerts = []
            now = time.time()
            with self._lock:
                for alert in alerts:
                    key = (alert["name"], alert["labels"].get(RUN_ID_LABEL, ""))
                    seen = self.seen.setdefault(key, Seen(*key))
                    seen.first.setdefault(alert["state"], now)
                    seen.last = now
                    seen.summary = alert.get("annotations", {}).get("summary", "")
            self._stop_event.wait(0.5)

    def stop(self) -> None:
        self._stop_event.set()
        self.join(timeout=10)

    def for_run(self, run_id: str) -> dict[str, Seen]:
        with self._lock:
            return {name: seen for (name, rid), seen in self.seen.items() if rid == run_id}


@pytest.fixture(scope="module")
def fast_vmalert(stack: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A vmalert of this test's own, with the short-window rules, against the stack's VictoriaMetrics."""
    from otel_rl.stack._install import Installer

    folder = tmp_path_factory.mktemp("vmalert")
    rules = _alerts.write_rules_file(folder / "otel-rl-fast.rules.yml", SCALE)
    binary = Installer(stack.data_dir, stack.cache_dir, lambda: None).binary("victoria-metrics", "vmalert")
    port = free_port()
    log_path = folder / "vmalert.log"
    command = [
        str(binary),
        f"-datasource.url={stack.endpoints['victoria_metrics']}",
        f"-httpListenAddr=127.0.0.1:{port}",
        "-notifier.blackhole",
        f"-evaluationInterval={EVAL_S}s",
        f"-rule.evalDelay={EVAL_DELAY_S}s",
        f"-rule={rules}",
    ]
    with open(log_path, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"

    def answer() -> Any:
        if process.poll() is not None:  # exited: no point waiting out the deadline
            pytest.fail(f"vmalert exited with {process.returncode}: {log_path.read_text()[-2000:]}")
        return http_json(f"{url}/api/v1/rules", timeout_s=2)

    try:
        poll(answer, lambda got: got["status"] == "success", 30, f"vmalert on {url} (log: {log_path})")
        yield url
    finally:
        process.terminate()  # by its PID
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


@dataclass
class Runs:
    healthy_id: str
    spike_id: str
    healthy_span: tuple[float, float]  # wall times of the first and last logged step
    spike_logged_at: dict[int, float]
    watcher: AlertWatcher


def run_paced(stack: Any, run_id: str, root: Path, steps: int, spike_at: int | None) -> PacedTelemetry:
    from otel_rl.demo import run_demo

    telemetry = otel_rl.init(
        service_name="otel-rl-e2e-alerts",
        run_id=run_id,
        endpoint=stack.endpoints["otlp_http"],
        protocol="http/protobuf",
        exporters="otlp",
        metric_export_interval_s=EXPORT_S,
        console=False,
    )
    paced = PacedTelemetry(telemetry, STEP_PERIOD_S)
    try:
        run_demo(
            steps=steps, algo="grpo", telemetry=paced, out=root / run_id, inject_spike_at=spike_at, progress=False, config=demo_config()
        )
    finally:
        telemetry.shutdown()
    return paced


@pytest.fixture(scope="module")
def runs(stack: Any, fast_vmalert: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    """A healthy run, then a run with a spike at step SPIKE_AT, watched by vmalert throughout."""
    pytest.importorskip("torch")
    root = tmp_path_factory.mktemp("alert-runs")
    stamp = int(time.time())
    watcher = AlertWatcher(fast_vmalert)
    watcher.start()
    try:
        healthy = run_paced(stack, f"e2e-alerts-healthy-{stamp}", root, HEALTHY_STEPS, None)
        spiked = run_paced(stack, f"e2e-alerts-spike-{stamp}", root, SPIKE_STEPS, SPIKE_AT)
        runs = Runs(
            f"e2e-alerts-healthy-{stamp}",
            f"e2e-alerts-spike-{stamp}",
            (min(healthy.logged_at.values()), max(healthy.logged_at.values())),
            spiked.logged_at,
            watcher,
        )
        # wait (bounded) for the divergence alert, which can only fire within the recent window
        # after the spike; the tests judge what was seen
        deadline = time.monotonic() + EVAL_DELAY_S + RECENT_S + 20
        while time.monotonic() < deadline and "firing" not in getattr(watcher.for_run(runs.spike_id).get(DIVERGENCE), "first", {}):
            time.sleep(0.5)
        # watch a little longer: anything pending on the healthy run gets time to fire
        time.sleep(EVAL_DELAY_S + 2 * EVAL_S)
        spike = runs.spike_logged_at[SPIKE_AT]
        for (name, run_id), seen in sorted(watcher.seen.items()):
            times = ", ".join(f"{state} at spike{t - spike:+.1f}s" for state, t in seen.first.items())
            print(f"vmalert: {name} {run_id}: {times}")
        yield runs
    finally:
        watcher.stop()


def vm_answer(stack: Any, expr: str) -> dict[str, Any]:
    """VictoriaMetrics' answer to an instant query, an error included (its JSON body, not an exception)."""
    try:
        return http_json(f"{stack.endpoints['victoria_metrics']}/api/v1/query", {"query": expr}, timeout_s=30)
    except urllib.error.HTTPError as error:
        return json.loads(error.read().decode("utf-8") or "{}")


def vm_range(stack: Any, expr: str, start: float, end: float) -> list[tuple[float, float]]:
    answer = http_json(
        f"{stack.endpoints['victoria_metrics']}/api/v1/query_range",
        {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": "0.5s"},
    )
    assert answer["status"] == "success", answer
    result = answer["data"]["result"]
    return [(float(t), float(v)) for t, v in result[0]["values"]] if result else []


def test_the_stacks_vmalert_loaded_the_committed_rules(stack: Any):
    answer = http_json(f"{stack.endpoints['vmalert']}/api/v1/rules")
    groups = {g["name"]: g for g in answer["data"]["groups"]}
    expected = {g.name: [r.alert for r in g.rules] for g in _alerts.build_groups()}
    for name, alerts in expected.items():
        assert name in groups, sorted(groups)
        assert [r["name"] for r in groups[name]["rules"]] == alerts
        assert groups[name]["interval"] == _alerts.INTERVAL_S
        for rule in groups[name]["rules"]:
            if rule.get("lastError"):
                # An evaluation can fail for the load alone (VictoriaMetrics queues a query for at most
                # 10 s on 2 busy cores); the rule is at fault only if its query fails on the data now.
                answer = vm_answer(stack, rule["query"])
                assert answer.get("status") == "success", (rule["name"], rule["lastError"], answer)


def test_the_spike_moves_kl_grad_norm_and_entropy(stack: Any, runs: Runs):
    """What VictoriaMetrics holds for the spiked run: KL and grad norm jump, entropy collapses."""
    run = f'{RUN_ID_LABEL}="{runs.spike_id}"'
    spike = runs.spike_logged_at[SPIKE_AT]
    start, end = runs.spike_logged_at[1], runs.spike_logged_at[SPIKE_STEPS]
    # every sample counts (a step's value lives for one or two exports): extremes over 1 s, each 0.5 s
    kl = f"max(max_over_time({_alerts.metric(M.RL_POLICY_KL)}{{{run}}}[1s]))"
    grad = f'max(max_over_time({_alerts.metric(M.RL_GRAD_NORM)}{{{run},{_alerts.label(A.RL_MODEL_ROLE)}="actor"}}[1s]))'
    entropy = f'min(min_over_time({_alerts.metric(M.RL_POLICY_ENTROPY)}{{{run},{_alerts.label(A.RL_STATISTIC)}="mean"}}[1s]))'
    for name, expr in (("KL", kl), ("grad norm", grad), ("entropy", entropy)):
        points = vm_range(stack, expr, start, end + 2)
        before = [v for t, v in points if t < spike - 0.2]  # the spike's value is exported after it is logged
        if name == "entropy":
            # it collapses on the rollouts after the bad update: well under a third of its median
            after = [v for t, v in points if t > spike + 1.2]
            assert before and after, (name, points)
            assert min(after) < statistics.median(before) / 3, (name, before, after)
        else:
            # KL and grad norm jump at the spike step itself (the collapsed policy's KL is ~0 after
            # it), and its export may land within a second: look from the step on
            after = [v for t, v in points if t >= spike]
            assert before and after, (name, points)
            assert max(after) > 100 * max(before), (name, before, after)


def test_divergence_fires_on_the_spiked_run(runs: Runs):
    seen = runs.watcher.for_run(runs.spike_id)
    assert DIVERGENCE in seen and "firing" in seen[DIVERGENCE].first, (seen, runs.watcher.errors[-3:])
    divergence = seen[DIVERGENCE]
    spike = runs.spike_logged_at[SPIKE_AT]
    # never active before the spike step, firing within the recent window after it
    assert min(divergence.first.values()) > spike - 1.0, (divergence, spike)
    assert divergence.first["firing"] < spike + EVAL_DELAY_S + RECENT_S + 2 * EVAL_S, (divergence, spike)
    assert runs.spike_id in divergence.summary and "diverging" in divergence.summary
    # seed 003's KL threshold sees the same spike
    kl = seen["RLKLAboveThreshold"]
    assert "firing" in kl.first, {state: f"spike{t - spike:+.1f}s" for state, t in kl.first.items()}


def test_a_healthy_run_fires_nothing(stack: Any, runs: Runs):
    healthy = runs.watcher.for_run(runs.healthy_id)
    assert {name: seen.first for name, seen in healthy.items()} == {}
    # the healthy run's data was there to evaluate, past the first recent window
    first, last = runs.healthy_span
    assert last - first > RECENT_S
    entropy = vm_range(stack, f'max({_alerts.metric(M.RL_POLICY_ENTROPY)}{{{RUN_ID_LABEL}="{runs.healthy_id}"}})', first, last)
    assert len(entropy) > 10
