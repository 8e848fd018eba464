"""``track_with: swanlab``: SwanLab, configured as ROLL's SwanlabTracker.

Settings (ROLL's): ``login_kwargs`` (``{api_key: ..., host: ...}``, the arguments of
``swanlab.login``), ``project``, ``workspace``, ``experiment_name`` (default: the run name),
``description``, ``tags``, ``logdir`` (default ``run_dir/swanlog``), and passed through to
``swanlab.init``: ``mode`` (``online``, ``local``, ``offline``, ``disabled``; ``cloud``, the
older name of ``online``, is accepted; unset, SwanLab reads ``SWANLAB_MODE``), ``group``,
``job_type``, ``config`` (merged under the hparams).

Login happens only in online mode, with ``save=False`` so SwanLab keeps the key in memory and
never writes it to its ``.netrc``. In ``local``/``offline``/``disabled`` mode nothing logs in.
``login_kwargs`` are secret as a whole (they are login settings).

Values: numbers (NaN and infinities included) as scalars, bools as 0/1, strings as
``swanlab.Text`` (SwanLab's scalars reject strings); ``None`` and other objects are left out.
SwanLab allows one active run per process.

Rollout samples (``log_samples``): a ``swanlab.echarts.Table`` under the key ``samples`` at the step,
one row per sample, as verl's ``ValidationGenerationsLogger`` logs ``val/generations``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from otel_rl.trackers.base import Tracker, to_scalar
from otel_rl.trackers.samples import table_rows

__all__ = ["SwanlabTracker"]

_MODE_ALIASES = {"cloud": "online"}
SAMPLES_KEY = "samples"


class SwanlabTracker(Tracker):
    name = "swanlab"
    extra = "swanlab"
    secret_keys = ("login_kwargs",)
    options = {
        "login_kwargs": None,
        "project": None,
        "workspace": None,
        "experiment_name": None,
        "description": None,
        "tags": None,
        "logdir": None,
        "mode": None,
        "group": None,
        "job_type": None,
        "config": None,
    }

    def __init__(self, *, run_name: str, run_dir: Path | None, **tracker_kwargs: Any) -> None:
        super().__init__(run_name=run_name, run_dir=run_dir, **tracker_kwargs)
        logdir = self.settings["logdir"] or (self.run_dir / "swanlog" if self.run_dir is not None else None)
        self.logdir = Path(logdir) if logdir is not None else None
        mode = self.settings["mode"]
        self.mode = _MODE_ALIASES.get(mode, mode) if mode else None
        self.run: Any = None

    def start(self, hparams: Mapping[str, Any] | None = None) -> None:
        import swanlab

        env_mode = os.environ.get("SWANLAB_MODE")
        mode = self.mode or (_MODE_ALIASES.get(env_mode, env_mode) if env_mode else None) or "online"  # SwanLab's default
        if self.settings["login_kwargs"] and mode == "online":
            # save=False: in memory only, never written to SwanLab's .netrc. The kwargs are read
            # inside the lambda so no frame that outlives a failure holds the key.
            login = lambda: swanlab.login(**{**self.settings["login_kwargs"], "save": False})  # noqa: E731
            self.backend_call("swanlab login", login)
        init_kwargs = {
            "project": self.settings["project"],
            "workspace": self.settings["workspace"],
            "experiment_name": self.settings["experiment_name"] or self.run_name,
            "description": self.settings["description"],
            "tags": self.settings["tags"],
            "logdir": str(self.logdir) if self.logdir is not None else None,
            "mode": self.mode,
            "group": self.settings["group"],
            "job_type": self.settings["job_type"],
            "config": self.scrub_hparams({**(self.settings["config"] or {}), **(hparams or {})}),
        }
        if self.logdir is not None:
            self.logdir.mkdir(parents=True, exist_ok=True)
        # Only what is set, so SwanLab's own defaults and environment variables apply.
        init_kwargs = {k: v for k, v in init_kwargs.items() if v is not None}
        self.run = self.backend_call("swanlab init", swanlab.init, **init_kwargs)
        self._text = swanlab.Text
        self._table = swanlab.echarts.Table

    def log(self, values: Mapping[str, Any], step: int | None = None) -> None:
        data: dict[str, Any] = {}
        for key, value in values.items():
            if isinstance(value, str):
                data[key] = self._text(value)
            elif (number := to_scalar(value)) is not None:
                data[key] = number
            elif value is not None:
                self.report_once(key, f"is left out: not a number or text ({type(value).__name__})")
        if data:
            self.backend_call("swanlab log", self.run.log, data, step=step)

    def log_samples(self, rows: Sequence[Mapping[str, Any]], step: int | None) -> None:
        names, data = table_rows(rows)
        table = self._table()
        table.add(headers=names, rows=data)
        self.backend_call("swanlab log samples", self.run.log, {SAMPLES_KEY: table}, step=step)

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        self.backend_call("swanlab config update", self.run.config.update, self.scrub_hparams(hparams))

    def finish(self) -> None:
        if self.run is not None:
            self.backend_call("swanlab finish", self.run.finish)
            self.run = None
