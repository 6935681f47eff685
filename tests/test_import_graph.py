"""No import circle in kvbench, counting every import an AST walk finds: module-level, ``TYPE_CHECKING``-only and
inside functions (import-linter's contracts see the first two; a lazy import inside a function is a dependency
all the same)."""

from __future__ import annotations

import ast
from pathlib import Path

import kvbench

ROOT = Path(kvbench.__file__).parent


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """Module name -> the kvbench modules it imports (``from kvbench.x import y`` counts as ``kvbench.x.y`` where
    that is a module, else ``kvbench.x``)."""
    mods = {}
    for p in root.rglob("*.py"):
        parts = ("kvbench",) + p.relative_to(root).with_suffix("").parts
        mods[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    graph: dict[str, set[str]] = {}
    for name, p in mods.items():
        deps: set[str] = set()
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = name.split(".")[: len(name.split(".")) - node.level + (p.name == "__init__.py")]
                    base = ".".join(pkg + ([base] if base else []))
                deps.update(f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names)
        graph[name] = {d for d in deps if d in mods and d != name}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_walk_finds_a_circle_it_is_shown():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_the_graph_sees_type_only_and_function_level_imports():
    graph = import_graph()
    assert "kvbench.bench.roles" in graph["kvbench.bench.plans.sweep"]  # module level
    assert "kvbench.bench.executors.local" in graph["kvbench.bench.run"]  # inside a function
    assert "kvbench.models" in graph["kvbench.scenario.checks"]  # inside a function, through the package


def test_kvbench_has_no_import_circle():
    assert circles(import_graph()) == []
