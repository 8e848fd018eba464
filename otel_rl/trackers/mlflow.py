"""``track_with: mlflow``: MLflow metrics and params (``pip install 'otel-rl[mlflow]'``).

Settings: ``tracking_uri`` (default: ``MLFLOW_TRACKING_URI`` if set, else
``file:run_dir/mlruns``), ``experiment_name`` (default MLflow's ``Default``; created if missing),
``run_name`` (default: the run name), ``tags`` (run tags).

Everything goes through one ``MlflowClient`` and its own run id, never MLflow's process-global
active run, so several trackers (or the training code's own MLflow use) do not interfere.

- Metrics: numbers and bools (as 0/1), NaN and infinities included, with the step (``None``:
  step 0, as in ``mlflow.log_metrics``); strings and ``None`` are left out (MLflow metrics are
  numbers only). MLflow accepts only alphanumerics, ``_ - . / :`` and spaces in names, so keys
  are sanitized as verl does (``@`` -> ``_at_``, repeated ``/`` -> one, any other character
  -> ``_``); each renamed key is reported once.
- Params: the hparams flattened with ``/``, values as text truncated to MLflow's length limit,
  sent in batches of MLflow's maximum size.
- Rollout samples: one table artifact per step, ``samples/step_<N>/table.json``, with
  ``MlflowClient.log_table`` (a step's second call appends to it, through MLflow's pandas reader,
  which may turn numeric-looking text into numbers); read it back with ``load_table``. One folder per step keeps each call's listing of existing tables small.

MLflow 3 refuses its file store unless ``MLFLOW_ALLOW_FILE_STORE=true``; when the tracking URI is
a file store (the default ``file:`` URI or a plain path) that variable is set, if unset, for this
process: choosing a file URI is choosing the file store.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from otel_rl.trackers.base import NAME_CACHE_LIMIT, Tracker, flatten, to_scalar
from otel_rl.trackers.samples import table_rows

__all__ = ["MlflowTracker", "samples_artifact", "sanitize_key"]


_INVALID_CHARS = re.compile(r"[^/\w.\- :]")
_SLASHES = re.compile(r"/+")
_MAX_KEY_LENGTH = 250  # mlflow.utils.validation.MAX_ENTITY_KEY_LENGTH


def sanitize_key(key: str) -> str:
    """A metric or param name MLflow accepts (verl's rules, plus MLflow's path rules)."""
    name = _INVALID_CHARS.sub("_", _SLASHES.sub("/", key.replace("@", "_at_")))
    # MLflow also rejects names that are not normalised paths: "/a", "a/", "a/./b", "a/../b".
    parts = [part if part not in (".", "..") else part.replace(".", "_") for part in name.strip("/").split("/")]
    return "/".join(parts)[:_MAX_KEY_LENGTH] or "_"


def samples_artifact(step: int | None) -> str:
    """The artifact path of a step's sample table."""
    return f"samples/step_{step if step is not None else 'none'}/table.json"


class MlflowTracker(Tracker):
    name = "mlflow"
    extra = "mlflow"
    options = {"tracking_uri": None, "experiment_name": None, "run_name": None, "tags": None}

    def __init__(self, *, run_name: str, run_dir: Path | None, **tracker_kwargs: Any) -> None:
        super().__init__(run_name=run_name, run_dir=run_dir, **tracker_kwargs)
        uri = self.settings["tracking_uri"]
        if not uri and not os.environ.get("MLFLOW_TRACKING_URI") and self.run_dir is not None:
            uri = (self.run_dir / "mlruns").absolute().as_uri()
        self.tracking_uri: str | None = uri  # None: MLflow's own resolution
        self._names: dict[str, str] = {}
        self.client: Any = None
        self.run_id: str | None = None

    def start(self, hparams: Mapping[str, Any] | None = None) -> None:
        from mlflow.entities import Metric, Param
        from mlflow.tracking import MlflowClient
        from mlflow.utils import validation

        self._metric, self._param, self._limits = Metric, Param, validation

        uri = self.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI", "")
        if uri and urlparse(uri).scheme in ("", "file") and "MLFLOW_ALLOW_FILE_STORE" not in os.environ:
            os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"
        self.client = MlflowClient(tracking_uri=self.tracking_uri)
        experiment_name = self.settings["experiment_name"] or "Default"
        experiment = self.client.get_experiment_by_name(experiment_name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(experiment_name)
        tags = {str(k): str(v) for k, v in (self.settings["tags"] or {}).items()}
        run = self.client.create_run(experiment_id, run_name=self.settings["run_name"] or self.run_name, tags=tags)
        self.run_id = run.info.run_id
        if hparams:
            self.log_hparams(hparams)

    def _name(self, key: str) -> str:
        name = self._names.get(key)
        if name is None:
            name = sanitize_key(key)
            if len(self._names) < NAME_CACHE_LIMIT:
                self._names[key] = name
            if name != key:
                self.report_once(key, f"is logged as {name!r} (characters MLflow rejects)")
        return name

    def log(self, values: Mapping[str, Any], step: int | None = None) -> None:
        timestamp = int(time.time() * 1000)
        metrics = []
        for key, value in values.items():
            number = None if isinstance(value, str) else to_scalar(value)
            if number is not None:
                metrics.append(self._metric(self._name(key), float(number), timestamp, step or 0))
            elif value is not None:
                self.report_once(key, f"is left out: MLflow metrics are numbers ({type(value).__name__})")
        self._log_batch(metrics=metrics)

    def log_samples(self, rows: Sequence[Mapping[str, Any]], step: int | None) -> None:
        import pandas as pd  # MLflow's own dependency for tables

        names, data = table_rows(rows)
        # object columns: cells are written as given ("7" ids stay text, lengths stay integers)
        table = pd.DataFrame(data, columns=names, dtype=object)
        self.client.log_table(self.run_id, data=table, artifact_file=samples_artifact(step))

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        limit = self._limits.MAX_PARAM_VAL_LENGTH  # MLflow rejects longer values
        params = {self._name(k): str(v)[:limit] for k, v in flatten(self.scrub_hparams(hparams)).items()}
        self._log_batch(params=[self._param(k, v) for k, v in params.items()])

    def _log_batch(self, metrics: Sequence[Any] = (), params: Sequence[Any] = ()) -> None:
        # One request per MLflow's batch limits (1000 metrics, 100 params in 3.x).
        size = self._limits.MAX_METRICS_PER_BATCH
        for i in range(0, len(metrics), size):
            self.client.log_batch(self.run_id, metrics=metrics[i : i + size])
        size = self._limits.MAX_PARAMS_TAGS_PER_BATCH
        for i in range(0, len(params), size):
            self.client.log_batch(self.run_id, params=params[i : i + size])

    def finish(self) -> None:
        if self.client is not None and self.run_id is not None:
            self.client.set_terminated(self.run_id)
            self.run_id = None
