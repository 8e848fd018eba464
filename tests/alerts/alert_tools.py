"""Helpers of the alert tests: the real rule tools (promtool from Debian's prometheus package; vmalert and
vmalert-tool from Debian's victoria-metrics), installed by the stack's installer into a cached folder."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOLS_ENV = "OTEL_RL_ALERT_TOOLS_DIR"


@dataclass(frozen=True)
class RuleTools:
    promtool: Path
    vmalert: Path
    vmalert_tool: Path
    netns: tuple[str, ...] | None  # prefix that runs a command in a private network namespace

    def run(self, command: Sequence[str | Path], *, cwd: Path = REPO, timeout_s: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(
            [str(c) for c in command], cwd=cwd, capture_output=True, text=True, timeout=timeout_s, stdin=subprocess.DEVNULL
        )

    def vmalert_tool_unittest(self, *files: Path, cwd: Path = REPO) -> subprocess.CompletedProcess:
        # vmalert-tool 1.112 starts its built-in VictoriaMetrics on 0.0.0.0:8880 (hard-coded): in a
        # private network namespace it listens on nothing anyone else can reach and cannot collide
        # with a stack's vmalert on 8880.
        if self.netns is None:
            pytest.skip(
                "vmalert-tool listens on 0.0.0.0:8880; running it needs a private network namespace "
                "(unshare --net), which this system does not allow"
            )
        args = ["unittest", "--disableAlertgroupLabel", *(f"--files={f}" for f in files)]
        return self.run([*self.netns, self.vmalert_tool, *args], cwd=cwd)


def _netns_prefix() -> tuple[str, ...] | None:
    """A command prefix that gives the command its own network namespace with loopback up."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return None
    for flags in (("--net",), ("--net", "--map-root-user")):
        prefix = ("unshare", *flags, "--", "sh", "-c", 'ip link set lo up && exec "$0" "$@"')
        probe = subprocess.run([*prefix, "sh", "-c", "exit 0"], capture_output=True, timeout=30)
        if probe.returncode == 0:
            return prefix
    return None


def install_rule_tools() -> RuleTools:
    """Install (once; cached) and return the rule tools. Skips only where Debian's tools are absent."""
    from otel_rl.stack import Stack, default_cache_dir
    from otel_rl.stack._install import Installer

    if shutil.which("apt-get") is None or shutil.which("dpkg-deb") is None:
        pytest.skip("the rule tools come from Debian's archive (apt-get, dpkg-deb), which this system lacks")
    folder = os.environ.get(TOOLS_ENV) or default_cache_dir() / "rule-tools"
    stack = Stack(folder, only=["victoria-metrics", "prometheus"], out=None)
    stack.install()  # idempotent: install.json records what is there; .deb files are cached
    installer = Installer(stack.data_dir, stack.cache_dir, lambda: None)
    return RuleTools(
        promtool=installer.binary("prometheus", "promtool"),
        vmalert=installer.binary("victoria-metrics", "vmalert"),
        vmalert_tool=installer.binary("victoria-metrics", "vmalert-tool"),
        netns=_netns_prefix(),
    )
