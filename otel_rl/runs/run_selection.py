"""Which run of a run folder to read: a folder given to two runs in turn holds both in its files.

Every record carries its run's ``rl.run.id`` and its ``rl.rank`` (resource attributes). Readers
take one run at a time, so that no row is built from two runs: the one asked for, else each rank's
latest (the run whose first record in that rank's file was written last; the ranks of one job
started without a shared run id each have their own), and they name the others.

    choice = choose_run(span.resource for span in spans)
    spans = [s for s in spans if choice.keeps(s.resource)]
    if choice.note: print(choice.note)
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from otel_rl.semconv import attributes as A

__all__ = ["GENERATED_RUN_ID", "RunSelection", "choose_run", "run_id_of"]

# The run id init() makes when none is given (config.resolve_config): the date, the time, 6 hex digits.
GENERATED_RUN_ID = re.compile(r"^\d{8}-\d{6}-[0-9a-f]{6}$")


def run_id_of(resource: Mapping[str, Any] | None) -> str | None:
    """The ``rl.run.id`` of a record's resource, or None (records written without one)."""
    value = (resource or {}).get(A.RL_RUN_ID)
    return value if isinstance(value, str) and value else None


def _rank_of(resource: Mapping[str, Any] | None) -> int:
    value = (resource or {}).get(A.RL_RANK, 0)
    return value if isinstance(value, int) and not isinstance(value, bool) else 0


@dataclass(frozen=True)
class RunSelection:
    """The runs read (empty: the folder names no run, every record is read) and the folder's others."""

    read: frozenset[str] = frozenset()
    others: tuple[str, ...] = ()
    option: str = "--run-id"
    _label: str = field(default="", repr=False)
    concurrent: bool = False  # other runs wrote ranks of this folder at the same time as the one read
    per_rank_ids: tuple[str, ...] = ()  # the generated ids of ranks read as one job

    @property
    def run_id(self) -> str | None:
        """The run read, when it is one run id."""
        return next(iter(self.read)) if len(self.read) == 1 else None

    def keeps(self, resource: Mapping[str, Any] | None) -> bool:
        """Whether a record of this resource belongs to the run read."""
        if not self.read:
            return True
        run_id = run_id_of(resource)
        # A record that names no run is this run's only where the folder holds no other.
        return run_id in self.read or (run_id is None and not self.others)

    @property
    def note(self) -> str:
        """One line naming the other runs and how to read them; empty for a folder of one run."""
        if self.per_rank_ids and not self.others:
            return (
                f"the ranks of this folder carry different generated run ids ({', '.join(self.per_rank_ids[:5])}): read as one "
                f"job's ranks; if they are separate runs, {self.option} ID reads one (set OTEL_RL_RUN_ID to one value on every "
                "rank of a job to keep this clear)"
            )
        if not self.others:
            return ""
        others = ", ".join(self.others[:5]) + (f" and {len(self.others) - 5} more" if len(self.others) > 5 else "")
        if self.concurrent:
            return (
                f"this folder holds runs written at the same time on different ranks; reading {self._label}; the other(s): "
                f"{others} ({self.option} ID reads one; give each run its own run_dir to keep them apart)"
            )
        return (
            f"this folder holds runs written one after another; reading {self._label}; the other(s): {others} "
            f"({self.option} ID reads one; give each run its own run_dir to keep them apart)"
        )


def choose_run(resources: Iterable[Mapping[str, Any] | None], wanted: str | None = None, option: str = "--run-id") -> RunSelection:
    """The run to read among the records of ``resources`` (in written order): ``wanted``, else each
    rank's latest. Raises LookupError naming the runs there when ``wanted`` is not among them."""
    by_rank: dict[int, dict[str, None]] = {}
    written: dict[str, None] = {}
    for resource in resources:
        run_id = run_id_of(resource)
        if run_id is not None:
            by_rank.setdefault(_rank_of(resource), {})[run_id] = None
            written[run_id] = None
    if wanted is not None:
        if wanted not in written:
            there = ", ".join(written) if written else "none (its records name no run)"
            raise LookupError(f"no run {wanted!r} in this folder; runs there: {there}")
        return RunSelection(frozenset({wanted}), tuple(r for r in written if r != wanted), option, wanted)
    latest = {rank: list(ids)[-1] for rank, ids in sorted(by_rank.items())}
    read = frozenset(latest.values())
    if len(read) > 1 and not all(GENERATED_RUN_ID.match(r) for r in read):
        # Ranks whose latest runs were given different names are different runs (run X on rank 0 and
        # run Y on rank 1 writing one folder at once): never rows of both as one run's ranks.
        first = next(iter(latest.values()))
        others = tuple(r for r in written if r != first)
        return RunSelection(frozenset({first}), others, option, f"{first} (its ranks only)", concurrent=True)
    others = tuple(r for r in written if r not in read)
    if len(read) > 1:  # one job whose ranks each made their own id (no OTEL_RL_RUN_ID shared), or runs at once
        label = "the latest run of each rank (" + ", ".join(sorted(read)) + ")"
        return RunSelection(read, others, option, label, per_rank_ids=tuple(sorted(read)))
    return RunSelection(read, others, option, next(iter(read)) if read else "")
