"""Which module of a package imports which, read from the source with the ``ast`` module (nothing is imported).

Reading import lines as text misses most ways one module reaches another: ``from .. import training`` names a
sub-package in the imported *names*, ``import a.b as c`` binds another name, an import inside a function runs
later but still runs, and ``importlib.import_module("a.b")`` imports without an import statement. This resolver
turns every one of them into an edge ``(importer, imported module)`` between dotted module names, so that a layer
rule ("the model layer never imports the training layer") or a cycle search sees what Python will actually load.

Used by tests/test_layout.py (the dependency rules and the import cycles) and utils/generate_remote_code.py (which
package modules a saved model's code needs).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class Import:
    """One import found in ``importer``'s source.

    Attributes:
        importer: the dotted name of the module holding the import (``hf_tiednorm.conversion.export``).
        target: the dotted name of the module it imports, absolute (``from .. import training`` in a module of
            ``hf_tiednorm.conversion`` -> ``hf_tiednorm.training``; ``torch.nn`` as written).
        names: the names taken from ``target`` (``from x import a, b``: ``("a", "b")``); empty for ``import x``.
        line: the line of the statement in the importer's file.
        level: how many leading dots a relative import has (0: absolute).
        runtime: False for an import under ``if TYPE_CHECKING:`` (never executed).
        lazy: True for an import inside a function body (runs when the function is called, not on import).
        dynamic: True for ``importlib.import_module("...")`` / ``__import__("...")`` with a literal name.
    """

    importer: str
    target: str
    names: tuple[str, ...]
    line: int
    level: int = 0
    runtime: bool = True
    lazy: bool = False
    dynamic: bool = False


def module_names(root: Path) -> dict[str, Path]:
    """Every module of the package at ``root`` (a folder), as ``{dotted name: file}``; a package's name maps to
    its ``__init__.py``. Folders without ``__init__.py`` count as (namespace) packages too."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _literal_import_call(node: ast.Call) -> tuple[str, str | None] | None:
    """``(name, package)`` of ``importlib.import_module("name"[, "package"])`` or ``__import__("name")`` called with
    a string literal; None for any other call."""
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if called not in ("import_module", "__import__") or not node.args:
        return None
    if not (isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
        return None
    package = None
    if called == "import_module":
        given = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "package"),
                                                               None)  # fmt: skip
        if isinstance(given, ast.Constant) and isinstance(given.value, str):
            package = given.value
    return node.args[0].value, package


class _Collector(ast.NodeVisitor):
    """Walks one module, tracking whether it is inside a function or an ``if TYPE_CHECKING:`` block."""

    def __init__(self, module: str, is_package: bool, known: set[str], path: Path) -> None:
        self.module, self.known, self.path = module, known, path
        self.package = module if is_package else module.rpartition(".")[0]
        self.found: list[Import] = []
        self.depth = 0  # functions entered
        self.type_checking = 0

    def _add(self, target: str, names: tuple[str, ...], node: ast.AST, level: int = 0, dynamic: bool = False):
        self.found.append(Import(self.module, target, names, node.lineno, level, runtime=not self.type_checking,
                                 lazy=self.depth > 0, dynamic=dynamic))  # fmt: skip

    def _resolve_relative(self, level: int, module: str | None, node: ast.AST) -> str:
        base = self.package.split(".") if self.package else []
        if level - 1 > len(base) - 1:
            raise ValueError(f"{self.path}:{node.lineno}: a relative import ({'.' * level}{module or ''}) reaches "
                             f"above the top package {base[0] if base else '?'!r}")  # fmt: skip
        base = base[: len(base) - (level - 1)]
        return ".".join([*base, *(module.split(".") if module else [])])

    def visit_FunctionDef(self, node):
        self.depth += 1
        self.generic_visit(node)
        self.depth -= 1

    visit_AsyncFunctionDef = visit_Lambda = visit_FunctionDef

    def visit_If(self, node: ast.If):
        if _is_type_checking(node.test):
            self.type_checking += 1
            for child in node.body:
                self.visit(child)
            self.type_checking -= 1
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import):
        for alias in node.names:  # import a.b.c (as d): runs a, a.b and a.b.c; the module named is a.b.c
            self._add(alias.name, (), node)

    def visit_ImportFrom(self, node: ast.ImportFrom):
        base = self._resolve_relative(node.level, node.module, node) if node.level else node.module
        names = tuple(alias.name for alias in node.names)
        submodules = [f"{base}.{name}" for name in names if f"{base}.{name}" in self.known]
        if submodules:  # from pkg import sub (a module), possibly beside plain names
            for target in submodules:
                self._add(target, (), node, node.level)
            plain = tuple(name for name in names if f"{base}.{name}" not in self.known)
            if plain:
                self._add(base, plain, node, node.level)
        else:
            self._add(base, names, node, node.level)

    def visit_Call(self, node: ast.Call):
        literal = _literal_import_call(node)
        if literal is not None:
            name, package = literal
            if name.startswith("."):
                level = len(name) - len(name.lstrip("."))
                anchor = _Collector(package or self.package, True, self.known, self.path)
                name = anchor._resolve_relative(level, name.lstrip(".") or None, node)
            self._add(name, (), node, dynamic=True)
        self.generic_visit(node)


def imports_of(path: Path, module: str, known: Iterable[str]) -> list[Import]:
    """Every import in ``path`` (the source of ``module``, a dotted name), resolved against ``known`` (the dotted
    names of the scanned tree's modules, for ``from pkg import submodule``)."""
    collector = _Collector(module, path.name == "__init__.py", set(known), path)
    collector.visit(ast.parse(path.read_text(), filename=str(path)))
    return collector.found


def package_imports(root: Path) -> list[Import]:
    """Every import in every module of the package at ``root``."""
    modules = module_names(root)
    return [found for name, path in modules.items() for found in imports_of(path, name, modules)]


def internal_graph(imports: Iterable[Import], runtime_only: bool = False) -> dict[str, set[str]]:
    """``{importer: {imported module}}`` restricted to the modules that import (the scanned tree); with
    ``runtime_only``, imports under ``TYPE_CHECKING`` are left out."""
    imports = list(imports)
    known = {found.importer for found in imports}
    graph: dict[str, set[str]] = {name: set() for name in known}
    for found in imports:
        if found.target in known and found.target != found.importer and (found.runtime or not runtime_only):
            graph[found.importer].add(found.target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[tuple[str, ...]]:
    """The strongly connected components of ``graph`` with more than one module (import cycles), each sorted,
    sorted (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    counter = 0
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(tuple(sorted(component)))
    return sorted(found)


def longest_chain(graph: dict[str, set[str]]) -> list[str]:
    """The longest path of imports (a list of modules, importer first) in ``graph`` with each cycle collapsed to
    one step: how many modules one import can set loading in a row."""
    component_of = {}
    for component in cycles(graph):
        for member in component:
            component_of[member] = component[0]
    representative = {node: component_of.get(node, node) for node in graph}
    dag: dict[str, set[str]] = {rep: set() for rep in representative.values()}
    for node, targets in graph.items():
        for target in targets:
            if representative[target] != representative[node]:
                dag[representative[node]].add(representative[target])
    best: dict[str, list[str]] = {}

    def visit(node: str) -> list[str]:
        if node not in best:
            best[node] = [node, *max((visit(t) for t in sorted(dag[node])), key=len, default=[])]
        return best[node]

    return max((visit(node) for node in sorted(dag)), key=len, default=[])


__all__ = ["Import", "cycles", "imports_of", "internal_graph", "longest_chain", "module_names", "package_imports"]
