"""Run a test again inside a network namespace whose only interface is loopback.

Some real servers (Ray's gRPC services, torch.distributed's TCPStore and gloo) bind every
interface. Tests that start them call ``rerun_in_loopback_namespace`` first, so nothing they
start is reachable from outside the machine.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
LOOPBACK_NETNS_ENV = "OTEL_RL_LOOPBACK_NETNS"


def in_loopback_namespace() -> bool:
    return os.environ.get(LOOPBACK_NETNS_ENV) == "1"


def rerun_in_loopback_namespace(request: pytest.FixtureRequest, timeout_s: float) -> None:
    """Run this test again as ``unshare -n pytest <nodeid>`` and fail with its output if it fails."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if unshare is None or ip is None:
        pytest.skip("needs unshare and ip (util-linux, iproute2) to keep its servers on loopback")
    probe = subprocess.run([unshare, "-n", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot create a network namespace here ({probe.stderr.strip()}); its servers would bind every interface")
    script = f'{ip} link set lo up && exec "$0" -m pytest -q -p no:cacheprovider "$1"'
    env = {**os.environ, LOOPBACK_NETNS_ENV: "1"}
    try:
        done = subprocess.run(
            [unshare, "-n", "sh", "-c", script, sys.executable, request.node.nodeid],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{request.node.nodeid} ran past {timeout_s} s in its network namespace:\n{exc.stdout or ''}")
    if done.returncode != 0:
        pytest.fail(
            f"{request.node.nodeid} failed in its loopback-only network namespace "
            f"(exit {done.returncode}):\n{done.stdout[-8000:]}\n{done.stderr[-4000:]}"
        )
