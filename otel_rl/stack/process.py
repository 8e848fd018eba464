"""Processes of the local stack: free-port checks, start with a PID file, health polling, stop by PID.

Every server runs in its own session (so its process group can be signalled as a whole), writes
stdout/stderr to ``<data>/logs/<name>.log`` and is described by ``<data>/run/<name>.json``. A PID
file names the process by PID *and* start time, so a PID that the system reused for some other
program is never signalled.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

LOOPBACK = "127.0.0.1"

# Popen objects of servers started by this Python process, kept so that they are reaped when
# stopped (no zombies for status() to mistake for running servers) and not reported as leaked.
_CHILDREN: dict[int, subprocess.Popen] = {}

# Requests to our own servers on 127.0.0.1 must never go through an HTTP proxy from the environment.
_NO_PROXY_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class PidRecord:
    """What ``<data>/run/<name>.json`` holds about one started server."""

    name: str
    pid: int
    create_time: float
    ports: dict[str, int]
    command: list[str]
    env: dict[str, str] = field(default_factory=dict)
    log: str = ""
    log_offset: int = 0  # where this run's output starts in the (appended) log file
    started_at: str = ""

    def same_launch(self, command: Sequence[str], env: Mapping[str, str], ports: Mapping[str, int]) -> bool:
        return list(command) == self.command and dict(env) == self.env and dict(ports) == self.ports


def write_pid_file(path: Path, record: PidRecord) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(asdict(record), indent=2) + "\n")
    tmp.replace(path)


def read_pid_file(path: Path) -> PidRecord | None:
    """The record in ``path``; None when there is none. An unreadable file reads as a dead PID (stale)."""
    try:
        raw = json.loads(path.read_text())
        return PidRecord(
            name=str(raw.get("name", path.stem)),
            pid=int(raw["pid"]),
            create_time=float(raw.get("create_time", 0.0)),
            ports={str(k): int(v) for k, v in dict(raw.get("ports", {})).items()},
            command=[str(a) for a in raw.get("command", [])],
            env={str(k): str(v) for k, v in dict(raw.get("env", {})).items()},
            log=str(raw.get("log", "")),
            log_offset=int(raw.get("log_offset", 0)),
            started_at=str(raw.get("started_at", "")),
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return PidRecord(name=path.stem, pid=-1, create_time=0.0, ports={}, command=[])


def _reap(pid: int) -> None:
    """Collect the exit status of a server this process started (so it is not left a zombie)."""
    child = _CHILDREN.get(pid)
    if child is not None:
        child.poll()  # kept until stop_process, so exit_code() can still tell the status


def is_alive(record: PidRecord) -> bool:
    """True when the recorded process still runs: same PID, same start time, not a zombie."""
    if record.pid <= 0:
        return False
    _reap(record.pid)
    try:
        proc = psutil.Process(record.pid)
        if record.create_time and abs(proc.create_time() - record.create_time) > 1.0:
            return False  # the PID was reused by another program
        return proc.status() != psutil.STATUS_ZOMBIE
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False


def free_port(host: str = LOOPBACK) -> int:
    """A port nothing listens on now, picked by the kernel (for a server started right after)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def port_free(port: int, host: str = LOOPBACK) -> bool:
    """Whether a server could listen on ``host:port`` now (binding as servers do, with SO_REUSEADDR).

    ``host="::"`` checks every interface (for servers that bind all of them).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        sock = socket.socket(family, socket.SOCK_STREAM)
    except OSError:
        if family == socket.AF_INET6:  # no IPv6 here: all interfaces means 0.0.0.0
            return port_free(port, "0.0.0.0")
        raise
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host, port))
        return True
    except OSError as exc:
        if exc.errno in (errno.EADDRINUSE, errno.EACCES):
            return False
        if exc.errno == errno.EADDRNOTAVAIL and family == socket.AF_INET6:
            return port_free(port, "0.0.0.0")
        raise
    finally:
        sock.close()


def port_holder(port: int) -> str | None:
    """Who listens on ``port``, as 'pid N (command line)', when the system lets us see it."""
    try:
        conns = [c for c in psutil.net_connections(kind="tcp") if c.laddr and c.laddr.port == port and c.pid]
    except (psutil.AccessDenied, OSError):
        return None
    # A listener first; else a socket merely bound to the port (status CLOSE), which blocks it too.
    conns.sort(key=lambda c: c.status != psutil.CONN_LISTEN)
    for conn in conns[:1]:
        try:
            proc = psutil.Process(conn.pid)
            cmd = " ".join(" ".join(proc.cmdline()).split()) or proc.name()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            cmd = "?"
        if len(cmd) > 120:
            cmd = cmd[:117] + "..."
        return f"pid {conn.pid} ({cmd})"
    return None


def start_process(
    name: str,
    command: Sequence[str],
    *,
    env: Mapping[str, str],
    extra_env: Mapping[str, str],
    ports: Mapping[str, int],
    log_path: Path,
    pid_path: Path,
    cwd: Path,
) -> PidRecord:
    """Start ``command`` in a new session, output appended to ``log_path``; write and return its PID record."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S%z')} otel-rl stack: starting {name}: {' '.join(command)}\n".encode())
        log.flush()
        log_offset = log.tell()
        child = subprocess.Popen(
            list(command),
            cwd=str(cwd),
            env=dict(env),
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
        )
    _CHILDREN[child.pid] = child
    try:
        create_time = psutil.Process(child.pid).create_time()
    except psutil.NoSuchProcess:
        create_time = 0.0
    record = PidRecord(
        name=name,
        pid=child.pid,
        create_time=create_time,
        ports=dict(ports),
        command=list(command),
        env=dict(extra_env),
        log=str(log_path),
        log_offset=log_offset,
        started_at=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )
    write_pid_file(pid_path, record)
    return record


