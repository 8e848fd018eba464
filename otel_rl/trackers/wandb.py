"""``track_with: wandb``: Weights & Biases, configured as ROLL's WandbTracker.

Settings (ROLL's): ``api_key``, ``project``, ``name`` (default: the run name), ``notes``,
``tags``, ``mode`` (``online`` / ``offline`` / ``disabled``; unset, W&B reads ``WANDB_MODE``),
``log_dir`` or ``dir`` (default ``run_dir``; W&B adds its ``wandb/`` folder), ``settings`` (a
mapping of ``wandb.Settings`` fields; default ROLL's ``{"console": "off"}``), and passed through
to ``wandb.init``: ``entity``, ``group``, ``config`` (merged under the hparams).

The API key is given to ``wandb.init`` as ``wandb.Settings(api_key=...)``: W&B then uses it for
this process only. ROLL calls ``wandb.login(key=...)``, which also writes it to ``~/.netrc``;
that is not done here. In offline and disabled modes the key is not passed at all.

Values: numbers (NaN and infinities included) as they are, bools as 0/1, strings as W&B text
values; ``None`` and other objects are left out. ``step`` is W&B's step (``None``: W&B counts).

Rollout samples (``log_samples``): a ``wandb.Table`` under the key ``samples`` at the step, one row
per sample, as TRL's GRPO ``log_completions`` logs its ``completions`` table.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from otel_rl.trackers.base import Tracker, to_scalar
from otel_rl.trackers.samples import table_rows

__all__ = ["WandbTracker"]

_NO_LOGIN_MODES = frozenset({"offline", "dryrun", "disabled"})
SAMPLES_KEY = "samples"


class WandbTracker(Tracker):
    name = "wandb"
    extra = "wandb"
    secret_keys = ("api_key", "settings.api_key")
    options = {
        "api_key": None,
        "project": None,
        "name": None,
        "notes": None,
        "tags": None,
        "mode": None,
        "log_dir": None,
        "dir": None,
        "entity": None,
        "group": None,
        "config": None,
        "settings": None,
    }

    def __init__(self, *, run_name: str, run_dir: Path | None, **tracker_kwargs: Any) -> None:
        super().__init__(run_name=run_name, run_dir=run_dir, **tracker_kwargs)
        directory = self.settings["dir"] or self.settings["log_dir"] or self.run_dir
        self.dir = Path(directory) if directory is not None else None
        self.run: Any = None
        self._sample_step: int | None = None
        self._sample_rows: list[Mapping[str, Any]] = []

    def _api_key(self) -> str | None:
        return (self.settings["settings"] or {}).get("api_key") or self.settings["api_key"]

    def start(self, hparams: Mapping[str, Any] | None = None) -> None:
        import wandb

        # The key stays out of this frame's locals (see Tracker.backend_call): init() reads it.
        settings: dict[str, Any] = {k: v for k, v in (self.settings["settings"] or {"console": "off"}).items() if k != "api_key"}
        mode = self.settings["mode"] or os.environ.get("WANDB_MODE") or "online"
        login = bool(self._api_key()) and mode.lower() not in _NO_LOGIN_MODES  # offline: no key at all
        config = self.scrub_hparams({**(self.settings["config"] or {}), **(hparams or {})})
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)

        def init() -> Any:
            credentials: dict[str, Any] = {"api_key": self._api_key()} if login else {}
            return wandb.init(
                project=self.settings["project"],
                entity=self.settings["entity"],
                name=self.settings["name"] or self.run_name,
                notes=self.settings["notes"],
                tags=self.settings["tags"],
                group=self.settings["group"],
                dir=str(self.dir) if self.dir is not None else None,
                mode=self.settings["mode"],
                config=config,
                settings=wandb.Settings(**settings, **credentials),
            )

        self.run = self.backend_call("wandb.init", init)

    def log(self, values: Mapping[str, Any], step: int | None = None) -> None:
        data: dict[str, Any] = {}
        for key, value in values.items():
            if isinstance(value, str):
                data[key] = value
            elif (number := to_scalar(value)) is not None:
                data[key] = number
            elif value is not None:
                self.report_once(key, f"is left out: not a number or text ({type(value).__name__})")
        if data:
            self.backend_call("wandb log", self.run.log, data, step=step)

    def log_samples(self, rows: Sequence[Mapping[str, Any]], step: int | None) -> None:
        import wandb

        # A step's second call (its samples came in two export batches) logs the whole step again:
        # the same key at the same step replaces the first table in W&B's row.
        rows = [*self._sample_rows, *rows] if step is not None and step == self._sample_step else list(rows)
        self._sample_step, self._sample_rows = step, rows
        names, data = table_rows(rows)
        columns: list[Any] = names  # W&B types cells and column keys narrowly; these are text, numbers, bools
        cells: list[Any] = data
        table = wandb.Table(columns=columns, data=cells, allow_mixed_types=True)
        self.backend_call("wandb log samples", self.run.log, {SAMPLES_KEY: table}, step=step)

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        config = self.scrub_hparams(hparams)
        self.backend_call("wandb config update", self.run.config.update, config, allow_val_change=True)

    def finish(self) -> None:
        if self.run is not None:
            self.backend_call("wandb finish", self.run.finish)
            self.run = None
