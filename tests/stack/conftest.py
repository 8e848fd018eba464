"""Fixtures for the stack tests: one data folder per session, free ports, a deadline per test, and
finalizers that stop every server by its PID file however a test ends."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Iterator

import pytest

from otel_rl.stack import Stack, free_port_offset

E2E_DEADLINE_S = 900  # the first full-stack run installs Phoenix (~1 GB)
UNIT_DEADLINE_S = 60


@pytest.fixture(scope="session")
def stack_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One data folder for the session, so each package is installed once per run.

    Downloaded .deb files stay in the user's cache folder (OTEL_RL_STACK_CACHE) across runs.
    """
    path = tmp_path_factory.mktemp("stack")
    yield path
    Stack(path, out=None).down()  # whatever a test left running, stopped by its PID file


@pytest.fixture
def make_stack(stack_dir: Path) -> Iterator:
    """Build Stack objects on the session's data folder; every one is brought down after the test."""
    made: list[Stack] = []

    def make(**options) -> Stack:
        options.setdefault("port_offset", free_port_offset())
        stack = Stack(options.pop("data_dir", stack_dir), **options)
        made.append(stack)
        return stack

    yield make
    errors = []
    for stack in made:
        try:
            stack.down()
        except Exception as exc:  # keep stopping the others; report at the end
            errors.append(exc)
    if errors:
        raise errors[0]


@pytest.fixture(autouse=True)
def _deadline(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail a test that runs past its deadline (SIGALRM), so its finalizers still stop the servers."""
    seconds = E2E_DEADLINE_S if request.node.get_closest_marker("e2e") else UNIT_DEADLINE_S

    def expired(signum, frame):
        raise TimeoutError(f"{request.node.nodeid} ran past its {seconds} s deadline")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture
def free_offset():
    """``free_port_offset`` itself, for tests that need a port offset with every port free."""
    return free_port_offset
