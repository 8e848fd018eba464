"""Every OTEL_RL_* variable the package reads is a documented constant of
``otel_rl.environment_variables``, and init()'s options name theirs from there."""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from otel_rl import environment_variables as env
from otel_rl._sdk.settings.config import TelemetryConfig

PACKAGE = Path(env.__file__).resolve().parent


def _documented() -> dict[str, str]:
    tree = ast.parse(Path(env.__file__).read_text())
    docs = {}
    body = tree.body
    for node, after in zip(body, body[1:]):
        if isinstance(node, ast.Assign) and isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant):
            docs[node.targets[0].id] = after.value.value  # type: ignore[attr-defined]
    return docs


def test_each_constant_is_its_own_name_and_documented():
    names = [n for n in dir(env) if n.startswith("OTEL_RL_")]
    assert len(names) >= 20
    docs = _documented()
    for name in names:
        assert getattr(env, name) == name
        assert docs.get(name, "").strip(), f"{name} has no docstring"


def test_every_variable_named_in_the_code_is_defined():
    defined = {n for n in dir(env) if n.startswith("OTEL_RL_")}
    named = set()
    for path in PACKAGE.rglob("*.py"):
        if path.name != "environment_variables.py":
            named |= set(re.findall(r"\bOTEL_RL_[A-Z0-9_]*[A-Z0-9]\b", path.read_text()))
    assert named - defined == set(), f"not in otel_rl.environment_variables: {sorted(named - defined)}"


def test_init_options_name_the_constants():
    for field in dataclasses.fields(TelemetryConfig):
        name = field.metadata["env"]
        if name and name.startswith("OTEL_RL_"):
            assert getattr(env, name) == name
