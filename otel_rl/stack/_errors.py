"""Errors of ``otel_rl.stack``: each message names what failed and what to do about it."""

from __future__ import annotations


class StackError(RuntimeError):
    """A stack command could not do what it was asked; the message says why and what to try."""


class InstallError(StackError):
    """An install step failed; the message names the step, shows the tool's output tail and what to try."""


class PortInUseError(StackError):
    """A port a component needs is taken."""

    def __init__(self, message: str, *, port: int, component: str, holder: str | None):
        super().__init__(message)
        self.port, self.component, self.holder = port, component, holder


class MissingBinaryError(StackError):
    """A component's program is not installed in the data folder."""

    def __init__(self, message: str, *, component: str, path: str):
        super().__init__(message)
        self.component, self.path = component, path


class HealthCheckError(StackError):
    """A component did not become healthy in time, or exited while starting."""

    def __init__(self, message: str, *, component: str, log: str):
        super().__init__(message)
        self.component, self.log = component, log
