"""Fixtures of the alert tests."""

from __future__ import annotations

import pytest
from alert_tools import RuleTools, install_rule_tools


@pytest.fixture(scope="session")
def rule_tools() -> RuleTools:
    """promtool, vmalert and vmalert-tool, installed once into a cached folder."""
    return install_rule_tools()