def exit_code(record: PidRecord) -> int | None:
    """The exit status of a server this process started and that has exited; None otherwise."""
    child = _CHILDREN.get(record.pid)
    return child.poll() if child is not None else None


def stop_process(record: PidRecord, timeout_s: float = 15.0) -> bool:
    """SIGTERM the process group of ``record``, wait up to ``timeout_s``, then SIGKILL what is left.

    Returns True when something was signalled, False when the process was already gone.
    """
    if not is_alive(record):
        _CHILDREN.pop(record.pid, None)
        return False
    try:
        leader = psutil.Process(record.pid)
        procs = [leader, *leader.children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    _signal_group(record.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        _reap(record.pid)
        procs = [p for p in procs if _running(p)]
        if not procs:
            break
        time.sleep(0.1)
    else:
        _signal_group(record.pid, signal.SIGKILL)
        for p in procs:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        end = time.monotonic() + 5.0
        while time.monotonic() < end and any(_running(p) for p in procs):
            _reap(record.pid)
            time.sleep(0.05)
    child = _CHILDREN.pop(record.pid, None)
    if child is not None:
        try:
            child.wait(timeout=1.0)
        except subprocess.TimeoutExpired:
            pass
    return True


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _signal_group(pid: int, sig: int) -> None:
    try:
        if os.getpgid(pid) == pid:  # started with start_new_session: the group is the server's own
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except ProcessLookupError:
        pass


def http_ok(url: str, *, data: bytes | None = None, headers: Mapping[str, str] | None = None, timeout_s: float = 2.0) -> bool:
    """True when ``url`` answers 2xx (GET, or POST when ``data`` is given)."""
    request = urllib.request.Request(url, data=data, headers=dict(headers or {}), method="POST" if data is not None else "GET")
    try:
        with _NO_PROXY_OPENER.open(request, timeout=timeout_s) as response:
            return 200 <= response.status < 300
    except (urllib.error.URLError, OSError, ValueError):
        return False


def tcp_open(port: int, host: str = LOOPBACK, timeout_s: float = 1.0) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False


@contextmanager
def exclusive_lock(path: Path, on_wait: Callable[[], None]) -> Iterator[None]:
    """Hold an flock on ``path`` (created if missing); ``on_wait`` is called once when another holds it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            on_wait()
            fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def log_tail(path: Path | str, lines: int = 25, start: int = 0) -> str:
    """The last ``lines`` lines of a log file from byte ``start`` on ('' when there is none)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(0, os.SEEK_END)
            size = fh.tell()
            fh.seek(max(start, size - 64 * 1024))
            text = fh.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip("\n").splitlines()[-lines:])
