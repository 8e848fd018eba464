"""Each run's tracker settings and how they are shown: with ``split_runs`` every run gets its own
folders, files and run names (``per_run_tracker_kwargs``), and every line the bridge prints has
the trackers' secrets masked."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from otel_rl.bridge.config import BridgeConfig
from otel_rl.trackers.fanout import redact_tracker_kwargs

__all__ = ["format_tracker_kwargs", "per_run_tracker_kwargs", "run_tracker_kwargs", "safe_label", "secret_strings"]

# tracker_kwargs settings that split_runs makes per-run (see otel_rl.bridge's doc).
_DIR_KEYS = ("log_dir", "logdir", "dir", "save_dir", "output_dir")
_FILE_KEYS = ("path", "file")
_NAME_KEYS: dict[str, tuple[str, ...]] = {"wandb": ("name",), "swanlab": ("experiment_name",), "mlflow": ("run_name",)}
_DEFAULT_NAME_KEYS = ("name", "run_name")


def safe_label(text: str) -> str:
    """``text`` as a folder- and file-name-safe label (at most 120 characters)."""
    label = re.sub(r"[^A-Za-z0-9._-]+", "_", text).strip("._")
    return label[:120] or "run"


def _suffixed_file(path: str, label: str) -> str:
    p = Path(path)
    return str(p.with_name(f"{p.stem}-{label}{p.suffix}"))


def _per_run(name: str, kwargs: Mapping[str, Any], label: str) -> dict[str, Any]:
    out = dict(kwargs)
    for key in _DIR_KEYS:
        if isinstance(out.get(key), str) and out[key]:
            out[key] = str(Path(out[key]) / label)
    for key in _FILE_KEYS:
        if isinstance(out.get(key), str) and out[key]:
            out[key] = _suffixed_file(out[key], label)
    for key in _NAME_KEYS.get(name, _DEFAULT_NAME_KEYS):
        if isinstance(out.get(key), str) and out[key]:
            out[key] = f"{out[key]}-{label}"
    return out


def per_run_tracker_kwargs(track_with: str | Sequence[str], tracker_kwargs: Mapping[str, Any], label: str) -> dict[str, Any]:
    """``tracker_kwargs`` with folders, files and run names made unique to the run ``label``."""
    if isinstance(track_with, str):
        return _per_run(track_with, tracker_kwargs, label)
    return {name: _per_run(name, kw, label) if isinstance(kw, Mapping) else kw for name, kw in tracker_kwargs.items()}


def run_tracker_kwargs(config: BridgeConfig, label: str | None) -> dict[str, Any]:
    """The tracker settings of the run ``label``: per run with ``split_runs``, else as configured."""
    if not config.split_runs or label is None:
        return dict(config.tracker_kwargs)
    return per_run_tracker_kwargs(config.track_with, config.tracker_kwargs, label)


def secret_strings(track_with: str | Sequence[str], tracker_kwargs: Mapping[str, Any]) -> tuple[str, ...]:
    """Every string that redaction masks (the trackers' secrets), longest first."""
    found: set[str] = set()

    def walk(original: Any, masked: Any) -> None:
        if isinstance(original, Mapping) and isinstance(masked, Mapping):
            for key, value in original.items():
                walk(value, masked.get(key))
        elif isinstance(original, (list, tuple)) and isinstance(masked, (list, tuple)):
            for a, b in zip(original, masked):
                walk(a, b)
        elif masked == "***" and original != "***":
            stack = [original]
            while stack:
                item = stack.pop()
                if isinstance(item, str):
                    found.add(item)
                    found.add(item.strip())
                elif isinstance(item, Mapping):
                    stack.extend(item.values())
                elif isinstance(item, (list, tuple)):
                    stack.extend(item)

    walk(tracker_kwargs, redact_tracker_kwargs(track_with, tracker_kwargs))
    return tuple(sorted((s for s in found if len(s) >= 4), key=len, reverse=True))


def format_tracker_kwargs(track_with: str | Sequence[str], kwargs: Mapping[str, Any]) -> str:
    """The trackers and their settings as one printable line, secrets masked."""
    shown = redact_tracker_kwargs(track_with, kwargs)
    names = [track_with] if isinstance(track_with, str) else list(track_with)
    if isinstance(track_with, str):
        return f"{track_with} {json.dumps(shown, default=str)}" if shown else track_with
    return ", ".join(f"{n} {json.dumps(shown[n], default=str)}" if shown.get(n) else n for n in names)
