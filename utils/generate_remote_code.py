"""Generate the two Python files a saved hf_tiednorm model carries, for each family: ``configuration_tiednorm.py`` and
``modeling_tiednorm.py`` (in ``hf_tiednorm/remote_code/<family>/``, copied beside the weights by ``save_pretrained``).

Why: ``from_pretrained(folder, trust_remote_code=True)`` runs the Python files a folder holds, and whoever loads a
model that way is asked to review them first. transformers' own copy (``custom_object_save``) takes the module that
defines the class and every module it reaches through ``from .x import`` (single dots only).
A Hub repository of remote code holds one configuration and one modeling file; so does ours, built here the way
transformers' ``utils/modular_model_converter.py`` builds its single-file models from modular sources.

How (nothing here knows a module by name, so the output follows the package as it changes):

1. Each row of the family table (``hf_tiednorm.modeling.families.table.ROWS``: a family, or the wrapper) gets its own
   pair of files. Its roots are the modules of its classes: the configuration class for the configuration file; the
   model classes and the pipeline an encoder-decoder's folder names for the modeling file.
2. Each file holds the closure of its roots over the package's relative imports (utils/import_graph.py reads them
   with ``ast``: top-level, inside functions, under ``TYPE_CHECKING``), the configuration file's modules excepted
   from the modeling file (which imports them from ``.configuration_tiednorm``, the one relative import left).
3. The modules are inlined whole (comments and docstrings kept) in dependency order; their absolute imports are
   gathered at the top, their relative imports removed (the names now live in the same file), ``__all__`` dropped.
   A name two modules define differently stops the generator with both modules named; so does a relative import
   of a module no generated file holds (a sub-package's: conversion, training, publishing).
4. A module written with ``from __future__ import annotations`` keeps that meaning in a file that cannot start
   with it (its annotations are written as strings).
5. A top-level function or class that nothing in the file reaches from the family's classes (and the configuration
   file's from the modeling file) is left out: package-only helpers (``check_again``, another family's output
   class) are not code a reviewer reads for this model (``unreached``); a module left with its docstring alone is
   left out whole.

Usage:
    python utils/generate_remote_code.py           # (re)write hf_tiednorm/remote_code/*/*.py
    python utils/generate_remote_code.py --check   # exit 1 naming the stale file (tests/modeling/test_remote_code.py)
"""

from __future__ import annotations

import argparse
import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from import_graph import Import, imports_of, module_names  # noqa: E402

PACKAGE = "hf_tiednorm"
MODEL_LAYER = f"{PACKAGE}.modeling"  # the sub-package a saved model's code is generated from
OUTPUT = REPO_ROOT / PACKAGE / "remote_code"
CONFIG_FILE, MODELING_FILE = "configuration_tiednorm", "modeling_tiednorm"
FUTURE = "from __future__ import annotations"


def family_classes() -> dict[str, tuple[type, list[type]]]:
    """{row name: (configuration class, model classes and pipeline)} of every row of the family table, in order."""
    sys.path.insert(0, str(REPO_ROOT))
    import hf_tiednorm.modeling.families.table as table

    classes = {}
    for row in table.ROWS.values():
        models = (row.base_model_class, *(lm for lm, _ in row.lm_classes), row.pipeline_class)
        classes[row.name] = row.config_class, [model for model in models if model]
    return classes


def family_roots() -> dict[str, tuple[list[str], list[str]]]:
    """{row name: (configuration modules, modeling modules)} of every row of the family table, in table order."""
    return {name: ([config.__module__], list(dict.fromkeys(model.__module__ for model in models)))
            for name, (config, models) in family_classes().items()}  # fmt: skip


@dataclass
class Module:
    """One package module read for inlining."""

    name: str
    label: str  # its path from the package's parent folder: hf_tiednorm/modeling/head/layer.py
    source: str
    tree: ast.Module
    imports: list[Import]

    @property
    def has_future(self) -> bool:
        return any(isinstance(node, ast.ImportFrom) and node.module == "__future__" for node in self.tree.body)


def read_modules(root: Path = REPO_ROOT / PACKAGE, layer: str = MODEL_LAYER) -> dict[str, Module]:
    """The modules of ``layer`` (a dotted package name, the model layer by default) in the package at ``root``, by
    dotted name; no other sub-package travels, and the packages' ``__init__`` files hold docstrings only."""
    modules = module_names(root)
    found = {}
    for name, path in modules.items():
        if name.startswith(f"{layer}.") and path.name != "__init__.py":
            source, label = path.read_text(), str(path.relative_to(root.parent))
            found[name] = Module(name, label, source, ast.parse(source), imports_of(path, name, modules))
    return found


