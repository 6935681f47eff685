"""Every cross-reference in kvbench's docstrings and comments names something that exists: a Sphinx role
(:class:`X`, :func:`mod.f`, :meth:`A.b`, :attr:`A.x`, :data:`X`, :mod:`kvbench.x`) or a double-backticked
``kvbench.<dotted name>``. Each is resolved by importing the module it is in and walking attributes, as Sphinx's
Python domain looks it up: in the class it is written in (inner to outer), in its module (names it defines or
imports), in builtins, then as an absolute dotted name (the longest module prefix that imports, then attributes).
A leading ``~`` only shortens the shown text; a leading ``!`` asks for no link and is not checked."""

from __future__ import annotations

import ast
import builtins
import contextlib
import functools
import importlib
import importlib.util
import inspect
import pkgutil
import re
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

import kvbench

#: A Sphinx role and its target, e.g. :func:`~kvbench.results.load.load_results`, or a title and the target in
#: angle brackets, e.g. :meth:`Engine.session <kvbench.bench.engines.base.Engine.session>`.
ROLE = re.compile(r":(class|func|meth|attr|data|mod|exc|obj|const):`(?:[^`<]*<)?([^`<>]+)>?`")
#: A double-backticked dotted kvbench name, e.g. ``kvbench.cli``.
LITERAL = re.compile(r"``(kvbench(?:\.[A-Za-z_]\w*)+)``")


@dataclass(frozen=True)
class Ref:
    """One reference: the module it is written in, its line, the role (``literal`` for ``kvbench.x``), the target."""

    module: str
    line: int
    role: str
    target: str

    def __str__(self) -> str:
        return f"{self.module}, line {self.line}: :{self.role}:`{self.target}`"


def _classes_at(tree: ast.Module) -> list[tuple[int, int, list[str]]]:
    """(first line, last line, qualified name parts) of every class in ``tree``, outer before inner."""
    spans: list[tuple[int, int, list[str]]] = []

    def visit(node: ast.AST, outer: list[str]) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                spans.append((child.lineno, child.end_lineno or child.lineno, [*outer, child.name]))
                visit(child, [*outer, child.name])
            elif isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                visit(child, outer)

    visit(tree, [])
    return spans


def refs_in(source: str, module: str) -> list[tuple[Ref, list[str]]]:
    """The references in ``source`` (the text of ``module``), each with the qualified name of the innermost class
    it is written in ([] at module level). The text is searched whole: a role or a double-backticked name only
    occurs in a docstring, a comment or another string."""
    spans = _classes_at(ast.parse(source))
    matches = [(m.group(1), m.group(2), m.start()) for m in ROLE.finditer(source)]
    matches += [("literal", m.group(1), m.start()) for m in LITERAL.finditer(source)]
    found = []
    for role, target, start in sorted(matches, key=lambda m: m[2]):
        line = source.count("\n", 0, start) + 1
        inside = [parts for first, last, parts in spans if first <= line <= last]
        found.append((Ref(module, line, role, target.strip()), inside[-1] if inside else []))
    return found


def _member(obj: object, name: str) -> tuple[bool, object]:
    """Whether ``obj`` has ``name``, and its value: an attribute, or for a class a field declared by annotation
    (dataclass, pydantic, NamedTuple) or an instance attribute its methods set (``self.name = ...``)."""
    with contextlib.suppress(AttributeError):
        return True, getattr(obj, name)
    if isinstance(obj, types.ModuleType):
        return name in getattr(obj, "__annotations__", {}), None
    if isinstance(obj, type):
        for cls in obj.__mro__:
            if name in vars(cls).get("__annotations__", {}) or name in getattr(cls, "model_fields", {}):
                return True, None
            if name in _set_on_self(cls):
                return True, None
    return False, None


@functools.cache
def _tree(path: str) -> ast.Module:
    return ast.parse(Path(path).read_text(encoding="utf-8"))


@functools.cache
def _set_on_self(cls: type) -> set[str]:
    """The attributes the methods of ``cls`` assign on ``self`` (``self.x = …``, ``self.a, self.b = …``,
    ``self.x: T = …``), read from its module's source; empty for a class not of kvbench."""
    if not cls.__module__.startswith("kvbench"):
        return set()
    node: ast.AST | None = _tree(inspect.getsourcefile(cls))
    for name in cls.__qualname__.split("."):
        node = next((n for n in getattr(node, "body", []) if isinstance(n, ast.ClassDef) and n.name == name), None)
    if node is None:
        return set()
    targets = [t for n in ast.walk(node) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign))
               for t in (n.targets if isinstance(n, ast.Assign) else [n.target])]
    names = [e for t in targets for e in (t.elts if isinstance(t, ast.Tuple) else [t])]
    return {e.attr for e in names if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name)
            and e.value.id == "self"}


def _walk(obj: object, parts: list[str]) -> bool:
    for name in parts:
        ok, obj = _member(obj, name)
        if not ok:
            return False
    return True


