"""The layers hold: no import cycles among the project's modules, and a core without I/O.

Read from the source with ``ast``, so every import counts: those inside functions (which
defer loading but still tie the modules together) and those under ``TYPE_CHECKING``.
The top-level ``adapters/`` folder is installed as ``acp_bridge.adapters`` and is named so.
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The sans-IO core: the modules that would bring threads, processes, sockets, the
# database or an event loop into it.
IO_MODULES = frozenset({"trio", "subprocess", "sqlite3", "socket", "threading", "asyncio"})


def project_modules(root: Path) -> dict[str, Path]:
    """Module name -> file, for ``acp_bridge/**`` and ``adapters/*`` under ``root``."""
    found: dict[str, Path] = {}
    for folder, package in ((root / "acp_bridge", "acp_bridge"), (root / "adapters", None)):
        for path in sorted(folder.rglob("*.py")):
            parts = list(path.relative_to(folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            prefix = [package] if package else ["acp_bridge", "adapters"]
            found[".".join(prefix + parts)] = path
    return found


@functools.cache
def parsed(path: Path) -> ast.Module:
    """A file's tree, parsed once per run: several tests walk the same files."""
    return ast.parse(path.read_text(encoding="utf-8"), str(path))


def imported_names(module: str, path: Path) -> Iterator[tuple[str, int]]:
    """Every name ``path`` imports, anywhere in the file (``from a import b``: ``a`` and
    ``a.b``), with its line."""
    is_package = path.name == "__init__.py"
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(parsed(path)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                source = ".".join([*base, *([node.module] if node.module else [])])
            else:
                source = node.module or ""
            yield source, node.lineno
            for alias in node.names:
                yield f"{source}.{alias.name}", node.lineno


def import_graph(root: Path) -> dict[str, set[str]]:
    """Module -> the project modules it imports (the longest known prefix of each name)."""
    modules = project_modules(root)
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        edges = graph.setdefault(module, set())
        for name, _ in imported_names(module, path):
            parts = name.split(".")
            for end in range(len(parts), 0, -1):
                target = ".".join(parts[:end])
                if target in modules:
                    # A package importing its own submodule is no cycle: the submodule's
                    # import of the package finds it already initialised.
                    if target != module and not target.startswith(module + "."):
                        edges.add(target)
                    break
    return graph


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that import each other, directly or through others (the
    strongly connected components of more than one module; Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in sorted(graph.get(module, ())):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            group: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_no_import_cycles() -> None:
    cycles = import_cycles(import_graph(ROOT))
    assert cycles == [], "\n".join(
        f"import cycle of {len(group)} modules: {', '.join(group)}" for group in cycles
    )


def test_the_library_does_not_import_the_command_line() -> None:
    """Only the console entry imports ``acp_bridge.commands.cli``, and the command modules it
    loads by name (``verify``, which reuses the run command's options)."""
    importers = {
        module
        for module, targets in import_graph(ROOT).items()
        if "acp_bridge.commands.cli" in targets
    }
    assert importers <= {"acp_bridge.__main__", "acp_bridge.commands.verify"}


# The sub-packages from the bottom up: a module imports only from its own layer and those
# below it. The modules at the top of ``acp_bridge`` (the adapter interface and the pool,
# configuration, finding adapters) sit between supervision and the runtime, which drives
# adapters; ``__main__`` is the console entry and may import anything.
LAYERS = ("wire", "core", "state", "supervision", "", "runtime", "commands")
RANKS = {"wire": 0, "core": 1, "state": 1, "supervision": 2, "": 3, "runtime": 4, "commands": 5}


def layer_of(module: str) -> str | None:
    """The layer of an ``acp_bridge`` module ("" for one at the top of the package), or
    ``None`` for the built-in adapters, the model endpoint and the console entry."""
    parts = module.split(".")
    if parts[0] != "acp_bridge" or module in ("acp_bridge", "acp_bridge.__main__"):
        return None
    if parts[1] in RANKS:
        return parts[1]
    return "" if len(parts) == 2 else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    return [
        f"{module} ({layer or 'top'}) imports {target}"
        for module, targets in graph.items()
        if (layer := layer_of(module)) is not None
        for target in sorted(targets)
        if (target_layer := layer_of(target)) is not None and RANKS[target_layer] > RANKS[layer]
    ]


def test_each_layer_imports_only_from_itself_and_below() -> None:
    assert upward_imports(import_graph(ROOT)) == []
    assert set(LAYERS) == set(RANKS)


def test_an_import_from_a_higher_layer_is_found(tmp_path: Path) -> None:
    package = tmp_path / "acp_bridge"
    for layer in ("wire", "core", "runtime"):
        (package / layer).mkdir(parents=True)
        (package / layer / "__init__.py").write_text("")
    (tmp_path / "adapters").mkdir()
    (package / "__init__.py").write_text("")
    (package / "settings.py").write_text("def f():\n    from acp_bridge.runtime import relay\n")
    (package / "runtime" / "relay.py").write_text("from acp_bridge.core import router\n")
    (package / "core" / "router.py").write_text("from acp_bridge.wire import framing\n")
    (package / "wire" / "framing.py").write_text("import acp_bridge.core.router\n")

    assert set(upward_imports(import_graph(tmp_path))) == {
        "acp_bridge.settings (top) imports acp_bridge.runtime",
        "acp_bridge.settings (top) imports acp_bridge.runtime.relay",
        "acp_bridge.wire.framing (wire) imports acp_bridge.core.router",
    }


def test_the_core_imports_no_io() -> None:
    modules = project_modules(ROOT)
    found = [
        f"{module} line {line}: {name}"
        for module, path in modules.items()
        if module.startswith("acp_bridge.core")
        for name, line in imported_names(module, path)
        if name.split(".")[0] in IO_MODULES
    ]
    assert [module for module in modules if module.startswith("acp_bridge.core.")]
    assert found == []


# A class a reader can hold in one sitting; the runtime is split by job, and the router
# hands whole jobs to modules of the core, to stay under it. The model endpoint (the fake
# model server of the end-to-end tests, no part of the bridge) is left out.
MAX_CLASS_LINES = 450
EXEMPT = ("acp_bridge.model_endpoint",)


def long_classes(root: Path, package: str, exempt: tuple[str, ...] = ()) -> list[str]:
    """The classes of ``package`` (and below) under ``root`` longer than MAX_CLASS_LINES,
    but for those of the packages in ``exempt``."""

    def within(module: str, name: str) -> bool:
        return module == name or module.startswith(name + ".")

    found = []
    for module, path in project_modules(root).items():
        if within(module, package) and not any(within(module, name) for name in exempt):
            for node in ast.walk(parsed(path)):
                if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_CLASS_LINES:
                        found.append(f"{module}.{node.name}: {lines} lines")
    return found


def test_no_class_outside_the_model_endpoint_spans_more_than_450_lines() -> None:
    assert long_classes(ROOT, "acp_bridge", EXEMPT) == []


def test_a_class_over_450_lines_is_found_in_every_layer_but_the_model_endpoint(
    tmp_path: Path,
) -> None:
    package = tmp_path / "acp_bridge"
    for folder in ("runtime", "core", "model_endpoint"):
        (package / folder).mkdir(parents=True)
    (tmp_path / "adapters").mkdir()
    body = "".join(f"    x{n} = {n}\n" for n in range(MAX_CLASS_LINES))
    (package / "runtime" / "relay.py").write_text(f"class Bridge:\n{body}")
    (package / "core" / "router.py").write_text(f"class Router:\n    x = 0\n{body}")
    # Exactly the limit: allowed.
    (package / "pool.py").write_text("class Pool:\n" + body.partition("\n")[2])
    (package / "model_endpoint" / "server.py").write_text(f"class Server:\n{body}")
    (tmp_path / "adapters" / "agent.py").write_text(f"class Adapter:\n{body}")
    assert sorted(long_classes(tmp_path, "acp_bridge", EXEMPT)) == [
        f"acp_bridge.adapters.agent.Adapter: {MAX_CLASS_LINES + 1} lines",
        f"acp_bridge.core.router.Router: {MAX_CLASS_LINES + 2} lines",
        f"acp_bridge.runtime.relay.Bridge: {MAX_CLASS_LINES + 1} lines",
    ]


def test_a_cycle_through_an_import_inside_a_function_is_found(tmp_path: Path) -> None:
    package = tmp_path / "acp_bridge"
    (package / "core").mkdir(parents=True)
    (tmp_path / "adapters").mkdir()
    (package / "__init__.py").write_text("")
    (package / "core" / "__init__.py").write_text("")
    (package / "core" / "a.py").write_text("from . import b\n")
    (package / "core" / "b.py").write_text("def f():\n    from acp_bridge import c\n")
    (package / "c.py").write_text("def g():\n    import acp_bridge.core.a\n")
    (tmp_path / "adapters" / "d.py").write_text("from acp_bridge.core import a\n")

    graph = import_graph(tmp_path)

    assert graph["acp_bridge.adapters.d"] == {"acp_bridge.core", "acp_bridge.core.a"}
    assert import_cycles(graph) == [["acp_bridge.c", "acp_bridge.core.a", "acp_bridge.core.b"]]
