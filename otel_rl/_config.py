"""Configuration: explicit arguments beat environment, environment beats the config file, the file beats defaults.

Every option names the environment variable it falls back to. An invalid environment value
warns once and falls back to the next source; an invalid explicit argument raises, naming the
option and what it accepts.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

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
    if isinstance(raw, str):
        items = raw.split(",")
    elif isinstance(raw, (list, tuple)) and all(isinstance(i, str) for i in raw):
        items = list(raw)
    else:
        raise ValueError(f"expected a comma-separated subset of {', '.join(EXPORTER_CHOICES)}")
    names = tuple(dict.fromkeys(i.strip().lower() for i in items if i.strip()))
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


def _parse_interval_ms(raw: Any) -> float:
    return _parse_positive_float(raw) / 1000.0


def _parse_non_negative_int(raw: Any) -> int:
    value = _number(raw)
    if value != int(value) or value < 0:
        raise ValueError("expected a non-negative integer")
    return int(value)


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


@dataclass(frozen=True, kw_only=True)
class TelemetryConfig:
    """Everything ``otel_rl.init`` accepts. Each field's metadata names its environment variable."""

    service_name: str = field(default="otel-rl", metadata={"env": "OTEL_SERVICE_NAME", "parse": _parse_str})
    run_id: str | None = field(default=None, metadata={"env": "OTEL_RL_RUN_ID", "parse": _parse_str})
    experiment: str | None = field(default=None, metadata={"env": "OTEL_RL_EXPERIMENT", "parse": _parse_str})
    framework: str | None = field(default=None, metadata={"env": "OTEL_RL_FRAMEWORK", "parse": _parse_str})
    run_dir: str | None = field(default=None, metadata={"env": "OTEL_RL_RUN_DIR", "parse": _parse_str})
    exporters: tuple[str, ...] = field(default=("auto",), metadata={"env": "OTEL_RL_EXPORTERS", "parse": _parse_exporters})
    endpoint: str | None = field(default=None, metadata={"env": "OTEL_EXPORTER_OTLP_ENDPOINT", "parse": _parse_str})
    protocol: str = field(default="http/protobuf", metadata={"env": "OTEL_EXPORTER_OTLP_PROTOCOL", "parse": _parse_protocol})
    metric_export_interval_s: float = field(default=10.0, metadata={"env": "OTEL_METRIC_EXPORT_INTERVAL", "parse": _parse_interval_ms, "arg_parse": _parse_positive_float})
    console: bool = field(default=True, metadata={"env": "OTEL_RL_CONSOLE", "parse": _parse_bool})
    strict: bool = field(default=False, metadata={"env": "OTEL_RL_STRICT", "parse": _parse_bool})
    unmapped_key_limit: int = field(default=256, metadata={"env": "OTEL_RL_UNMAPPED_KEY_LIMIT", "parse": _parse_non_negative_int})
    rank: int | None = field(default=None, metadata={"env": "RANK", "parse": _parse_optional_int})
    local_rank: int | None = field(default=None, metadata={"env": "LOCAL_RANK", "parse": _parse_optional_int})
    world_size: int | None = field(default=None, metadata={"env": "WORLD_SIZE", "parse": _parse_optional_int})
    node_rank: int | None = field(default=None, metadata={"env": "NODE_RANK", "parse": _parse_optional_int})
    track_with: str | tuple[str, ...] | None = field(default=None, metadata={"env": "OTEL_RL_TRACK_WITH", "parse": _parse_names})
    # Tracker settings hold credentials: never in repr(), public_dict() or the environment.
    tracker_kwargs: dict[str, Any] | None = field(default=None, repr=False, metadata={"env": None, "parse": _parse_mapping})
    tracker_keys: str = field(default="original", metadata={"env": "OTEL_RL_TRACKER_KEYS", "parse": _parse_key_style})
    tracker_all_ranks: bool = field(default=False, metadata={"env": "OTEL_RL_TRACKER_ALL_RANKS", "parse": _parse_bool})
    config_file: str | None = field(default=None, metadata={"env": "OTEL_RL_CONFIG", "parse": _parse_str})

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
            from .exporters.trackers import redact_tracker_kwargs

            out["tracker_kwargs"] = redact_tracker_kwargs(self.track_with, self.tracker_kwargs)
        return out


_FIELDS = {f.name: f for f in dataclasses.fields(TelemetryConfig)}
_warned_env: set[tuple[str, str]] = set()


def _warn_once(name: str, raw: str, reason: str) -> None:
    if (name, raw) not in _warned_env:
        _warned_env.add((name, raw))
        logger.warning("otel-rl: ignoring %s=%r (%s); falling back to the config file or the default", name, raw, reason)


def read_yaml_file(path: str | os.PathLike[str], what: str, hint: str = "") -> Any:
    """A YAML file's document (None when empty); errors say which file (``what``) and why."""
    p = Path(path)
    try:
        return yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"{what} {p} does not exist{hint}") from None
    except yaml.YAMLError as exc:
        raise ValueError(f"{what} {p} is not valid YAML: {exc}") from None


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

    config_path = kwargs.get("config_file") or environ.get("OTEL_RL_CONFIG") or None
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