def _absolute(parts: list[str]) -> bool:
    """``parts`` as a dotted name from the top: the longest prefix that imports as a module, then attributes."""
    for i in range(len(parts), 0, -1):
        try:
            module = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        return _walk(module, parts[i:])
    return False


def resolves(ref: Ref, cls: list[str]) -> bool:
    """Whether ``ref`` names something: in class ``cls`` of its module (inner to outer), in the module, in
    builtins, or as an absolute name; one with a leading dot (``.schema``) from the package the module is in."""
    target = ref.target.lstrip("~").removesuffix("()")
    if target.startswith("!"):
        return True
    module = importlib.import_module(ref.module)
    if target.startswith("."):  # relative to the package the module is in (or is)
        package = ref.module if hasattr(module, "__path__") else module.__package__
        return _absolute(importlib.util.resolve_name(target, package).split("."))
    parts = target.split(".")
    if ref.role in ("mod", "literal"):
        return _absolute(parts)
    scopes: list[object] = []
    for depth in range(len(cls), 0, -1):
        ok, found = True, module
        for name in cls[:depth]:
            ok, found = _member(found, name)
        if ok:
            scopes.append(found)
    scopes += [module, builtins]
    return any(_walk(scope, parts) for scope in scopes) or _absolute(parts)


def _modules() -> list[tuple[str, Path]]:
    """Every module of kvbench (``__main__`` modules aside: importing one runs the command) and its file."""
    root = Path(kvbench.__file__).parent
    found = [("kvbench", root / "__init__.py")]
    for info in pkgutil.walk_packages(kvbench.__path__, "kvbench."):
        if info.name.rpartition(".")[2] == "__main__":
            continue
        rel = Path(*info.name.split(".")[1:])
        found.append((info.name, root / rel / "__init__.py" if info.ispkg else root / rel.with_suffix(".py")))
    return found


def all_refs() -> list[tuple[Ref, list[str]]]:
    """Every reference in kvbench, with the class it is written in."""
    return [r for name, path in _modules() for r in refs_in(path.read_text(encoding="utf-8"), name)]


def test_every_docstring_reference_names_something_that_exists():
    refs = all_refs()
    assert len(refs) > 1000  # the scan finds them: roles in docstrings, #: comments and comments
    stale = [str(ref) for ref, cls in refs if not resolves(ref, cls)]
    assert not stale, "references to nothing:\n" + "\n".join(stale)


SAMPLE = '''"""See :func:`helper`, :class:`~kvbench.errors.BadParameter` and ``kvbench.cli``."""
import os


def helper():
    """:func:`os.path.join`, :mod:`kvbench.report` and :func:`!not_checked`."""


class Box:
    """:attr:`size` and :meth:`Box.open`; :meth:`close` does not exist."""

    size: int

    def open(self):
        self.lid, self.hinge = 1, 2  # :attr:`lid` and :attr:`hinge` are set here; :data:`kvbench.nothing` is not

#: :class:`KeyboardInterrupt` is a builtin; :func:`kvbench.results.load.no_such` is gone.
'''


def test_the_resolver_finds_what_exists_and_only_that(tmp_path, monkeypatch):
    (tmp_path / "kvbench_sample.py").write_text(SAMPLE)
    monkeypatch.syspath_prepend(str(tmp_path))
    refs = refs_in(SAMPLE, "kvbench_sample")
    assert [(r.line, r.role, r.target, cls) for r, cls in refs] == [
        (1, "func", "helper", []), (1, "class", "~kvbench.errors.BadParameter", []), (1, "literal", "kvbench.cli", []),
        (6, "func", "os.path.join", []), (6, "mod", "kvbench.report", []), (6, "func", "!not_checked", []),
        (10, "attr", "size", ["Box"]), (10, "meth", "Box.open", ["Box"]), (10, "meth", "close", ["Box"]),
        (15, "attr", "lid", ["Box"]), (15, "attr", "hinge", ["Box"]), (15, "data", "kvbench.nothing", ["Box"]),
        (17, "class", "KeyboardInterrupt", []), (17, "func", "kvbench.results.load.no_such", []),
    ]
    stale = [r.target for r, cls in refs if not resolves(r, cls)]
    assert stale == ["close", "kvbench.nothing", "kvbench.results.load.no_such"]


@pytest.mark.parametrize("text, targets", [
    ("# :func:`a.b` then :class:`C`", ["a.b", "C"]),
    ('x = "``kvbench.report.write`` and ``kvbench --help``"', ["kvbench.report.write"]),
    ("# :ref:`a label` and `kvbench.x` in single backticks are not references", []),
    ("# :meth:`Engine.session <kvbench.bench.x.Engine.session>` (a title)", ["kvbench.bench.x.Engine.session"]),
])
def test_the_scan_reads_roles_and_double_backticked_kvbench_names(text, targets):
    assert [r.target for r, _ in refs_in(text + "\n", "m")] == targets