def internal_targets(module: Module, modules: dict[str, Module], eager_only: bool) -> list[str]:
    """The package modules ``module`` imports, in the order it imports them (``eager_only``: those run on import:
    top-level and not under ``TYPE_CHECKING``)."""
    package = module.name.split(".")[0]
    targets = []
    for found in module.imports:
        if found.target.startswith(f"{package}.") or found.target == package:
            if found.level == 0 and not found.dynamic:
                raise SystemExit(f"{module.label}:{found.line}: an absolute import of the package ({found.target}); "
                                 "a saved model's code cannot import hf_tiednorm: use a relative import")  # fmt: skip
            if found.dynamic:
                continue  # importlib.import_module("hf_tiednorm...."): runs only where the package is installed
            if found.target not in modules:
                raise SystemExit(f"{module.label}:{found.line}: imports {found.target}, which a saved model's code "
                                 "cannot carry (only the model layer's modules are inlined); make the import lazy "
                                 "through importlib in the training path, or move the code out of the model's "
                                 "modules")  # fmt: skip
            if eager_only and (found.lazy or not found.runtime):
                continue
            targets.append(found.target)
    return list(dict.fromkeys(targets))


def closure(roots: list[str], modules: dict[str, Module]) -> list[str]:
    """Every module ``roots`` need, dependencies before their importers (depth-first over the imports that run on
    import; a module reached only lazily or for type checking follows its importer)."""
    needed: set[str] = set()
    stack = list(roots)
    while stack:
        name = stack.pop()
        if name not in needed:
            needed.add(name)
            stack += internal_targets(modules[name], modules, eager_only=False)
    order: list[str] = []
    visiting: set[str] = set()

    def visit(name: str) -> None:
        if name in order:
            return
        if name in visiting:
            raise SystemExit(f"an import cycle that runs on import reaches {modules[name].label}")
        visiting.add(name)
        for target in internal_targets(modules[name], modules, eager_only=True):
            visit(target)
        visiting.discard(name)
        order.append(name)

    for name in [*roots, *sorted(needed)]:
        visit(name)
    return order


def _names_in(node: ast.AST) -> set[str]:
    """Every name ``node`` may reach: its names, attributes, and the words of strings that read as code (a string
    annotation, a ``getattr`` name); docstrings excepted."""
    docstrings = {id(inner.value) for inner in ast.walk(node) if isinstance(inner, ast.Expr)}
    names = set()
    for inner in ast.walk(node):
        if isinstance(inner, ast.Name):
            names.add(inner.id)
        elif isinstance(inner, ast.Attribute):
            names.add(inner.attr)
        elif isinstance(inner, ast.Constant) and isinstance(inner.value, str) and id(inner) not in docstrings:
            if re.fullmatch(r"[\w.\[\], |\"']*", inner.value):
                names.update(re.findall(r"[A-Za-z_]\w*", inner.value))
    return names


def unreached(inlined: list[str], modules: dict[str, Module], roots: set[str]) -> tuple[set[int], set[str]]:
    """Tree shaking: the top-level functions and classes of ``inlined`` that neither ``roots`` (names) nor any other
    top-level statement reaches, as ``id``s of their nodes; and every name the kept code uses."""
    defined: dict[str, list[ast.stmt]] = {}
    used = set(roots)
    for name in inlined:
        for node in modules[name].tree.body:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                defined.setdefault(node.name, []).append(node)
            elif not (isinstance(node, ast.Assign) and _bound_names(node) == ["__all__"]):
                used |= _names_in(node)
    pending, reached = list(used), set()
    while pending:
        name = pending.pop()
        if name in defined and name not in reached:
            reached.add(name)
            for node in defined[name]:
                found = _names_in(node)
                used |= found
                pending += found
    return {id(node) for name, nodes in defined.items() if name not in reached for node in nodes}, used


@dataclass
class Output:
    """The generated file being assembled."""

    name: str
    inlined: list[str]
    imported_from_config: set[str] = field(default_factory=set)  # modules the modeling file imports
    absolute: dict[tuple[str, str], dict[str, str | None]] = field(default_factory=dict)  # (kind, module)
    defined: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (module label, statement source)
    from_config: dict[str, str | None] = field(default_factory=dict)
    left_out: set[int] = field(default_factory=set)  # ids of the top-level nodes no root reaches (``unreached``)
    used: set[str] | None = None  # the names the kept code uses: an import of another name is left out too


def _bound_names(node: ast.stmt) -> list[str]:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return [node.name]
    targets = node.targets if isinstance(node, ast.Assign) else [getattr(node, "target", None)]
    return [name.id for target in targets if target is not None for name in ast.walk(target)
            if isinstance(name, ast.Name)]  # fmt: skip


