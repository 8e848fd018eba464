"""Fixtures for the stack tests: one data folder per session, free ports, and finalizers that stop
every server by its PID file however a test ends (the e2e deadline is in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from otel_rl.stack import Stack, free_port_offset


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


@pytest.fixture
def free_offset():
    """``free_port_offset`` itself, for tests that need a port offset with every port free."""
    return free_port_offset
