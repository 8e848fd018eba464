"""Configuration: explicit arguments beat environment, environment beats the config file, the file beats defaults.

Every option names the environment variable it falls back to. An invalid environment value
warns once and falls back to the next source; an invalid explicit argument raises, naming the
option and what it accepts.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

import otel_rl.environment_variables as ENV
from otel_rl._sdk.settings.env_names import warn_unknown_names
from otel_rl._sdk.settings.parsers import comma_list, parse_endpoints, parse_profile_steps
from otel_rl._sdk.settings.redaction import redact_url as redact_url  # re-exported: the one URL redaction (redaction.py)
from otel_rl.reporting import ReportOnce
from otel_rl.semconv import METRICS

logger = logging.getLogger("otel_rl")

EXPORTER_CHOICES = ("auto", "file", "otlp", "none")
PROTOCOL_CHOICES = ("grpc", "http/protobuf")
DEFAULT_RUNS_DIR = "otel-rl-runs"


def _parse_bool(raw: Any) -> bool:
    if isinstance(raw, bool):
        return raw
    if isinstance(raw, int) and raw in (0, 1):
        return bool(raw)
    value = str(raw).strip().lower() if isinstance(raw, str) else None
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError("expected true/false")


def _parse_exporters(raw: Any) -> tuple[str, ...]:
    items = comma_list(raw, f"expected a comma-separated subset of {', '.join(EXPORTER_CHOICES)}")
    names = tuple(dict.fromkeys(i.lower() for i in items))
    bad = [n for n in names if n not in EXPORTER_CHOICES]
    if bad or not names:
        raise ValueError(f"expected a comma-separated subset of {', '.join(EXPORTER_CHOICES)}")
    return names


def _parse_protocol(raw: Any) -> str:
    if not isinstance(raw, str):
        raise ValueError(f"expected one of {', '.join(PROTOCOL_CHOICES)}")
    value = raw.strip().lower()
    if value == "http":  # a common shorthand
        value = "http/protobuf"
    if value not in PROTOCOL_CHOICES:
        raise ValueError(f"expected one of {', '.join(PROTOCOL_CHOICES)} (http/json is not supported by the Python exporters)")
    return value


def _number(raw: Any) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float, str)):
        raise ValueError("expected a number")
    return float(raw)


def _parse_positive_float(raw: Any) -> float:
    value = _number(raw)
    if not value > 0:
        raise ValueError("expected a positive number")
    return value


# The longest metric export interval: a day. Past it the reader thread's wait overflows the
# platform's time_t (1e30 ms: a traceback, and no metric exported for the rest of the run).
MAX_INTERVAL_S = 86_400.0


def _parse_interval_s(raw: Any) -> float:
    value = _parse_positive_float(raw)
    if value > MAX_INTERVAL_S:
        raise ValueError(f"expected at most {MAX_INTERVAL_S:g} seconds (a day)")
    return value


def _parse_interval_ms(raw: Any) -> float:
    value = _parse_positive_float(raw)
    if value > MAX_INTERVAL_S * 1000.0:
        raise ValueError(f"expected at most {MAX_INTERVAL_S * 1000.0:.0f} milliseconds (a day)")
    return value / 1000.0


def _parse_non_negative_int(raw: Any) -> int:
    value = _number(raw)
    if value != int(value) or value < 0:
        raise ValueError("expected a non-negative integer")
    return int(value)


def _parse_ratio(raw: Any) -> float:
    value = _number(raw)
    if not 0.0 <= value <= 1.0:
        raise ValueError("expected a ratio from 0 to 1")
    return value


def _parse_optional_int(raw: Any) -> int | None:
    if raw is None or raw == "":
        return None
    value = _number(raw)
    if value != int(value):
        raise ValueError("expected an integer")
    return int(value)


def _parse_names(raw: Any) -> str | tuple[str, ...]:
    # One name stays a string: then tracker_kwargs are that tracker's own settings (ROLL's YAML);
    # a list makes tracker_kwargs a mapping of tracker name -> settings.
    if isinstance(raw, str) and "," not in raw and raw.strip():
        return raw.strip()
    if isinstance(raw, str):
        items = raw.split(",")
    elif isinstance(raw, (list, tuple)) and all(isinstance(i, str) for i in raw):
        items = list(raw)
    else:
        raise ValueError("expected a tracker name or a list of names")
    names = tuple(dict.fromkeys(i.strip() for i in items if i.strip()))
    if not names:
        raise ValueError("expected a tracker name or a list of names")
    return names


def _parse_mapping(raw: Any) -> dict[str, Any]:
    if not isinstance(raw, Mapping):
        raise ValueError("expected a mapping of settings")
    return dict(raw)


def _parse_key_style(raw: Any) -> str:
    if raw not in ("original", "registry"):
        raise ValueError("expected original (keys as logged) or registry (registry metric names)")
    return str(raw)


def _parse_str(raw: Any) -> str:
    if isinstance(raw, os.PathLike):
        raw = os.fspath(raw)
    if not isinstance(raw, str) or not raw:
        raise ValueError("expected a non-empty string")
    return raw


def _parse_run_id(raw: Any) -> str:
    """A run id is also the name of its folder under otel-rl-runs/: one path component, never a path."""
    value = _parse_str(raw)
    if value in (".", "..") or any(c in value for c in "/\\\0"):
        raise ValueError("expected a name, not a path (no '/', '\\', '.' or '..': the run id names its folder under otel-rl-runs/)")
    return value


_BYTE_UNITS = {
    "": 1,
    "b": 1,
    "k": 10**3,
    "kb": 10**3,
    "kib": 2**10,
    "m": 10**6,
    "mb": 10**6,
    "mib": 2**20,
    "g": 10**9,
    "gb": 10**9,
    "gib": 2**30,
}


def _parse_byte_size(raw: Any) -> int:
    """A size in bytes: an integer, or a number with a unit (``512MiB``, ``1GB``, ``64k``)."""
    if isinstance(raw, bool):
        raise ValueError("expected a size in bytes such as 268435456, 256MiB or 1GB")
    if isinstance(raw, (int, float)):
        number, unit = float(raw), ""
    elif isinstance(raw, str):
        match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", raw)
        if match is None or match.group(2).lower() not in _BYTE_UNITS:
            raise ValueError("expected a size in bytes such as 268435456, 256MiB or 1GB")
        number, unit = float(match.group(1)), match.group(2).lower()
    else:
        raise ValueError("expected a size in bytes such as 268435456, 256MiB or 1GB")
    value = number * _BYTE_UNITS[unit]
    if value < 0 or value != value or value == float("inf"):
        raise ValueError("expected a non-negative size in bytes (0 turns the spool off)")
    return int(value)


def _parse_per_rank_metrics(raw: Any) -> tuple[str, ...]:
    names = tuple(dict.fromkeys(comma_list(raw, 'expected "all" or registry metric names separated by commas')))
    unknown = [n for n in names if n != "all" and n not in METRICS]
    if unknown:
        raise ValueError(
            f"{', '.join(repr(n) for n in unknown)} is not a registry metric name (e.g. rl.stage.duration; "
            "otel-rl semconv resolve KEY names the metric a framework key maps to), or write all"
        )
    return names


@dataclass(frozen=True, kw_only=True)
class TelemetryConfig:
    """Everything ``otel_rl.init`` accepts. Each field's metadata names its environment variable."""

    service_name: str = field(default="otel-rl", metadata={"env": "OTEL_SERVICE_NAME", "parse": _parse_str})
    run_id: str | None = field(default=None, metadata={"env": ENV.OTEL_RL_RUN_ID, "parse": _parse_run_id})
    experiment: str | None = field(default=None, metadata={"env": ENV.OTEL_RL_EXPERIMENT, "parse": _parse_str})
    framework: str | None = field(default=None, metadata={"env": ENV.OTEL_RL_FRAMEWORK, "parse": _parse_str})
    run_dir: str | None = field(default=None, metadata={"env": ENV.OTEL_RL_RUN_DIR, "parse": _parse_str})
    exporters: tuple[str, ...] = field(default=("auto",), metadata={"env": ENV.OTEL_RL_EXPORTERS, "parse": _parse_exporters})
    endpoint: str | None = field(default=None, metadata={"env": "OTEL_EXPORTER_OTLP_ENDPOINT", "parse": _parse_str})
    protocol: str = field(default="http/protobuf", metadata={"env": "OTEL_EXPORTER_OTLP_PROTOCOL", "parse": _parse_protocol})
    metric_export_interval_s: float = field(
        default=10.0, metadata={"env": "OTEL_METRIC_EXPORT_INTERVAL", "parse": _parse_interval_ms, "arg_parse": _parse_interval_s}
    )
    # The run folder's files (and, over OTLP, the disk spool) get each step's spans and events
    # within this many seconds: what a SIGKILL can lose of them (metric points: up to
    # metric_export_interval_s; the events hold every value of every step).
    file_flush_interval_s: float = field(
        default=0.02, metadata={"env": ENV.OTEL_RL_FILE_FLUSH_INTERVAL, "parse": _parse_interval_ms, "arg_parse": _parse_interval_s}
    )
    # Inference engines (vLLM, SGLang) whose /metrics a daemon thread reads into the rollout metrics
    # (_sdk/sources/engine_scrape.py).
    engine_endpoints: tuple[str, ...] | None = field(default=None, metadata={"env": ENV.OTEL_RL_ENGINE_ENDPOINTS, "parse": parse_endpoints})
    console: bool = field(default=True, metadata={"env": ENV.OTEL_RL_CONSOLE, "parse": _parse_bool})
    strict: bool = field(default=False, metadata={"env": ENV.OTEL_RL_STRICT, "parse": _parse_bool})
    unmapped_key_limit: int = field(default=256, metadata={"env": ENV.OTEL_RL_UNMAPPED_KEY_LIMIT, "parse": _parse_non_negative_int})
    rank: int | None = field(default=None, metadata={"env": "RANK", "parse": _parse_optional_int})
    local_rank: int | None = field(default=None, metadata={"env": "LOCAL_RANK", "parse": _parse_optional_int})
    world_size: int | None = field(default=None, metadata={"env": "WORLD_SIZE", "parse": _parse_optional_int})
    node_rank: int | None = field(default=None, metadata={"env": "NODE_RANK", "parse": _parse_optional_int})
    track_with: str | tuple[str, ...] | None = field(default=None, metadata={"env": ENV.OTEL_RL_TRACK_WITH, "parse": _parse_names})
    # Tracker settings hold credentials: never in repr(), public_dict() or the environment.
    tracker_kwargs: dict[str, Any] | None = field(default=None, repr=False, metadata={"env": None, "parse": _parse_mapping})
    tracker_keys: str = field(default="original", metadata={"env": ENV.OTEL_RL_TRACKER_KEYS, "parse": _parse_key_style})
    tracker_all_ranks: bool = field(default=False, metadata={"env": ENV.OTEL_RL_TRACKER_ALL_RANKS, "parse": _parse_bool})
    config_file: str | None = field(default=None, metadata={"env": ENV.OTEL_RL_CONFIG, "parse": _parse_str})
    # OTLP exports wait here while the collector is unreachable (default <run_dir>/spool), up to
    # spool_max_bytes per process; 0 sends straight through the SDK exporters, with no spool.
    spool_dir: str | None = field(default=None, metadata={"env": ENV.OTEL_RL_SPOOL_DIR, "parse": _parse_str})
    spool_max_bytes: int = field(default=256 * 2**20, metadata={"env": ENV.OTEL_RL_SPOOL_MAX_BYTES, "parse": _parse_byte_size})
    # Per process: at most series_limit attribute sets per metric (0: no cap), string attribute
    # values cut at attribute_value_limit characters (spans, events, metrics; 0: no cap).
    series_limit: int = field(default=2000, metadata={"env": ENV.OTEL_RL_SERIES_LIMIT, "parse": _parse_non_negative_int})
    # The series budget (_sdk/pipeline/series_budget.py): a rank other than 0 sends the store its
    # own state only; these metrics ("all", or registry names) it sends whole as well.
    per_rank_metrics: tuple[str, ...] = field(default=(), metadata={"env": ENV.OTEL_RL_PER_RANK_METRICS, "parse": _parse_per_rank_metrics})
    # Items (log() / record() calls, stage and step ends) the worker may lag behind the training
    # loop; past it log() / record() calls are dropped, never blocking (0: no bound).
    max_queue: int = field(default=1000, metadata={"env": ENV.OTEL_RL_MAX_QUEUE, "parse": _parse_non_negative_int})
    attribute_value_limit: int = field(
        default=1024, metadata={"env": "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "parse": _parse_non_negative_int}
    )
    # Text (prompts, completions: long strings, or strings under keys that name text) stays out of
    # the exported events unless this is on.
    export_text: bool = field(default=False, metadata={"env": ENV.OTEL_RL_EXPORT_TEXT, "parse": _parse_bool})
    # Rollout samples kept per step by Telemetry.log_samples (0: off; opt-in, they carry text) and
    # the bytes of each prompt / response kept.
    log_samples: int = field(default=0, metadata={"env": ENV.OTEL_RL_LOG_SAMPLES, "parse": _parse_non_negative_int})
    sample_text_limit: int = field(default=2048, metadata={"env": ENV.OTEL_RL_SAMPLE_TEXT_LIMIT, "parse": _parse_non_negative_int})
    # Agent trajectories (Telemetry.trajectory) exported as traces: this share by the head ratio, plus
    # each step's slowest, failed and extreme-reward ones; at most trajectory_limit held at once.
    trajectory_sample_ratio: float = field(default=0.01, metadata={"env": ENV.OTEL_RL_TRAJECTORY_SAMPLE_RATIO, "parse": _parse_ratio})
    trajectory_keep_slowest: int = field(default=3, metadata={"env": ENV.OTEL_RL_TRAJECTORY_KEEP_SLOWEST, "parse": _parse_non_negative_int})
    trajectory_limit: int = field(default=16384, metadata={"env": ENV.OTEL_RL_TRAJECTORY_LIMIT, "parse": _parse_non_negative_int})
    # Each log()'s values become data points stamped with its time_ns (backfilling an old log:
    # otel-rl replay), instead of the latest values stamped at each periodic export.
    metrics_at_log_time: bool = field(default=False, metadata={"env": ENV.OTEL_RL_METRICS_AT_LOG_TIME, "parse": _parse_bool})
    # Online alert rules run on every log() in the telemetry worker: "default" (the built-in rules),
    # "off", or a YAML rules file; unset: off until Telemetry.on_alert() is called.
    alert_rules: str | None = field(default=None, metadata={"env": ENV.OTEL_RL_ALERT_RULES, "parse": _parse_str})
    # torch.profiler windows over these steps ("10-12", "5,9-11"; traces in <run_dir>/profiles), and
    # CUDA memory snapshots when the memory_risk alert fires (see _sdk/sources/profiling.py).
    profile_steps: tuple[tuple[int, int], ...] | None = field(
        default=None, metadata={"env": ENV.OTEL_RL_PROFILE_STEPS, "parse": parse_profile_steps}
    )
    memory_snapshot_on_alert: bool = field(default=False, metadata={"env": ENV.OTEL_RL_MEMORY_SNAPSHOT_ON_ALERT, "parse": _parse_bool})

    @property
    def otlp_enabled(self) -> bool:
        return "otlp" in self.exporters or ("auto" in self.exporters and bool(self.endpoint))

    @property
    def file_enabled(self) -> bool:
        return "file" in self.exporters or ("auto" in self.exporters and not self.endpoint)

    def public_dict(self) -> dict[str, Any]:
        """The effective settings, safe to print: tracker settings appear with secrets redacted."""
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        if self.tracker_kwargs is not None:
            from otel_rl.trackers.fanout import redact_tracker_kwargs

            out["tracker_kwargs"] = redact_tracker_kwargs(self.track_with, self.tracker_kwargs)
        return out


_FIELDS = {f.name: f for f in dataclasses.fields(TelemetryConfig)}
_report_env_once = ReportOnce(logger)


def _warn_once(name: str, raw: str, reason: str) -> None:
    _report_env_once((name, raw), "otel-rl: ignoring %s=%r (%s); falling back to the config file or the default", name, raw, reason)


def read_yaml_file(path: str | os.PathLike[str], what: str, hint: str = "") -> Any:
    """A YAML file's document (None when empty); errors say which file (``what``) and why."""
    p = Path(path)
    try:
        return yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {p} does not exist{hint}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{what} {p} is not valid YAML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"{what} {p} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None


def load_config_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a YAML config file of TelemetryConfig fields; errors name the file and the bad key."""
    p = Path(path)
    data = read_yaml_file(p, "otel-rl config file", " (set by config_file= or OTEL_RL_CONFIG)")
    if data is None:  # an empty file
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"otel-rl config file {p} must hold a mapping of settings, got {type(data).__name__}")
    unknown = sorted(set(data) - set(_FIELDS) - {"config_file"})
    if unknown:
        raise ValueError(f"otel-rl config file {p}: unknown setting(s) {unknown}; known: {sorted(_FIELDS)}")
    return data


def resolve_config(kwargs: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> TelemetryConfig:
    """Merge explicit arguments, environment, config file and defaults, in that order of precedence."""
    kwargs = dict(kwargs or {})
    environ = os.environ if environ is None else environ
    unknown = sorted(set(kwargs) - set(_FIELDS))
    if unknown:
        raise TypeError(f"otel_rl.init() got unknown option(s) {unknown}; known: {sorted(_FIELDS)}")

    warn_unknown_names(environ)  # a misspelt OTEL_RL_* name would otherwise be ignored silently
    config_path = kwargs.get("config_file") or environ.get(ENV.OTEL_RL_CONFIG) or None
    from_file = load_config_file(config_path) if config_path else {}

    values: dict[str, Any] = {}
    for name, f in _FIELDS.items():
        parse = f.metadata["parse"]
        value_parse = f.metadata.get("arg_parse", parse)  # Python values; env strings may differ (ms)
        if name in kwargs and kwargs[name] is not None:
            raw = kwargs[name]
            try:
                values[name] = value_parse(raw)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"otel_rl.init({name}={raw!r}): {exc}") from None
            continue
        env_name = f.metadata["env"]
        raw_env = environ.get(env_name) if env_name else None
        if raw_env not in (None, ""):
            try:
                values[name] = parse(raw_env)
                continue
            except (TypeError, ValueError) as exc:
                _warn_once(env_name, raw_env, str(exc))
        if name in from_file and from_file[name] is not None:
            raw = from_file[name]
            try:
                values[name] = value_parse(raw)
            except (TypeError, ValueError) as exc:
                raise ValueError(f"otel-rl config file {config_path}: {name}={raw!r}: {exc}") from None
    if config_path:
        values["config_file"] = str(config_path)
    config = TelemetryConfig(**values)
    if config.run_id is None:
        config = dataclasses.replace(config, run_id=time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3))
    if config.run_dir is None:
        config = dataclasses.replace(config, run_dir=str(Path(DEFAULT_RUNS_DIR) / str(config.run_id)))
    return config