def _offsets(source: str) -> list[int]:
    starts, total = [0], 0
    for line in source.splitlines(keepends=True):
        total += len(line)
        starts.append(total)
    return starts


class Inliner:
    """Rewrites one module's source for a generated file: a list of (start, end, replacement) edits."""

    def __init__(self, module: Module, output: Output, modules: dict[str, Module], stringify: bool) -> None:
        self.module, self.output, self.modules, self.stringify = module, output, modules, stringify
        self.starts = _offsets(module.source)
        self.edits: list[tuple[int, int, str]] = []

    def _span(self, node: ast.AST) -> tuple[int, int]:
        start = self.starts[node.lineno - 1] + node.col_offset
        end = self.starts[node.end_lineno - 1] + node.end_col_offset
        return start, end

    def _statement_span(self, node: ast.stmt) -> tuple[int, int]:
        """The statement's whole lines (with its trailing comment and newline)."""
        return self.starts[node.lineno - 1], self.starts[node.end_lineno]

    def _leading_comments(self, node: ast.stmt) -> int:
        """Where a statement left out starts: its decorators and the comment lines right above them."""
        line = min([node.lineno, *(d.lineno for d in getattr(node, "decorator_list", []))]) - 1
        lines = self.module.source.splitlines()
        while line > 0 and lines[line - 1].lstrip().startswith("#"):
            line -= 1
        return self.starts[line]

    def _where(self, node: ast.AST) -> str:
        return f"{self.module.label}:{node.lineno}"

    def _relative_target(self, node: ast.ImportFrom) -> str:
        """The module a relative import names (``from ..loss.token import x`` in ``hf_tiednorm.modeling.head.layer``
        -> ``hf_tiednorm.modeling.loss.token``); a module's names only, never a package's."""
        package = self.module.name.split(".")[: -node.level]
        target = ".".join(package + ([node.module] if node.module else []))
        if not node.module or target not in self.modules:
            raise SystemExit(f"{self._where(node)}: only `from .module import name` (any number of dots) of a "
                             f"module of {MODEL_LAYER} is inlined, not {target}")  # fmt: skip
        return target

    def _replacement_for_relative(self, node: ast.ImportFrom, indent: str, nested: bool) -> str:
        """What a relative import becomes: nothing (same file), aliases, or an import from the configuration file."""
        target = self._relative_target(node)
        if target in self.output.inlined:
            lines = [f"{indent}{alias.asname} = {alias.name}\n" for alias in node.names if alias.asname]
            return "".join(lines)
        if target in self.output.imported_from_config:
            if nested:
                names = ", ".join(a.name + (f" as {a.asname}" if a.asname else "") for a in node.names)
                return f"{indent}from .{CONFIG_FILE} import {names}\n"
            for alias in node.names:
                if self.output.used is None or (alias.asname or alias.name) in self.output.used:
                    self.output.from_config[alias.name] = alias.asname
            return ""
        raise SystemExit(f"{self._where(node)}: imports {target}, which neither generated file holds")

    def _define(self, name: str, node: ast.stmt) -> bool:
        """Record ``name`` as defined at top level by ``node``; False when an identical statement already did."""
        statement = ast.unparse(node)
        if name in self.output.defined:
            where, earlier = self.output.defined[name]
            if earlier == statement:
                return False
            raise SystemExit(f"{self.module.label} and {where} both define {name!r} at top level: one generated "
                             f"file cannot hold both; rename one of them")  # fmt: skip
        self.output.defined[name] = (self.module.label, statement)
        return True

    def _hoist(self, node: ast.Import | ast.ImportFrom) -> None:
        if isinstance(node, ast.Import):
            for alias in node.names:
                self._bind_import(alias.asname or alias.name.split(".")[0], "import", "", alias, node)
        elif node.module != "__future__":
            for alias in node.names:
                self._bind_import(alias.asname or alias.name, "from", node.module, alias, node)

    def _bind_import(self, bound: str, kind: str, module: str, alias: ast.alias, node: ast.stmt) -> None:
        if self.output.used is not None and bound not in self.output.used:
            return
        statement = f"{kind} {module} {alias.name} as {alias.asname}"
        if bound in self.output.defined and self.output.defined[bound][1] != statement:
            where = self.output.defined[bound][0]
            raise SystemExit(f"{self._where(node)} binds {bound!r}, which {where} binds to something else: one "
                             "generated file cannot hold both; import it under the same name")  # fmt: skip
        self.output.defined.setdefault(bound, (self.module.label, statement))
        self.output.absolute.setdefault((kind, module), {})[alias.name] = alias.asname

    def rewrite(self) -> str:
        body = self.module.tree.body
        for index, node in enumerate(body):
            start, end = self._statement_span(node)
            if index == 0 and isinstance(node, ast.Expr) and isinstance(getattr(node, "value", None), ast.Constant):
                continue  # the module's docstring stays, under the rule naming its file
            elif isinstance(node, (ast.Import, ast.ImportFrom)) and not getattr(node, "level", 0):
                self._hoist(node)
                self.edits.append((start, end, ""))
            elif isinstance(node, ast.ImportFrom):
                self.edits.append((start, end, self._replacement_for_relative(node, "", nested=False)))
                for alias in node.names:
                    if alias.asname:
                        self._define(alias.asname, node)
            elif isinstance(node, ast.Assign) and _bound_names(node) == ["__all__"]:
                self.edits.append((start, end, ""))
            elif id(node) in self.output.left_out:
                self.edits.append((self._leading_comments(node), end, ""))
            else:
                keep = True
                for name in _bound_names(node):
                    keep = self._define(name, node) and keep
                if not keep:
                    self.edits.append((start, end, ""))
        self._nested_relative_imports()
        if self.stringify:
            self._stringify_annotations()
        return self._apply()

    def _nested_relative_imports(self) -> None:
        """Relative imports inside functions or ``if`` blocks: removed (``pass`` where a block would be empty)."""
        for parent in ast.walk(self.module.tree):
            for attribute in ("body", "orelse", "finalbody", "handlers"):
                block = getattr(parent, attribute, None)
                if parent is self.module.tree or not isinstance(block, list):
                    continue
                relative = [n for n in block if isinstance(n, ast.ImportFrom) and n.level]
                for node in relative:
                    start, end = self._statement_span(node)
                    indent = " " * node.col_offset
                    replacement = self._replacement_for_relative(node, indent, nested=True)
                    if not replacement and len(relative) == len(block) and node is block[0]:
                        replacement = f"{indent}pass  # its names are defined in this file\n"
                    self.edits.append((start, end, replacement))

    def _stringify_annotations(self) -> None:
        """``from __future__ import annotations`` kept by hand: every annotation that Python evaluates becomes a
        string literal (a local variable's, inside a function, is never evaluated)."""
        local = {id(inner) for function in ast.walk(self.module.tree)
                 if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef))
                 for inner in ast.walk(function) if isinstance(inner, ast.AnnAssign)}  # fmt: skip
        for node in ast.walk(self.module.tree):
            annotations = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                arguments = node.args
                every = [*arguments.posonlyargs, *arguments.args, *arguments.kwonlyargs, arguments.vararg,
                         arguments.kwarg]  # fmt: skip
                annotations = [a.annotation for a in every if a is not None and a.annotation is not None]
                annotations += [node.returns] if node.returns is not None else []
            elif isinstance(node, ast.AnnAssign) and id(node) not in local:
                annotations = [node.annotation]
            for annotation in annotations:
                if not (isinstance(annotation, ast.Constant) and isinstance(annotation.value, str)):
                    start, end = self._span(annotation)
                    text = ast.unparse(annotation)
                    self.edits.append((start, end, f'"{text}"' if '"' not in text else repr(text)))

    def _apply(self) -> str:
        source = self.module.source
        for start, end, replacement in sorted(self.edits, key=lambda edit: edit[0], reverse=True):
            source = source[:start] + replacement + source[end:]
        while "\n\n\n\n" in source:
            source = source.replace("\n\n\n\n", "\n\n\n")
        return source.strip("\n") + "\n"


