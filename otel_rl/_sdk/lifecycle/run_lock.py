"""One live process per run folder and rank: a lock file, so two processes never merge their files.

Two processes of the same rank writing one run folder (a job restarted beside its old self, two
runs given the same ``run_dir``) would overwrite each other's ``run.json`` and interleave their
step traces in one file. Each process takes ``<run_dir>/.lock.rank<N>`` (``flock``, non-blocking)
for the telemetry's life. When another live process holds it, this process writes to the first
free sibling folder (``<run_dir>-2``, ``<run_dir>-3``, ...) instead, so nothing is merged and
nothing is lost, and says so once with both folders and both PIDs.

The kernel releases the lock when its holder exits, however it exits, so a crashed run never
blocks the next. The file holds its holder's PID while it runs and is emptied at a clean shutdown:
a PID found there by the next process of the rank names one that ended without shutting down
(SIGKILL, the OOM killer, a lost node), whose last metric points were never exported: that next
process rebuilds them from the dead one's step events, in a process of its own. A forked child shares its parent's lock (the same open file description): it
never unlocks it, and an ``init()`` in the child finds the folder taken and moves to a sibling.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from otel_rl import environment_variables as ENV
from otel_rl._sdk.settings.config import TelemetryConfig
from otel_rl.exporters.files import LOGS_FILE, rank_file_name

try:
    import fcntl
except ImportError:  # Windows: no flock; run folders are not locked there
    fcntl = None  # type: ignore[assignment]

logger = logging.getLogger("otel_rl")

LOCK_FILE_PREFIX = ".lock.rank"
# Each rank's run.json: the run that last wrote the folder (its id, service, start, destinations).
RUN_INFO_FILE = "run.json"
# Siblings tried before giving up on a lock (each one is a live process of the same rank).
MAX_SIBLINGS = 64


class RunFolderBusy(RuntimeError):
    """Another live process holds the run folder's lock for this rank."""

    def __init__(self, lock_path: Path, holder: str) -> None:
        super().__init__(f"{lock_path} is held by process {holder}")
        self.holder = holder


@dataclass
class RunLock:
    """The lock a process holds on its run folder for one rank."""

    path: Path
    fd: int
    owner_pid: int
    # The PID the lock file still held: the process before this one ended without shutting down.
    unclean_end_pid: int | None = None

    def release(self) -> None:
        """Empty the file (a clean end), unlock and close; idempotent. In a forked child it only
        closes its copy: an unlock there would release the parent's lock too (flock locks belong to
        the shared open file description)."""
        fd, self.fd = self.fd, -1
        if fd < 0:
            return
        try:
            if fcntl is not None and os.getpid() == self.owner_pid:
                os.ftruncate(fd, 0)
                fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError:
            pass
        try:
            os.close(fd)
        except OSError:
            pass

    def __del__(self) -> None:  # a Telemetry whose construction failed never reaches shutdown()
        self.release()


def lock_path(run_dir: Path, rank: int) -> Path:
    return run_dir / f"{LOCK_FILE_PREFIX}{rank}"


