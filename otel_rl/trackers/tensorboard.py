"""``track_with: tensorboard``: TensorBoard event files, as ROLL's TensorBoardTracker writes them.

Settings (ROLL's): ``log_dir`` (default ``run_dir/tensorboard``), and the writer's ``max_queue``
and ``flush_secs``, which default to ROLL's 1000 and 10 s.

The writer is ``tensorboardX.SummaryWriter`` when tensorboardX is installed (no torch needed),
else ``torch.utils.tensorboard.SummaryWriter`` (what ROLL uses); both write the same event files.
Keys are tags as given, except that characters TensorBoard tags reject become ``_`` (as
tensorboardX does; reported once per key). Numbers and bools (as 0/1) become scalars
(``add_scalar``, stored as 32-bit floats, NaN and infinities included), strings become text
(``add_text``), ``None`` and other objects are left out.

Rollout samples (``log_samples``): one text per step under the tag ``samples``, a Markdown table
(one row per sample), which TensorBoard's text plugin shows as a table.

hparams go into the same run as a JSON text (``hparams`` tag) and as the HParams plugin's
summaries. ``add_hparams`` is not used: both writers put each call into a new sub-run folder.
"""

from __future__ import annotations

import importlib.util
import json
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from otel_rl.trackers.base import NAME_CACHE_LIMIT, Tracker, flatten, is_finite, to_scalar
from otel_rl.trackers.samples import markdown_table

__all__ = ["TensorBoardTracker"]

_INVALID_TAG_CHARS = re.compile(r"[^-/\w.]")  # tensorboardX's rule (summary._clean_tag)
SAMPLES_TAG = "samples"


class TensorBoardTracker(Tracker):
    name = "tensorboard"
    extra = "tensorboard"
    options = {"log_dir": None, "max_queue": 1000, "flush_secs": 10}

    @classmethod
    def library_available(cls) -> bool:
        # torch.utils.tensorboard needs the tensorboard package; find_spec("torch.utils...")
        # would import torch, so the two top-level packages are checked instead.
        find = importlib.util.find_spec
        return find("tensorboardX") is not None or (find("torch") is not None and find("tensorboard") is not None)

    def __init__(self, *, run_name: str, run_dir: Path | None, **tracker_kwargs: Any) -> None:
        super().__init__(run_name=run_name, run_dir=run_dir, **tracker_kwargs)
        self.log_dir = self.default_dir("log_dir", "tensorboard")
        self.writer: Any = None
        self._tags: dict[str, str] = {}

    def start(self, hparams: Mapping[str, Any] | None = None) -> None:
        queue, flush_secs = self.settings["max_queue"], self.settings["flush_secs"]
        if importlib.util.find_spec("tensorboardX") is not None:
            from tensorboardX import SummaryWriter
            from tensorboardX.proto.summary_pb2 import Summary  # pyright: ignore[reportAttributeAccessIssue]  (generated protobuf module)
            from tensorboardX.summary import hparams as hparams_summaries
        else:
            from tensorboard.compat.proto.summary_pb2 import Summary  # pyright: ignore[reportAttributeAccessIssue]  (generated protobuf module)
            from torch.utils.tensorboard import SummaryWriter
            from torch.utils.tensorboard.summary import hparams as hparams_summaries
        self._summary, self._hparams_summaries = Summary, hparams_summaries
        self.writer = SummaryWriter(str(self.log_dir), max_queue=queue, flush_secs=flush_secs)
        if hparams:
            self.log_hparams(hparams)

    def _tag(self, key: str) -> str:
        # tensorboardX rewrites tags outside [-/\w.] (e.g. "memory(GiB)", "loss@sum") and logs it
        # on every call; torch keeps them. Rewriting once here gives the same tags with either
        # writer, in both scalar paths below, and one message per key.
        tag = self._tags.get(key)
        if tag is None:
            tag = _INVALID_TAG_CHARS.sub("_", key).lstrip("/")
            if len(self._tags) < NAME_CACHE_LIMIT:
                self._tags[key] = tag
            if tag != key:
                self.report_once(key, f"is logged as {tag!r} (characters TensorBoard tags reject)")
        return tag

    def log(self, values: Mapping[str, Any], step: int | None = None) -> None:
        for key, value in values.items():
            if isinstance(value, str):
                self.writer.add_text(self._tag(key), value, global_step=step)
            elif (number := to_scalar(value)) is None:
                if value is not None:
                    self.report_once(key, f"is left out: not a number or text ({type(value).__name__})")
            elif is_finite(number):
                self.writer.add_scalar(self._tag(key), number, global_step=step)
            else:
                # The same scalar event add_scalar writes, minus tensorboardX's warning on every
                # NaN/inf call, which would flood the log each step of a diverged run.
                summary = self._summary(value=[self._summary.Value(tag=self._tag(key), simple_value=number)])
                self.writer._get_file_writer().add_summary(summary, step)

    def log_samples(self, rows: Sequence[Mapping[str, Any]], step: int | None) -> None:
        self.writer.add_text(SAMPLES_TAG, markdown_table(rows), global_step=step)

    def log_hparams(self, hparams: Mapping[str, Any]) -> None:
        config = self.scrub_hparams(hparams)
        self.writer.add_text("hparams", "```json\n" + json.dumps(config, indent=2, default=str) + "\n```")
        # The HParams plugin takes only numbers, strings and bools: anything else as its text.
        simple = {k: v if isinstance(v, (bool, int, float, str)) else str(v) for k, v in flatten(config).items()}
        file_writer = self.writer._get_file_writer()  # same run folder, unlike add_hparams()
        for summary in self._hparams_summaries(simple, {}):
            file_writer.add_summary(summary)

    def flush(self) -> None:
        if self.writer is not None:
            self.writer.flush()

    def finish(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