def _import_block(output: Output) -> str:
    """The gathered absolute imports, standard library first (isort's sections), then the configuration file's
    names for the modeling file."""
    sections: dict[bool, list[str]] = {True: [], False: []}
    for (kind, module), names in output.absolute.items():
        if kind == "import":
            for name, asname in names.items():
                line = f"import {name}" + (f" as {asname}" if asname else "")
                sections[name.split(".")[0] in sys.stdlib_module_names].append(line)
            continue
        parts = [name + (f" as {asname}" if asname else "") for name, asname in sorted(names.items())]
        line = f"from {module} import {', '.join(parts)}"
        if len(line) > 120:
            line = f"from {module} import (\n{_packed(parts)})"
        sections[module.split(".")[0] in sys.stdlib_module_names].append(line)
    blocks = ["\n".join(sorted(sections[True], key=_import_sort_key)),
              "\n".join(sorted(sections[False], key=_import_sort_key))]  # fmt: skip
    if output.from_config:
        parts = [name + (f" as {asname}" if asname else "") for name, asname in sorted(output.from_config.items())]
        blocks.append(f"from .{CONFIG_FILE} import (\n{_packed(parts)})")
    return "\n\n".join(block for block in blocks if block)


def _packed(names: list[str], width: int = 120) -> str:
    """``names`` as the lines of a parenthesized import, as many to a line as fit (isort's grid)."""
    lines = [""]
    for name in names:
        if lines[-1] and len(f"    {lines[-1]} {name},") > width:
            lines.append("")
        lines[-1] += f" {name}," if lines[-1] else f"{name},"
    return "".join(f"    {line}\n" for line in lines)


