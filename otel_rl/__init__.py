"""otel-rl: OpenTelemetry traces, metrics and events for reinforcement learning of language models.

```python
import otel_rl

tel = otel_rl.init(service_name="grpo-demo")        # OTEL_* env honoured
for step in range(n):
    with tel.step(step):                            # root span of this step's trace
        with tel.stage("generate", cluster="actor_infer"):
            ...
        with tel.stage("train_step", cluster="actor_train", offload=True) as st:
            with st.phase("onload"): ...
            with st.phase("execute"): ...
            with st.phase("offload"): ...
        tel.log({"actor/pg_loss": 0.12, **st.metrics}, step=step)
        tel.record(otel_rl.semconv.metrics.RL_SAMPLE_REWARD, rewards)   # a whole array
tel.shutdown()
```

Metric and attribute names come from the generated ``otel_rl.semconv`` package.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from otel_rl import semconv
from otel_rl._lazy import lazy_attributes
from otel_rl._version import __version__

if TYPE_CHECKING:
    from otel_rl._sdk.settings.config import TelemetryConfig, resolve_config
    from otel_rl._sdk.settings.options import AlertOptions, ExportOptions, LimitOptions, TrackerOptions
    from otel_rl._sdk.spans.scopes import JoinScope, Phase, Stage, StepScope
    from otel_rl._sdk.spans.trajectories import ToolCall, Trajectory, Turn
    from otel_rl._sdk.telemetry import Telemetry
    from otel_rl.trackers.base import Tracker, known_trackers, register_tracker

# The public classes load on first use: a command (`otel-rl trace`, `show`, `analyze`) that reads
# runs starts without the SDK, the pipeline and numpy (0.4 s of a start).
_LAZY = {
    "AlertOptions": "otel_rl._sdk.settings.options",
    "ExportOptions": "otel_rl._sdk.settings.options",
    "LimitOptions": "otel_rl._sdk.settings.options",
    "TrackerOptions": "otel_rl._sdk.settings.options",
    "TelemetryConfig": "otel_rl._sdk.settings.config",
    "resolve_config": "otel_rl._sdk.settings.config",  # for Telemetry(resolve_config({...})): several live instances
    "JoinScope": "otel_rl._sdk.spans.scopes",
    "Phase": "otel_rl._sdk.spans.scopes",
    "Stage": "otel_rl._sdk.spans.scopes",
    "StepScope": "otel_rl._sdk.spans.scopes",
    "ToolCall": "otel_rl._sdk.spans.trajectories",
    "Trajectory": "otel_rl._sdk.spans.trajectories",
    "Turn": "otel_rl._sdk.spans.trajectories",
    "Telemetry": "otel_rl._sdk.telemetry",
    "Tracker": "otel_rl.trackers.base",
    "known_trackers": "otel_rl.trackers.base",
    "register_tracker": "otel_rl.trackers.base",
}


__getattr__, __dir__ = lazy_attributes(__name__, _LAZY)

logger = logging.getLogger("otel_rl")

_current: Telemetry | None = None
_GROUP_NAMES = ("export", "trackers", "limits", "alerts")
_init_lock = threading.Lock()  # one init() at a time: each replaces the one before exactly once


def init(
    *,
    service_name: str | None = None,
    run_id: str | None = None,
    experiment: str | None = None,
    framework: str | None = None,
    run_dir: str | None = None,
    exporters: str | list[str] | tuple[str, ...] | None = None,
    endpoint: str | None = None,
    protocol: str | None = None,
    metric_export_interval_s: float | None = None,
    console: bool | None = None,
    strict: bool | None = None,
    unmapped_key_limit: int | None = None,
    rank: int | None = None,
    local_rank: int | None = None,
    world_size: int | None = None,
    track_with: str | list[str] | None = None,
    tracker_kwargs: dict[str, Any] | None = None,
    tracker_keys: str | None = None,
    tracker_all_ranks: bool | None = None,
    config_file: str | None = None,
    node_rank: int | None = None,
    tracer_provider: Any = None,
    alert_rules: str | None = None,
    on_alert: Callable[[Any], Any] | Sequence[Callable[[Any], Any]] | None = None,
    spool_dir: str | None = None,
    spool_max_bytes: int | str | None = None,
    series_limit: int | None = None,
    per_rank_metrics: str | list[str] | None = None,
    attribute_value_limit: int | None = None,
    export_text: bool | None = None,
    log_samples: int | None = None,
    sample_text_limit: int | None = None,
    trajectory_sample_ratio: float | None = None,
    trajectory_keep_slowest: int | None = None,
    trajectory_limit: int | None = None,
    metrics_at_log_time: bool | None = None,
    max_queue: int | None = None,
    file_flush_interval_s: float | None = None,
    engine_endpoints: str | list[str] | None = None,
    profile_steps: str | int | list[int | str] | None = None,
    memory_snapshot_on_alert: bool | None = None,
    export: ExportOptions | None = None,
    trackers: TrackerOptions | None = None,
    limits: LimitOptions | None = None,
    alerts: AlertOptions | None = None,
) -> Telemetry:
    """Start telemetry for this process and return it.

    Every option falls back to its environment variable (``OTEL_SERVICE_NAME``,
    ``OTEL_EXPORTER_OTLP_ENDPOINT``, ``OTEL_EXPORTER_OTLP_PROTOCOL``, ``OTEL_METRIC_EXPORT_INTERVAL``,
    ``OTEL_RL_*``, ``RANK``/``LOCAL_RANK``/``WORLD_SIZE``), then to ``config_file`` (YAML), then
    to its default. With no endpoint, everything is written as OTLP-JSON lines into ``run_dir``
    (default ``otel-rl-runs/<run_id>``). ``exporters`` picks ``file``, ``otlp`` or both.

    The options also come in groups, for code that builds them apart: ``export=ExportOptions(...)``,
    ``trackers=TrackerOptions(...)``, ``limits=LimitOptions(...)``, ``alerts=AlertOptions(...)``
    hold the flat keywords of their kind (same names, same variables); an option given both flat
    and in a group raises TypeError naming it.

    ``track_with`` / ``tracker_kwargs`` feed experiment trackers exactly as ROLL's YAML does
    (``tensorboard``, ``wandb``, ``swanlab``, ``stdout``, ``jsonl``, ``mlflow``, or a name given to
    ``register_tracker``); every step's values arrive with the keys as logged (``tracker_keys=
    "registry"`` for registry names), from rank 0 only unless ``tracker_all_ranks``.

    Rank, local rank, world size and node rank left open are read from torch.distributed (once
    its process group is up), Ray Train's worker context, or the launcher's environment.
    ``tracer_provider``: an SDK TracerProvider the program already installed (a framework's own
    tracing); otel-rl adds its span processors to it instead of creating a second one.

    ``alert_rules`` (``OTEL_RL_ALERT_RULES``): online alert rules run on every ``log()`` in the
    telemetry worker, off the training thread: ``"default"`` (divergence, kl > 10, clipped_ratio >
    0.3, memory risk, dynamic-batch runaway, rank imbalance, inference anomaly), ``"off"``, or a
    YAML rules file. Each firing is an ``rl.alert`` event and counts in the ``rl.alert`` metric.
    ``on_alert``: callable(s) ``(alert) -> None`` called for each alert (turns the default rules on
    when none are configured); see ``Telemetry.on_alert``, ``should_stop`` and ``take_alerts``.

    ``profile_steps`` (``OTEL_RL_PROFILE_STEPS``): ``"10-12"``, ``"5"`` or ``"5,9-11"`` runs
    torch.profiler from the first step of each window to the end of its last, writes the trace to
    ``<run_dir>/profiles/steps-10-12.rank0.pt.trace.json``, names it in the window's ``rl.step``
    spans (``rl.profile.path``), and makes the window's stages ``record_function`` (and, on CUDA,
    NVTX) ranges. ``memory_snapshot_on_alert`` (``OTEL_RL_MEMORY_SNAPSHOT_ON_ALERT``): record the
    CUDA allocator's history and dump a snapshot into ``<run_dir>/profiles/`` when ``memory_risk`` fires.

    OTLP exports wait in a disk spool while the collector is unreachable: ``spool_dir``
    (``OTEL_RL_SPOOL_DIR``, default ``<run_dir>/spool``), up to ``spool_max_bytes``
    (``OTEL_RL_SPOOL_MAX_BYTES``, default 256 MiB; ``"1GB"`` works; 0 turns it off). Guards:
    ``series_limit`` series per metric (``OTEL_RL_SERIES_LIMIT``, 2000), attribute values cut at
    ``attribute_value_limit`` characters (``OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT``, 1024), and text
    (prompts, completions, long strings) kept out of exported events unless ``export_text``.
    The series budget: a rank other than 0 sends the metrics store its own state (GPU, process,
    stage time as sum and count) and its share of the job's observations, not copies of the job's
    values; ``per_rank_metrics`` (``OTEL_RL_PER_RANK_METRICS``: ``"all"`` or registry metric names)
    asks for whole per-rank copies (docs/overhead.md, "The series budget").

    ``log_samples`` (``OTEL_RL_LOG_SAMPLES``, 0: off): ``Telemetry.log_samples`` keeps up to this many
    rollout samples (prompt, response, reward and its parts) per step as ``rl.sample`` events, which
    trackers show as a table; each prompt / response is cut at ``sample_text_limit`` bytes
    (``OTEL_RL_SAMPLE_TEXT_LIMIT``, 2048). Opt-in: samples carry text.

    ``Telemetry.trajectory`` records agent rollouts (turns, tool calls) as traces of their own:
    ``trajectory_sample_ratio`` (``OTEL_RL_TRAJECTORY_SAMPLE_RATIO``, 0.01) of them by the head
    ratio, plus each step's ``trajectory_keep_slowest`` (``OTEL_RL_TRAJECTORY_KEEP_SLOWEST``, 3)
    slowest, its failed and its highest- and lowest-rewarded ones; at most ``trajectory_limit``
    (``OTEL_RL_TRAJECTORY_LIMIT``, 16384) held at once. Every trajectory counts in the metrics.

    ``engine_endpoints`` (``OTEL_RL_ENGINE_ENDPOINTS``, comma-separated): vLLM / SGLang Prometheus
    ``/metrics`` URLs that rank 0 reads every 5 s on a daemon thread into the rollout metrics
    (requests, KV cache, tokens, preemptions, TTFT / TPOT), per engine ``server.address``; see
    ``otel_rl.integrations.engines``.

    ``metrics_at_log_time`` (``OTEL_RL_METRICS_AT_LOG_TIME``): every ``log()`` value becomes its own
    data point at the call's ``time_ns`` instead of the latest value at each export, so a log
    backfilled in seconds keeps its original timeline in the metrics store (``otel-rl replay``).

    ``max_queue`` (``OTEL_RL_MAX_QUEUE``, 1000): items the worker may lag behind the loop; past it
    ``log()`` / ``record()`` calls are dropped, never blocking, and counted in
    ``rl.telemetry.dropped{drop_reason="queue_full"}``. ``file_flush_interval_s``
    (``OTEL_RL_FILE_FLUSH_INTERVAL`` in ms, 0.02 s): spans and events reach the run folder's files
    (and, over OTLP, the disk spool) within this, which bounds what a killed process loses.

    One telemetry per process: calling ``init()`` again, while the telemetry of the previous call
    is running, replaces it. The new one starts first (so an ``init()`` that fails leaves the old
    one running), then the old one is flushed and shut down, and a warning names both run
    folders. To keep the running one, use ``get_telemetry()`` instead of a second ``init()``.
    Several live instances in one process (ranks simulated in a test) are built with
    ``Telemetry(config)`` directly; ``init()`` never touches those.
    """
    global _current
    groups = (export, trackers, limits, alerts)
    given = {k: v for k, v in locals().items() if v is not None and k not in ("tracer_provider", "groups", *_GROUP_NAMES)}
    from otel_rl._sdk.settings.config import resolve_config  # (after locals(): the options are the arguments alone)
    from otel_rl._sdk.settings.options import merge_groups
    from otel_rl._sdk.sources.engine_scrape import scrape_engines
    from otel_rl._sdk.telemetry import Telemetry

    options = merge_groups(given, *groups)
    on_alert = options.pop("on_alert", None)
    with _init_lock:
        tel = Telemetry(resolve_config(options), tracer_provider=tracer_provider)
        try:
            hooks = [on_alert] if callable(on_alert) else list(on_alert or ())
            for hook in hooks:
                tel.on_alert(hook)
            if tel.config.engine_endpoints and not tel.rank:  # rank 0 reads them: more ranks would count each engine again
                scrape_engines(tel, tel.config.engine_endpoints)
        except BaseException:
            tel.shutdown()
            raise
        previous, _current = _current, tel
        if previous is not None and not previous.closed:
            _replace(previous, tel)
    return tel


def _replace(previous: Telemetry, successor: Telemetry) -> None:
    """Shut down the telemetry of an earlier init() (flushing it), saying once that it was replaced."""
    logger.warning(
        "otel-rl: otel_rl.init() was called again while the telemetry of an earlier init() was running: "
        "that one (%s) is flushed and shut down, and the new one (%s) replaces it. Use "
        "otel_rl.get_telemetry() to reuse a running telemetry.",
        _where(previous),
        _where(successor),
    )
    previous.shutdown()


def _where(tel: Telemetry) -> str:
    """Where a telemetry writes, for messages: its run folder, or its run id when it has none."""
    return f"run folder {tel.run_dir}" if tel.run_dir is not None else f"run {tel.config.run_id}, no run folder"


def get_telemetry() -> Telemetry | None:
    """The telemetry started by the latest ``init()`` in this process, unless it was shut down.

    None before ``init()`` and after ``shutdown()``: code that may run without telemetry checks
    for it. To log from code that holds no telemetry, call ``otel_rl.log(...)``, which says what to
    do when ``init()`` was not called.
    """
    return _current if _current is not None and not _current.closed else None


def log(values: Mapping[str, Any], step: int | None = None, *, time_ns: int | None = None) -> None:
    """``Telemetry.log`` on the telemetry of the latest ``init()``, for code that holds no handle on it.

    Before any ``init()`` in this process it raises RuntimeError ("call otel_rl.init() first"):
    nothing could record the values. After ``init()`` it never raises (bad values are reported
    once, as ``Telemetry.log`` does); after ``shutdown()`` the values are dropped, said once and counted.
    """
    tel = _current
    if tel is None:
        raise RuntimeError(
            "otel-rl: otel_rl.log() was called before otel_rl.init(); nothing records the values. "
            "Call otel_rl.init() first (once per process, before the training loop)."
        )
    tel.log(values, step, time_ns=time_ns)


def shutdown(timeout_s: float = 5.0) -> None:
    """Flush and stop the telemetry started by ``init()``, within ``timeout_s`` (see ``Telemetry.shutdown``)."""
    if _current is not None:
        _current.shutdown(timeout_s)


__all__ = [
    "AlertOptions",
    "ExportOptions",
    "JoinScope",
    "LimitOptions",
    "Phase",
    "Stage",
    "StepScope",
    "Telemetry",
    "TelemetryConfig",
    "ToolCall",
    "Tracker",
    "TrackerOptions",
    "Trajectory",
    "Turn",
    "__version__",
    "get_telemetry",
    "init",
    "known_trackers",
    "log",
    "register_tracker",
    "resolve_config",
    "semconv",
    "shutdown",
]
