"""A local observability stack without Docker: ``otel-rl stack install | up | down | status``.

Real servers, all on 127.0.0.1, all data in one folder (default ``~/.local/share/otel-rl/stack``; see data_dir)::

    OTLP --> otelcol-agent 4317/4318 --> otelcol-gateway 4417 --traces--> Jaeger (query API 16686)
                                                            --metrics-> VictoriaMetrics 8428 (remote write)
                                                            --metrics-> :8889 <-- Prometheus 9090 scrapes
                                                            --logs----> rl-events.jsonl, tracker bridge 4319
    vmalert 8880 evaluates grafana/alerts/*.yml against VictoriaMetrics.

The collectors are the upstream OpenTelemetry Collector, built from its Go modules with
collector-config/builder-config.yaml and run with the project's own configs (agent.yaml,
gateway.yaml); Jaeger v2 is built from its Go module; VictoriaMetrics and Prometheus come from
Debian's archive (a scratch apt set-up; nothing is installed on the system). Without Go, ``up``
says so once and runs the rest. Every port moves by one ``port_offset`` so a second stack (a
test's) can run beside a user's.

Timing worth knowing when checking data: the agent and gateway batch for up to 1 s each;
VictoriaMetrics makes a *new* series searchable about 10 s after it arrives (it publishes new series
to its index every 10 s); Prometheus sees a value at its next scrape (every second); Jaeger stores
spans within a second of the gateway's export. Poll with a deadline.

```python
from otel_rl.stack import Stack

stack = Stack(".stack", port_offset=0, only=["otelcol-agent", "otelcol-gateway", "victoria-metrics"])
stack.up()                          # builds/installs what is missing, starts, waits until healthy
stack.endpoints["otlp_http"]        # 'http://127.0.0.1:4318' (the agent)
stack.status()                      # [ComponentStatus(name='otelcol-agent', state='healthy', ...), ...]
stack.down()                        # SIGTERM (then SIGKILL) by PID, ports verified free
```
"""

from __future__ import annotations

import logging
import os
import sys
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import otel_rl.environment_variables as ENV
import otel_rl.stack._components as _components
import otel_rl.stack.process as _process
from otel_rl.reporting import LOGGER_NAME, ReportOnce
from otel_rl.stack._components import ALL_COMPONENT_NAMES, COMPONENT_NAMES, COMPONENTS, START_ORDER, Context, component_ports, user_urls
from otel_rl.stack._errors import HealthCheckError, InstallError, MissingBinaryError, PortInUseError, StackError
from otel_rl.stack._go_build import GO_MISSING, JAEGER_RELEASE, find_go
from otel_rl.stack._install import PACKAGES, Installer, default_cache_dir, format_seconds
from otel_rl.stack.data_dir import stack_data_dir
from otel_rl.stack.replay_target import retention_of as _retention_of

__all__ = [
    "ALL_COMPONENT_NAMES",
    "COMPONENT_NAMES",
    "free_port_offset",
    "ComponentStatus",
    "HealthCheckError",
    "InstallError",
    "JAEGER_RELEASE",
    "MissingBinaryError",
    "PortInUseError",
    "Stack",
    "StackError",
    "default_cache_dir",
    "default_data_dir",
    "default_port_offset",
]

logger = logging.getLogger(LOGGER_NAME)
_STDOUT = object()  # "print to whatever sys.stdout is at the time" (pytest swaps it)
_report_once = ReportOnce(logger)


@dataclass(frozen=True)
class ComponentStatus:
    """One row of ``Stack.status()``.

    ``state`` is one of ``healthy``, ``unhealthy`` (its process runs but does not answer as a healthy
    one does), ``stopped`` (no PID file) or ``stale pid file`` (a PID file whose process is gone).
    """

    name: str
    state: str
    pid: int | None
    ports: dict[str, int]
    urls: dict[str, str] = field(default_factory=dict)
    note: str = ""
    log: str = ""

    @property
    def healthy(self) -> bool:
        return self.state == "healthy"


def default_data_dir() -> Path:
    """``OTEL_RL_STACK_DIR``, else ``otel-rl/stack`` in the user's data folder (``$XDG_DATA_HOME``,
    default ``~/.local/share``): one place whatever the working directory, so that ``stack status``,
    ``stack down`` and ``replay`` find the stack ``stack up`` started from anywhere."""
    return stack_data_dir()


