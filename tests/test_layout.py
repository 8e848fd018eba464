"""The package's layout holds: one layer per folder, imports only go down the layers, no import
loops, no private names reached across packages, no hand-written module past 600 lines.

The layers, lowest first (a module may import its own layer and the ones below it):
generated names and constants; the registry and code generation; detection; the SDK exporters;
the tracker backends; the runtime (``_sdk``) and the public API over it; framework integrations
and the diagnostics (dfx); reading runs back; the trackers bridge; replay; analyze; ops artefacts;
the local stack; the demo; the command line.
"""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "otel_rl"

LAYERS: list[set[str]] = [
    {"semconv", "_version", "_lazy", "environment_variables", "reporting"},
    {"codegen"},
    {"detect"},
    {"exporters"},
    {"trackers"},
    {"_sdk", "__init__"},
    {"integrations", "dfx"},
    {"runs", "testing"},
    {"bridge"},
    {"replay"},
    {"analyze"},
    {"ops"},
    {"stack"},
    {"demo"},
    {"cli"},
]
LOOSE_PRIVATE_LIMIT = 4
LINE_LIMIT = 600
# Layer packages whose modules the rest of the package uses by design (the runtime's parts).
SHARED_PRIVATE_PACKAGES = {"_sdk"}


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _top(module: str) -> str:
    """The layer unit of a module: its first folder under otel_rl (``__init__`` for otel_rl itself)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _layer(module: str) -> int:
    unit = _top(module)
    for index, units in enumerate(LAYERS):
        if unit in units:
            return index
    raise AssertionError(f"{module}: its folder {unit!r} is in no layer of tests/test_layout.py")


def _imports(module: str, path: Path) -> list[tuple[str, list[str], int]]:
    """(imported module, names imported from it, line) for every import in ``path``, lazy ones too."""
    is_package = path.name == "__init__.py"
    package = module.split(".") if is_package else module.split(".")[:-1]
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.extend((alias.name, [], node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[: len(package) - node.level + 1] + ([node.module] if node.module else []))
            found.append((base, [alias.name for alias in node.names], node.lineno))
    return [(m, names, line) for m, names, line in found if m == "otel_rl" or m.startswith("otel_rl.")]


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = {m: set() for m in modules}
    for module, path in modules.items():
        for target, names, _ in _imports(module, path):
            for name in names:  # "from otel_rl.x import y" where y is a module
                if f"{target}.{name}" in modules:
                    graph[module].add(f"{target}.{name}")
            if target in modules and not all(f"{target}.{n}" in modules for n in names or ["-"]):
                graph[module].add(target)
    return graph


def _generated(path: Path) -> bool:
    return "semconv" in path.relative_to(PACKAGE).parts


def test_no_module_imports_a_layer_above_its_own():
    modules = _modules()
    upward = []
    for module, path in modules.items():
        for target, _, line in _imports(module, path):
            if target == "otel_rl" and module.count(".") >= 1:
                target = "otel_rl"  # the public API
            if _layer(target) > _layer(module):
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}")
    assert not upward, "\n".join(upward)


def test_no_import_loops():
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    loops: list[list[str]] = []
    counter = [0]

    def visit(node: str) -> None:  # Tarjan's strongly connected components
        index[node] = low[node] = counter[0]
        counter[0] += 1
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            # a package and the modules it re-exports import each other by design only through __init__
            if len(component) > 1:
                loops.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    # otel_rl/__init__ importing a submodule that imports the public API back is one more loop
    assert not loops, "import loops: " + "; ".join(" <-> ".join(c) for c in loops)


def test_no_private_name_is_reached_across_packages():
    modules = _modules()
    reached = []
    for module, path in modules.items():
        own = module.split(".")[:-1] if path.name != "__init__.py" else module.split(".")
        for target, names, line in _imports(module, path):
            parts = target.split(".")
            # the package that owns the target: private parts after it must belong to the importer
            for depth in range(1, len(parts)):
                part = parts[depth]
                if part.startswith("_") and not part.startswith("__") and part not in SHARED_PRIVATE_PACKAGES:
                    owner = parts[:depth]
                    if own[: len(owner)] != owner or len(own) < depth:
                        reached.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {target}")
                    break
            if target.split(".")[: len(own)] != own:
                private = [n for n in names if n.startswith("_") and not n.startswith("__")]
                if private:
                    reached.append(f"{path.relative_to(PACKAGE.parent)}:{line} imports {', '.join(private)} from {target}")
    assert not reached, "\n".join(reached)


def test_few_loose_private_modules_and_none_too_long():
    loose = sorted(p.name for p in PACKAGE.glob("_*.py") if p.name != "__init__.py")
    assert len(loose) <= LOOSE_PRIVATE_LIMIT, f"loose private modules in otel_rl/: {loose}"
    long = [
        f"{p.relative_to(PACKAGE.parent)}: {n} lines"
        for p in sorted(PACKAGE.rglob("*.py"))
        if not _generated(p) and (n := len(p.read_text().splitlines())) > LINE_LIMIT
    ]
    assert not long, "modules over 600 lines (split them):\n" + "\n".join(long)


# The runtime's sub-packages, lowest first: a module of one imports only its own and those before it.
SDK_UNITS = ["settings", "keys", "sources", "otlp", "spool", "pipeline", "export", "spans", "lifecycle", "telemetry"]
SDK_TOP_LIMIT = 8  # modules at the top of _sdk/ (its __init__ included)


def _sdk_unit(module: str) -> str | None:
    """The runtime unit of a module (``otel_rl._sdk.pipeline.worker`` -> ``pipeline``), None outside ``_sdk``."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "_sdk" else None


def test_runtime_sub_packages_import_only_those_below_their_own():
    modules = _modules()
    unknown = sorted({unit for m in modules if (unit := _sdk_unit(m)) is not None and unit not in SDK_UNITS})
    assert not unknown, f"otel_rl/_sdk/ units missing from SDK_UNITS in tests/test_layout.py: {unknown}"
    upward = []
    for module, path in modules.items():
        unit = _sdk_unit(module)
        if unit is None:
            continue
        for target, _, line in _imports(module, path):
            other = _sdk_unit(target)
            if other is not None and other != unit and SDK_UNITS.index(other) > SDK_UNITS.index(unit):
                upward.append(f"{path.relative_to(PACKAGE.parent)}:{line} ({unit}) imports {target} ({other})")
    assert not upward, "\n".join(upward)


def test_runtime_is_sub_packages_each_saying_what_it_owns():
    sdk = PACKAGE / "_sdk"
    top = sorted(p.name for p in sdk.glob("*.py"))
    assert len(top) <= SDK_TOP_LIMIT, f"modules at the top of otel_rl/_sdk/ (put them in a sub-package): {top}"
    overview = ast.get_docstring(ast.parse((sdk / "__init__.py").read_text())) or ""
    for package in sorted(p.parent for p in sdk.glob("*/__init__.py")):
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        modules = sorted(p.stem for p in package.glob("*.py") if p.stem != "__init__")
        assert len(doc) > 150, f"otel_rl/_sdk/{package.name}/__init__.py: say in its docstring what it owns and may import"
        unnamed = [m for m in modules if f"``{m}``" not in doc]
        assert not unnamed, f"otel_rl/_sdk/{package.name}/__init__.py: its docstring names no {unnamed}"
        assert f"``{package.name}/``" in overview, f"otel_rl/_sdk/__init__.py: its docstring does not place {package.name}/"