def _import_sort_key(line: str) -> tuple[int, str]:
    """``import x`` lines before ``from x import`` lines, each by module (isort's default)."""
    return (0 if line.startswith("import ") else 1, line.split()[1].lower())


def render(
    name: str,
    inlined: list[str],
    modules: dict[str, Module],
    imported_from_config: set[str],
    family: str = "",
    shaken: tuple[set[int], set[str]] | None = None,
) -> str:
    """The text of generated file ``name``: the modules ``inlined``, less ``shaken``'s nodes and unused imports (the
    result of ``unreached``; None: every statement)."""
    left_out, used = shaken or (set(), None)
    output = Output(name, inlined, imported_from_config, left_out=left_out, used=used)
    future = all(modules[module].has_future for module in inlined)
    sections = []
    for module_name in inlined:
        module = modules[module_name]
        stringify = module.has_future and not future
        text = Inliner(module, output, modules, stringify).rewrite()
        body = module.tree.body[1:] if ast.get_docstring(module.tree) is not None else module.tree.body
        if shaken and not any(id(node) not in left_out and not isinstance(node, (ast.Import, ast.ImportFrom))
                              and _bound_names(node) != ["__all__"] for node in body):  # fmt: skip
            continue  # nothing of it is reached: not even its docstring travels
        rule = f"# {'-' * 30} {module.label} {'-' * max(3, 80 - len(module.label))}"
        sections.append(f"{rule}\n{text}")
    header = [
        f"# {name}.py: GENERATED from the hf_tiednorm package by utils/generate_remote_code.py"
        " (--check: is it current?). Do not edit it.",
        "# The remote code of a saved hf_tiednorm model (what `from_pretrained(..., trust_remote_code=True)` runs)"
        + (f" of the family {family!r}" if family else "")
        + f": {len(inlined)} package modules, in dependency order, each under a rule naming its file.",
        "# ruff: noqa: E402, E501, I001",
    ]
    parts = ["\n".join(header)]
    if future:
        parts.append(FUTURE)
    parts.append(_import_block(output))
    return "\n\n".join(parts) + "\n\n\n" + "\n\n".join(sections)


def generate() -> dict[str, str]:
    """``{"<family>/<file name>": text}`` of every family's two generated files."""
    modules = read_modules()
    files = {}
    for family, (config_class, model_classes) in family_classes().items():
        config_modules = closure([config_class.__module__], modules)
        model_roots = list(dict.fromkeys(model.__module__ for model in model_classes))
        model_modules = [name for name in closure(model_roots, modules) if name not in config_modules]
        model_shaken = unreached(model_modules, modules, {model.__name__ for model in model_classes})
        config_shaken = unreached(config_modules, modules, {config_class.__name__} | model_shaken[1])
        files[f"{family}/{CONFIG_FILE}.py"] = render(CONFIG_FILE, config_modules, modules, set(), family, config_shaken)
        modeling = render(MODELING_FILE, model_modules, modules, set(config_modules), family, model_shaken)
        files[f"{family}/{MODELING_FILE}.py"] = modeling
    return files


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail (exit 1) when a generated file is stale")
    options = parser.parse_args(argv)
    stale = []
    for name, text in generate().items():
        path = OUTPUT / name
        compile(text, str(path), "exec")  # a generated file that does not parse is the generator's bug
        if path.is_file() and path.read_text() == text:
            continue
        if options.check:
            stale.append(str(path))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path} ({len(text.splitlines())} lines)")
    expected = {OUTPUT / name for name in generate()} if not stale else set()
    for path in sorted(OUTPUT.rglob("*.py")) if OUTPUT.is_dir() else []:
        if path not in expected and not stale:  # a file no row generates any more (a family removed or renamed)
            if options.check:
                stale.append(f"{path} (no family generates it)")
            else:
                path.unlink()
                print(f"removed {path}")
    if stale:
        print(f"stale: {', '.join(stale)}; run `python utils/generate_remote_code.py`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