def free_port_offset(*, avoid: Iterable[int] = ()) -> int:
    """A port offset at which every stack port is free now (for a second stack beside a running one).

    Offsets step by 500 from 10000 and keep every port below the ephemeral range (32768), where the
    kernel hands out ports to outgoing connections. Raises StackError when none is free.
    """
    defaults = [p for c in COMPONENTS.values() for p in c.ports.values()] + [_components.LOGS_BRIDGE_PORT]
    skip = set(avoid)
    for offset in range(10000, 32768 - max(defaults), 500):
        if offset in skip:
            continue
        if all(_process.port_free(p + offset) for p in defaults):
            return offset
    raise StackError("no port offset between 10000 and 32768 has every stack port free; stop a stack with `otel-rl stack down`")


def default_port_offset() -> int:
    """``OTEL_RL_STACK_PORT_OFFSET``, else 0 (an invalid value warns once and gives 0)."""
    raw = os.environ.get(ENV.OTEL_RL_STACK_PORT_OFFSET, "").strip()
    if not raw:
        return 0
    try:
        return _check_offset(int(raw))
    except ValueError as exc:
        _report_once(raw, "otel-rl: ignoring OTEL_RL_STACK_PORT_OFFSET=%r (%s); using 0", raw, exc)
        return 0


def _check_offset(offset: int) -> int:
    ports = [p for c in COMPONENTS.values() for p in c.ports.values()] + [_components.LOGS_BRIDGE_PORT]
    if min(ports) + offset < 1 or max(ports) + offset > 65535:
        raise ValueError(
            f"port offset {offset} puts ports outside 1..65535 (the default ports span "
            f"{min(ports)}..{max(ports)}, so the offset must be within {1 - min(ports)}..{65535 - max(ports)})"
        )
    return offset


def _parse_only(only: str | Iterable[str] | None, default: tuple[str, ...] = COMPONENT_NAMES) -> tuple[str, ...]:
    if only is None:
        return default
    names = [n.strip() for n in (only.split(",") if isinstance(only, str) else only) if n.strip()]
    unknown = [n for n in names if n not in COMPONENTS]
    if unknown or not names:
        raise ValueError(
            f"unknown stack component {', '.join(map(repr, unknown)) or '(none given)'}; choose from {', '.join(ALL_COMPONENT_NAMES)}"
        )
    return tuple(n for n in ALL_COMPONENT_NAMES if n in names)