def take(run_dir: Path, rank: int) -> RunLock:
    """Create ``run_dir`` and lock it for ``rank``; RunFolderBusy when a live process holds it."""
    run_dir.mkdir(parents=True, exist_ok=True)
    path = lock_path(run_dir, rank)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)  # not inherited by exec'd children (PEP 446)
    if fcntl is not None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            holder = _holder(fd)
            os.close(fd)
            if exc.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                raise RunFolderBusy(path, holder) from None
            raise
    previous = _holder(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    unclean = int(previous) if previous.isdigit() and int(previous) != os.getpid() else None
    return RunLock(path, fd, os.getpid(), unclean)


def _holder(fd: int) -> str:
    try:
        return os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "unknown"
    except OSError:
        return "unknown"


def claim_run_dir(config: TelemetryConfig) -> tuple[TelemetryConfig, RunLock | None]:
    """Lock ``config``'s run folder for its rank; a config moved to a free sibling folder when taken.

    No run folder (files off), no flock, or a folder that cannot be created: the config as it is
    and no lock (creating the folder reports its own error later, where it always did).
    """
    if not config.file_enabled or config.run_dir is None or fcntl is None:
        return config, None
    run_dir, rank = Path(str(config.run_dir)), config.rank or 0
    try:
        lock = take(run_dir, rank)
        say_if_another_run_wrote(run_dir, rank, config.run_id)
        return config, lock
    except RunFolderBusy as busy:
        first = busy
    except OSError as exc:
        logger.debug("otel-rl: cannot lock the run folder %s: %s", run_dir, exc)
        return config, None
    for n in range(2, MAX_SIBLINGS + 2):
        sibling = run_dir.with_name(f"{run_dir.name}-{n}")
        try:
            lock = take(sibling, rank)
        except RunFolderBusy:
            continue
        except OSError as exc:
            logger.debug("otel-rl: cannot lock the run folder %s: %s", sibling, exc)
            break
        logger.warning(
            "otel-rl: the run folder %s is in use for rank %d by process %s; this process (%d) writes to %s "
            "instead, so neither overwrites the other's files. Give each process its own run folder "
            "(run_dir=, %s) or its own rank (rank=, or the launcher's RANK).",
            run_dir,
            rank,
            first.holder,
            os.getpid(),
            sibling,
            ENV.OTEL_RL_RUN_DIR,
        )
        return dataclasses.replace(config, run_dir=str(sibling)), lock
    logger.warning(
        "otel-rl: the run folder %s and its siblings are in use for rank %d (by process %s first); this process (%d) "
        "writes there unlocked, and its files may mix with the other's. Give each process its own run folder (run_dir=, %s).",
        run_dir,
        rank,
        first.holder,
        os.getpid(),
        ENV.OTEL_RL_RUN_DIR,
    )
    return config, None


def say_if_another_run_wrote(run_dir: Path, rank: int, run_id: str | None) -> str | None:
    """When ``run_dir`` already holds another run's files for ``rank`` (a script run twice with one
    ``run_dir``), say once that this run is added beside it and how the readers tell them apart.
    The earlier run's id, or None."""
    try:
        earlier = json.loads((run_dir / rank_file_name(RUN_INFO_FILE, rank)).read_text(encoding="utf-8")).get("run_id")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(earlier, str) or not earlier or earlier == run_id:
        return None  # a new folder, or the same run resumed: nothing to tell apart
    logger.warning(
        "otel-rl: the run folder %s already holds run %s; this run (%s) is added beside it in the same files. "
        "`otel-rl show`, `export` and `trace` read the latest run of a folder and name the others (--run-id %s "
        "reads the earlier one). Give each run its own folder (run_dir=, %s) to keep them apart.",
        run_dir,
        earlier,
        run_id,
        earlier,
        ENV.OTEL_RL_RUN_DIR,
    )
    return earlier


def recover_unclean_end(config: TelemetryConfig, lock: RunLock | None) -> subprocess.Popen[bytes] | None:
    """When the process before this one in the run folder and rank ended without shutting down,
    rebuild the metric points it never exported (from its step events: ``otel-rl recover``) in a
    process of its own, started here and said once: it reads what that process wrote, which may be
    large, without taking this one's GIL. It covers only what was written before now, so it runs
    while this process writes the folder. The process, or None when there is nothing to rebuild."""
    if lock is None or lock.unclean_end_pid is None or config.run_dir is None:
        return None
    rank = config.rank or 0
    logs = Path(str(config.run_dir)) / rank_file_name(LOGS_FILE, rank)
    try:
        if logs.stat().st_size == 0:
            return None
    except OSError:  # no step events there: nothing to rebuild from
        return None
    command = [sys.executable, "-m", "otel_rl.cli", "recover", str(config.run_dir), "--rank", str(rank), "--before", str(time.time_ns())]
    what = (
        f"otel-rl: process {lock.unclean_end_pid}, the last to write rank {rank} of {config.run_dir}, ended without shutting "
        "down (killed, or its node lost): its step events are on disk, but the metric points of its last steps (up to "
        "metric_export_interval_s) were never exported"
    )
    report = Path(str(config.run_dir)) / f"recover.rank{rank}.log"  # what it did, or why it failed
    try:
        with open(report, "ab") as out:
            # its own session: a Ctrl-C meant for training does not cut a rebuild short
            recovery = subprocess.Popen(
                command, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, env=_importable_env()
            )
    except OSError as exc:
        logger.warning(
            "%s; rebuilding them failed to start (%s): run `otel-rl recover %s` once this process has ended.", what, exc, config.run_dir
        )
        return None
    logger.warning(
        "%s. Rebuilding them from the events in the background (process %d: `%s`; its report: %s); `otel-rl show` and "
        "every other reader then find them in the run folder.",
        what,
        recovery.pid,
        " ".join(["otel-rl", *command[3:]]),
        report,
    )
    return recovery


def _importable_env() -> dict[str, str]:
    """This environment, with otel-rl's own folder first on PYTHONPATH: a training script that
    imports it from a checkout (sys.path set in the script) still starts a process that can."""
    root = str(Path(__file__).resolve().parents[2])
    path = os.environ.get("PYTHONPATH")
    return {**os.environ, "PYTHONPATH": root if not path else os.pathsep.join((root, path))}
