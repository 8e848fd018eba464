from __future__ import annotations

import logging
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import otel_rl


@pytest.fixture
def make_telemetry(tmp_path: Path) -> Iterator:
    """Start telemetry that writes its run folder under tmp_path; shut every one down afterwards."""
    started: list[otel_rl.Telemetry] = []

    def make(**options):
        options.setdefault("run_dir", str(tmp_path / f"run{len(started)}"))
        options.setdefault("console", False)
        options.setdefault("service_name", "otel-rl-test")
        if not started:
            tel = otel_rl.init(**options)
        else:  # more live instances in one test (ranks, a comparison): built directly, as init() documents
            tracer_provider = options.pop("tracer_provider", None)
            hooks = options.pop("on_alert", None)
            tel = otel_rl.Telemetry(otel_rl.resolve_config(options), tracer_provider=tracer_provider)
            for hook in [hooks] if callable(hooks) else list(hooks or ()):
                tel.on_alert(hook)
        started.append(tel)
        return tel

    yield make
    for tel in started:
        tel.shutdown()


@pytest.fixture(autouse=True)
def _otel_rl_logs_propagate() -> Iterator[None]:
    # caplog listens on the root logger; make sure otel_rl's records reach it at WARNING.
    logger = logging.getLogger("otel_rl")
    previous = logger.level
    logger.setLevel(logging.INFO)
    yield
    logger.setLevel(previous)


# Tests that start real servers fail past this deadline (SIGALRM) so their finalizers still stop
# every server by PID; the first full-stack run builds the collector and Jaeger from Go modules.
E2E_DEADLINE_S = 900


@pytest.fixture(autouse=True)
def _e2e_deadline(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.node.get_closest_marker("e2e") is None:
        yield
        return

    def expired(signum, frame):
        raise TimeoutError(f"{request.node.nodeid} ran past its {E2E_DEADLINE_S} s deadline")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(E2E_DEADLINE_S)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def silent_peer() -> Iterator[str]:
    """A real TCP server on 127.0.0.1 that accepts every connection and never answers."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.1)
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            held.append(conn)  # kept open, never read from nor written to

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(2)
        for conn in held:  # the exporters' threads still waiting on it now fail at once
            conn.close()
        server.close()


# Tests run on parallel workers (pytest-xdist; scripts/test.sh), a whole file to a worker, so that
# a module's fixtures (a demo run, a collector) are built once. Those that start a local stack or
# install its servers share a port-offset range and the installs' folders (vmalert-tool's fixed
# scratch folder too), so all of them are one unit: one worker, one after another.
_SERIAL_PATHS = ("tests/e2e/", "tests/stack/", "tests/alerts/", "tests/grafana/", "tests/exporters/test_bridge.py")
_SERIAL_UNIT = "tests/ that run a local stack"


class _StackTestsTogether:
    """Makes xdist's scheduler: LoadScope, whose unit is a file, or the serial tests all together.
    (xdist's own --dist loadgroup reads a node id attribute pytest 9.2 no longer has.)"""

    @staticmethod
    def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
        from xdist.scheduler import LoadScopeScheduling

        class Scheduler(LoadScopeScheduling):
            def _split_scope(self, nodeid: str) -> str:
                path = nodeid.split("::", 1)[0]
                return _SERIAL_UNIT if path.startswith(_SERIAL_PATHS) else path

        return Scheduler(config, log)


def pytest_configure(config: pytest.Config) -> None:
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_StackTestsTogether(), "otel-rl-test-scheduling")
