"""No import cycles anywhere in ``src/drapps``, and imports point down the floors.

Every import statement counts, also those inside functions and under ``TYPE_CHECKING``: a lazy
import that hides a cycle is still a cycle in the design. So does a module named in a string
(``importlib.import_module("drapps.x")``, a registry's ``"drapps.x:Name"``): an engine named
that way must not import its namer back.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import drapps

ROOT = Path(drapps.__file__).parent


def _modules(root: Path) -> dict[str, Path]:
    modules = {}
    for path in root.rglob("*.py"):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        modules[".".join(parts)] = path
    return modules


_NAMED = re.compile(r"([A-Za-z_]\w*(?:\.\w+)+):\w+")  # "module:Name", as registries name


def _imports(name: str, path: Path, known: set[str], *, named: bool = False) -> set[str]:
    """The modules of ``known`` that ``name`` imports (``named``: or names in a string)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if named and isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _NAMED.fullmatch(node.value)
            if match is not None:
                found.add(match.group(1))
        elif named and isinstance(node, ast.Call) and _called(node) == "import_module":
            if node.args and isinstance(node.args[0], ast.Constant):
                found.add(str(node.args[0].value))
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*parts, *([node.module] if node.module else [])])
            for alias in node.names:
                full = f"{base}.{alias.name}"
                found.add(full if full in known else base)
    return {module for module in found if module in known and module != name}


def _called(call: ast.Call) -> str | None:
    function = call.func
    if isinstance(function, ast.Attribute):
        return function.attr
    return function.id if isinstance(function, ast.Name) else None


def import_cycles(root: Path) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan's algorithm)."""
    modules = _modules(root)
    known = set(modules)
    graph = {name: _imports(name, path, known, named=True) for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in graph[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for node in graph:
        if node not in index:
            visit(node)
    return cycles


def test_no_import_cycles() -> None:
    assert len(_modules(ROOT)) > 50
    assert import_cycles(ROOT) == []


def _package(root: Path, **modules: str) -> Path:
    package = root / "pkg"
    package.mkdir(exist_ok=True)
    for name, text in {"__init__": "", **modules}.items():
        (package / f"{name}.py").write_text(text)
    return package


def test_the_check_finds_a_cycle_hidden_in_a_function_or_type_checking(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        a="def f():\n    from pkg import b\n",
        b="from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.a import f\n",
    )
    assert import_cycles(package) == [["pkg.a", "pkg.b"]]


def test_the_check_finds_a_cycle_through_a_module_named_in_a_string(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        a='import importlib\nENGINES = {"x": "pkg.b:Engine"}\n'
        'files = resources.files("pkg.c")\n'  # a package's files: not an import
        'def c():\n    return importlib.import_module("pkg.c")\n',
        b="from pkg.a import ENGINES\n",
        c="from pkg import a\n",
    )
    assert import_cycles(package) == [["pkg.a", "pkg.b", "pkg.c"]]
    (package / "b.py").write_text("ENGINE = 1\n")
    assert import_cycles(package) == [["pkg.a", "pkg.c"]]
    (package / "c.py").write_text("")
    assert import_cycles(package) == []


# The floors of ARCHITECTURE.md, bottom first: a module imports only from its own floor or
# below, and the packages of one floor import each other one way only (no package cycle).
FLOORS: tuple[frozenset[str], ...] = (
    frozenset({"runtime", "registry", "_optional", "_version"}),
    frozenset({"cache", "codecs", "ops", "control", "telemetry", "train", "datasets"}),
    frozenset({"engines"}),
    frozenset({"loader", "drapps"}),
    frozenset({"integrations", "bench", "cli", "reference", "sim", "tf"}),
)


def _unit(module: str) -> str:
    """The floor unit a module belongs to: its subpackage, or its own name at the top level
    (``drapps`` for the package's ``__init__``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "drapps"


def floor_violations(root: Path, floors: tuple[frozenset[str], ...] = FLOORS) -> list[str]:
    """Every import that points up a floor, and every two-way arrow between two packages of
    one floor, as ``"importer -> imported"`` lines."""
    level = {unit: n for n, units in enumerate(floors) for unit in units}
    modules = _modules(root)
    arrows: dict[tuple[str, str], str] = {}
    found = []
    for name, path in sorted(modules.items()):
        for other in sorted(_imports(name, path, set(modules))):
            a, b = _unit(name), _unit(other)
            if a == b:
                continue
            if a not in level or b not in level:
                found.append(f"{name} -> {other} (no floor for {a if a not in level else b})")
            elif level[b] > level[a]:
                found.append(f"{name} -> {other} (up from floor {level[a]} to {level[b]})")
            elif level[a] == level[b]:
                arrows.setdefault((a, b), f"{name} -> {other}")
    found += [
        f"{line} (and back: {arrows[(b, a)]})"
        for (a, b), line in sorted(arrows.items())
        if (b, a) in arrows and a < b
    ]
    return found


def test_imports_point_down_the_floors() -> None:
    units = {_unit(name) for name in _modules(ROOT)}
    assert units == set().union(*FLOORS)  # every package has its floor, no stale name
    assert floor_violations(ROOT) == []


def test_the_floor_check_finds_an_arrow_up_and_a_two_way_one(tmp_path: Path) -> None:
    package = tmp_path / "pkg"
    for sub in ("low", "mid_a", "mid_b"):
        (package / sub).mkdir(parents=True)
        (package / sub / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "low" / "base.py").write_text("def f():\n    from pkg.mid_a import thing\n")
    (package / "mid_a" / "thing.py").write_text("from pkg.mid_b import other\n")
    (package / "mid_b" / "other.py").write_text("import pkg.mid_a.thing\n")
    floors = (frozenset({"low"}), frozenset({"mid_a", "mid_b"}), frozenset({"drapps"}))
    found = floor_violations(package, floors)
    assert found == [
        "pkg.low.base -> pkg.mid_a.thing (up from floor 0 to 1)",
        "pkg.mid_a.thing -> pkg.mid_b.other (and back: pkg.mid_b.other -> pkg.mid_a.thing)",
    ]


def test_a_missing_dotted_module_is_not_installed_rather_than_an_error() -> None:
    """``find_spec("nvidia.dali")`` raises where ``nvidia`` is missing: the bench's peer
    list (``drapps bench``) failed to import without DALI."""
    from drapps._optional import installed

    assert not installed("drapps_no_such_parent.child")
    assert installed("drapps.loader")