class Stack:
    """The local stack whose state lives in ``data_dir``.

    Args:
        data_dir: the data folder (``OTEL_RL_STACK_DIR``, default ``~/.local/share/otel-rl/stack``): installs, server data,
            logs (``logs/<name>.log``) and PID files (``run/<name>.json``).
        port_offset: added to every default port (``OTEL_RL_STACK_PORT_OFFSET``, default 0).
        only: the components ``install()`` and ``up()`` handle (names or "a,b"); default all of
            ``COMPONENT_NAMES``, plus ``bridge`` when ``bridge_config`` is given. ``down()`` looks at every
            component unless given ``only``; ``status()`` at the selected ones (and a running bridge).
        cache_dir: where downloaded ``.deb`` files are kept across data folders
            (``OTEL_RL_STACK_CACHE``, default ``~/.cache/otel-rl/stack``).
        out: where progress lines go (default: standard output; None: nowhere).
        collector_config: the folder of the collector configs (default ``collector-config/otelcol`` of the
            checkout); the collector is built from ``../builder-config.yaml`` beside it.
        rules_dir: vmalert's rule folder (default ``grafana/alerts`` of the checkout, when it has rule files).
        bridge_config: the tracker bridge's YAML file (``otel-rl bridge --help``). With it the stack runs
            ``otel-rl bridge`` on 127.0.0.1:4319 (+ offset) in that file's folder and the gateway sends it
            the logs (the ``rl.*`` events) through gateway-bridge.yaml; without it they go only to the
            gateway's events file.
    """

    def __init__(
        self,
        data_dir: str | os.PathLike | None = None,
        *,
        port_offset: int | None = None,
        only: str | Iterable[str] | None = None,
        cache_dir: str | os.PathLike | None = None,
        out: TextIO | None | object = _STDOUT,
        collector_config: str | os.PathLike | None = None,
        rules_dir: str | os.PathLike | None = None,
        bridge_config: str | os.PathLike | None = None,
    ):
        self.data_dir = Path(data_dir).expanduser().resolve() if data_dir is not None else default_data_dir()
        self.port_offset = default_port_offset() if port_offset is None else _check_offset(int(port_offset))
        self._offset_given = port_offset is not None or bool(os.environ.get(ENV.OTEL_RL_STACK_PORT_OFFSET, "").strip())
        self.bridge_config = Path(bridge_config).expanduser().resolve() if bridge_config is not None else None
        self._only_given = only is not None
        self.components = _parse_only(only, COMPONENT_NAMES + (("bridge",) if self.bridge_config is not None else ()))
        self.cache_dir = Path(cache_dir).expanduser().resolve() if cache_dir is not None else default_cache_dir()
        self._out = out
        self.collector_config = Path(collector_config).expanduser().resolve() if collector_config is not None else None
        self.rules_dir = Path(rules_dir).resolve() if rules_dir is not None else None
        manifest = self.collector_config.parent / "builder-config.yaml" if self.collector_config is not None else None
        self._installer = Installer(self.data_dir, self.cache_dir, self._stream, collector_manifest=manifest)

    def __repr__(self) -> str:
        return f"Stack({str(self.data_dir)!r}, port_offset={self.port_offset}, only={list(self.components)!r})"

    # -- addresses -----------------------------------------------------------------------------

    def ports(self, name: str) -> dict[str, int]:
        """The ports of component ``name`` with this stack's offset, e.g. ``{'http': 8428}``."""
        return component_ports(name, self.port_offset)

    @property
    def endpoints(self) -> dict[str, str]:
        """Base URLs: otlp_grpc, otlp_http (the agent: where training sends), gateway_grpc, gateway_http,
        gateway_scrape (its prometheus exporter), jaeger (query API), victoria_metrics, prometheus, vmalert."""

        def http(name: str, role: str = "http") -> str:
            return f"http://{_process.LOOPBACK}:{self.ports(name)[role]}"

        return {
            "otlp_grpc": http("otelcol-agent", "otlp_grpc"),
            "otlp_http": http("otelcol-agent", "otlp_http"),
            "gateway_grpc": http("otelcol-gateway", "otlp_grpc"),
            "gateway_http": http("otelcol-gateway", "otlp_http"),
            "gateway_scrape": http("otelcol-gateway", "prometheus"),
            "jaeger": http("jaeger"),
            "victoria_metrics": http("victoria-metrics"),
            "prometheus": http("prometheus"),
            "vmalert": http("vmalert"),
        }

    @property
    def events_file(self) -> Path:
        """The gateway's file of ``rl.*`` events (collector-config/otelcol/gateway.yaml's ``file/rl_events``)."""
        return self.data_dir / "data" / "otelcol-gateway" / "rl-events.jsonl"

    @property
    def bridge_endpoint(self) -> str:
        """The tracker bridge's OTLP/HTTP base URL (``http://127.0.0.1:4319`` plus the offset)."""
        return f"http://{_process.LOOPBACK}:{self.ports('bridge')['otlp_http']}"

    # -- commands ------------------------------------------------------------------------------

    def install(self) -> dict[str, str]:
        """Install what the selected components need and is missing; return {package: version}.

        Idempotent: ``install.json`` in the data folder records what is there. Raises InstallError.
        """
        with self._locked():
            selected = self._startable()
            packages = [p for p in PACKAGES if any(COMPONENTS[c].package == p for c in selected)]
            return self._installer.install(packages)

    def up(self, timeout_s: float | None = None, *, install: bool = True) -> list[ComponentStatus]:
        """Start the selected components (installing what is missing) and wait until each is healthy.

        ``timeout_s`` bounds each component's health wait (default 30 s). Components
        already running and healthy with the same configuration are left alone; one whose command
        line would change (other ports, another routing) is restarted. On any failure, what this
        call started is stopped again and the error (PortInUseError, MissingBinaryError,
        HealthCheckError, InstallError) says what to do.
        """
        with self._locked():
            return self._up(timeout_s, install)

    def down(self, only: str | Iterable[str] | None = None, timeout_s: float = 15.0) -> list[str]:
        """Stop components by the PIDs in their PID files (all, or ``only``); return the names stopped.

        SIGTERM to each process group, up to ``timeout_s`` to exit, then SIGKILL; then the ports are
        checked free and the PID files removed. Safe to call at any time, also after a failed or
        partial ``up()``, and when nothing runs.
        """
        names = _parse_only(only, ALL_COMPONENT_NAMES)
        if not self.data_dir.exists():
            return []
        with self._locked():
            return self._down(names, timeout_s)

    def status(self) -> list[ComponentStatus]:
        """One ComponentStatus per component (the selected ones when ``only`` was given)."""
        self._adopt_running_offset()
        names = self.components
        if not self._only_given and "bridge" not in names and self._pid_path("bridge").exists():
            names = names + ("bridge",)  # started by an earlier `up --bridge-config`
        return [self._status_of(name) for name in names]

    def __enter__(self) -> Stack:
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    # -- mechanics -----------------------------------------------------------------------------

    def _stream(self) -> TextIO | None:
        return sys.stdout if self._out is _STDOUT else self._out  # type: ignore[return-value]

    def _say(self, text: str) -> None:
        out = self._stream()
        if out is not None:
            out.write(text + "\n")
            out.flush()

    def _pid_path(self, name: str) -> Path:
        return self.data_dir / "run" / f"{name}.json"

    def _log_path(self, name: str) -> Path:
        return self.data_dir / "logs" / f"{name}.log"

    @contextmanager
    def _locked(self) -> Iterator[None]:
        """One stack command at a time per data folder."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ignore = self.data_dir / ".gitignore"
        if not ignore.exists():  # the data folder never belongs in git, wherever it is
            ignore.write_text("# written by otel-rl stack: nothing in this folder belongs in git\n*\n")
        with _process.exclusive_lock(
            self.data_dir / ".lock", lambda: self._say(f"waiting for another `otel-rl stack` command on {self.data_dir} to finish...")
        ):
            yield

    def _running_offset(self) -> int | None:
        """The port offset of the components running from this data folder (None when none runs)."""
        for name in ALL_COMPONENT_NAMES:
            rec = _process.read_pid_file(self._pid_path(name))
            if rec is not None and rec.ports and _process.is_alive(rec):
                role, port = next(iter(rec.ports.items()))
                if role in COMPONENTS[name].ports:
                    return port - COMPONENTS[name].ports[role]
        return None

    def _adopt_running_offset(self) -> None:
        """Without an explicit offset, act on the running stack's ports; with a different one, refuse."""
        running = self._running_offset()
        if running is None or running == self.port_offset:
            return
        if self._offset_given:
            raise StackError(
                f"the stack in {self.data_dir} runs with port offset {running}, not {self.port_offset}; "
                f"stop it first (`otel-rl stack down --dir {self.data_dir}`) or use --port-offset {running}"
            )
        self.port_offset = running

    def _binary(self, package: str, name: str) -> Path:
        return self._installer.binary(package, name)

    def _startable(self) -> tuple[str, ...]:
        """The selected components, less those built with Go when Go is missing and they are not built yet.

        Left out by default, saying so once; asked for by name (``only``), an InstallError.
        """
        unbuilt = [
            name
            for name in self.components
            if COMPONENTS[name].package in PACKAGES
            and PACKAGES[COMPONENTS[name].package].source == "go"
            and not self._installer.is_installed(COMPONENTS[name].package)
        ]
        if not unbuilt or find_go() is not None:
            return self.components
        if self._only_given:
            raise InstallError(f"{', '.join(unbuilt)}: built from Go modules, and {GO_MISSING}")
        self._say(f"{', '.join(unbuilt)}: not started: they are built from Go modules, and {GO_MISSING}. Starting the rest.")
        return tuple(n for n in self.components if n not in unbuilt)

    def _up(self, timeout_s: float | None, install: bool) -> list[ComponentStatus]:
        self._adopt_running_offset()
        records = {name: _process.read_pid_file(self._pid_path(name)) for name in ALL_COMPONENT_NAMES}
        alive = {name for name, rec in records.items() if rec is not None and _process.is_alive(rec)}
        selected = self._startable()
        ctx = Context(
            data_dir=self.data_dir,
            offset=self.port_offset,
            running=frozenset(alive | set(selected)),
            binary=self._binary,
            collector_config=self.collector_config,
            rules_dir=self.rules_dir,
            bridge_config=self.bridge_config,
        )
        order = [n for n in START_ORDER if n in selected]
        launches = self._plan(ctx, order)

        to_start: list[str] = []
        to_wait: dict[str, _process.PidRecord] = {}
        for name in order:
            rec, launch = records[name], launches[name]
            if rec is not None and name in alive:
                if rec.same_launch(launch.command, launch.env, launch.ports):
                    if _components.check_health(name, rec.ports):
                        self._say(f"{name}: already running and healthy (pid {rec.pid}, {_ports_text(name, rec.ports)})")
                    else:
                        to_wait[name] = rec  # e.g. still starting from another `up`
                    continue
                self._say(f"{name}: running with another configuration (pid {rec.pid}); restarting it")
                _process.stop_process(rec)
                self._pid_path(name).unlink(missing_ok=True)
            elif rec is not None:
                self._say(f"{name}: removing a stale pid file (pid {rec.pid} is not running)")
                self._pid_path(name).unlink(missing_ok=True)
            to_start.append(name)

        for name in to_start:  # every port is checked before anything is installed or started
            self._check_ports(name, launches[name].ports)
        packages = [p for p in PACKAGES if any(COMPONENTS[c].package == p for c in to_start)]
        if install and not all(self._installer.is_installed(p) for p in packages):
            self._installer.install(packages)
            launches.update(self._plan(ctx, to_start))  # with the installed programs' paths
        for name in to_start:
            self._check_binaries(name)

        started: list[_process.PidRecord] = []
        try:
            for name in to_start:
                launch = launches[name]
                for folder in launch.folders:
                    folder.mkdir(parents=True, exist_ok=True)
                rec = _process.start_process(
                    name,
                    launch.command,
                    env=_components.child_environment(launch),
                    extra_env=launch.env,
                    ports=launch.ports,
                    log_path=self._log_path(name),
                    pid_path=self._pid_path(name),
                    cwd=launch.cwd or self.data_dir,
                )
                started.append(rec)
                self._say(f"{name}: started (pid {rec.pid}, {_ports_text(name, rec.ports)})")
            waiting = {rec.name: rec for rec in started}
            waiting.update(to_wait)
            self._wait_healthy(waiting, timeout_s, started_here={rec.name for rec in started})
        except BaseException:
            for rec in reversed(started):
                _process.stop_process(rec, timeout_s=10.0)
                self._pid_path(rec.name).unlink(missing_ok=True)
            if started:
                self._say(f"stopped what this call started: {', '.join(r.name for r in reversed(started))}")
            raise
        return self.status()

    @staticmethod
    def _plan(ctx: Context, names: Iterable[str]) -> dict[str, _components.Launch]:
        launches = {}
        for name in names:
            try:
                launches[name] = _components.plan_launch(name, ctx)
            except ValueError as exc:
                raise StackError(f"{name}: {exc}") from None
        return launches

    def _check_binaries(self, name: str) -> None:
        if COMPONENTS[name].package not in PACKAGES:
            return  # the bridge runs in this Python environment: nothing installed for it
        pkg = PACKAGES[COMPONENTS[name].package]
        for binary in pkg.binaries:
            path = self._binary(pkg.name, binary)
            if not os.access(path, os.X_OK):
                only = "" if self.components == COMPONENT_NAMES else " --only " + ",".join(self.components)
                raise MissingBinaryError(
                    f"{name}: {binary} is not installed (looked for {path}); run `otel-rl stack install{only} "
                    f"--dir {self.data_dir}` (or `otel-rl stack up`, which installs what is missing)",
                    component=name,
                    path=str(path),
                )

    def _check_ports(self, name: str, ports: dict[str, int]) -> None:
        for role, port in ports.items():
            if _process.port_free(port):
                continue
            holder = _process.port_holder(port)
            raise PortInUseError(
                f"{name} cannot start: port {port} ({name} {role}) on {_process.LOOPBACK} is in use"
                f"{' by ' + holder if holder else ''}. If it is a stack of yours, stop it with `otel-rl stack down` "
                f"(with its --dir); or move this stack's ports with --port-offset N (OTEL_RL_STACK_PORT_OFFSET; "
                f"now {self.port_offset})",
                port=port,
                component=name,
                holder=holder,
            )

    def _wait_healthy(self, waiting: dict[str, _process.PidRecord], timeout_s: float | None, started_here: set[str]) -> None:
        begin = time.monotonic()
        deadlines = {n: begin + (timeout_s if timeout_s is not None else COMPONENTS[n].deadline_s) for n in waiting}
        while waiting:
            for name, rec in list(waiting.items()):
                code = _process.exit_code(rec)
                if code is not None or not _process.is_alive(rec):
                    self._fail(name, rec, f"exited{f' with status {code}' if code is not None else ''} while starting")
                if _components.check_health(name, rec.ports, timeout_s=1.0):
                    self._say(f"{name}: healthy in {format_seconds(time.monotonic() - begin)}")
                    del waiting[name]
                elif time.monotonic() > deadlines[name]:
                    hint = "" if name in started_here else " (it was started earlier; `otel-rl stack down` stops it)"
                    self._fail(
                        name, rec, f"not healthy after {format_seconds(deadlines[name] - begin)} ({COMPONENTS[name].health} failed){hint}"
                    )
            if waiting:
                time.sleep(0.2)

    def _fail(self, name: str, rec: _process.PidRecord, what: str) -> None:
        log = self._log_path(name)
        tail = _process.log_tail(log, 25, start=rec.log_offset)
        raise HealthCheckError(
            f"{name} {what}. Last lines of {log}:\n{tail or '(empty)'}\nCommand: {' '.join(rec.command)}", component=name, log=tail
        )

    def _down(self, names: tuple[str, ...], timeout_s: float) -> list[str]:
        stopped, problems = [], []
        for name in reversed(START_ORDER):
            if name not in names:
                continue
            path = self._pid_path(name)
            rec = _process.read_pid_file(path)
            if rec is None:
                continue
            if not _process.is_alive(rec):
                _process.stop_process(rec)  # signals nothing; forgets an exited child of ours
                path.unlink(missing_ok=True)
                self._say(f"{name}: removed a stale pid file (pid {rec.pid} was not running)")
                continue
            begin = time.monotonic()
            _process.stop_process(rec, timeout_s=timeout_s)
            busy = self._wait_ports_free(name, rec.ports, deadline_s=10.0)
            path.unlink(missing_ok=True)
            stopped.append(name)
            self._say(f"{name}: stopped (pid {rec.pid}) in {format_seconds(time.monotonic() - begin)}")
            for port in busy:
                holder = _process.port_holder(port)
                problems.append(f"port {port} ({name}) is still in use{' by ' + holder if holder else ''}")
        if not stopped and not problems:
            self._say("nothing was running")
        if problems:
            raise StackError("after stopping: " + "; ".join(problems))
        return stopped

    def _wait_ports_free(self, name: str, ports: dict[str, int], deadline_s: float) -> list[int]:
        end = time.monotonic() + deadline_s
        while True:
            busy = [port for port in ports.values() if not _process.port_free(port)]
            if not busy or time.monotonic() > end:
                return busy
            time.sleep(0.1)

    def _status_of(self, name: str) -> ComponentStatus:
        rec = _process.read_pid_file(self._pid_path(name))
        log = str(self._log_path(name))
        if rec is None:
            ports = self.ports(name)
            busy = []
            for port in ports.values():
                if not _process.port_free(port):
                    holder = _process.port_holder(port)
                    busy.append(f"port {port} in use{' by ' + holder if holder else ''}")
            return ComponentStatus(name, "stopped", None, ports, user_urls(name, ports), "; ".join(busy), log)
        ports = rec.ports or self.ports(name)
        if not _process.is_alive(rec):
            return ComponentStatus(
                name,
                "stale pid file",
                rec.pid if rec.pid > 0 else None,
                ports,
                user_urls(name, ports),
                f"pid {rec.pid} is not running; `otel-rl stack down` removes the file",
                log,
            )
        state = "healthy" if _components.check_health(name, ports) else "unhealthy"
        note = "" if state == "healthy" else f"{COMPONENTS[name].health} failed; see {log}"
        if name == "victoria-metrics" and state == "healthy":  # what replays and old data can rely on
            note = f"keeps samples for {_retention_of(rec.command)} (-retentionPeriod); older ones are dropped"
        return ComponentStatus(name, state, rec.pid, ports, user_urls(name, ports), note, log)


def _ports_text(name: str, ports: dict[str, int]) -> str:
    return ", ".join(f"{role} {_process.LOOPBACK}:{port}" for role, port in ports.items())
