"""No import cycles inside the packages (ninfer, its api, actors and perf packages).

The graph: module A -> module B when A imports B anywhere in its source (module level or inside a function: a
deferred import is still a dependency), except under ``if TYPE_CHECKING:`` (annotations only, never executed).
``from P import x`` is an edge to the submodule ``P.x`` when there is one, else to the package ``P``. A package's
``__init__`` running before its submodules is not an edge (importing ``a.b.c`` depends on ``a.b.c``, not on every
sibling ``a/b/__init__.py`` re-exports), so the test checks the dependencies the code states.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _package_dirs(repo: Path) -> dict[str, Path]:
    conf = tomllib.loads((repo / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    return {pkg: repo / d for pkg, d in conf.items() if any((repo / d).glob("*.py"))}


def _modules(dirs: dict[str, Path]) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package ``__init__``) for every .py file of the packages."""
    out: dict[str, tuple[Path, bool]] = {}
    for pkg, root in dirs.items():
        for f in root.rglob("*.py"):
            parts = f.relative_to(root).with_suffix("").parts
            if any(p.startswith(".") or p == "__pycache__" for p in parts):
                continue
            is_pkg = parts[-1] == "__init__"
            name = ".".join((pkg, *parts[:-1])) if is_pkg else ".".join((pkg, *parts))
            # a nested package directory maps under its parent unless pyproject maps it itself
            out.setdefault(name, (f, is_pkg))
    return out


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skip.update(id(n) for stmt in node.body for n in ast.walk(stmt))
    return skip


def import_graph(dirs: dict[str, Path]) -> dict[str, set[str]]:
    mods = _modules(dirs)
    graph: dict[str, set[str]] = {}
    for name, (path, is_pkg) in mods.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        skip = _type_checking_nodes(tree)
        here = name if is_pkg else name.rpartition(".")[0]
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    pkg = here
                    for _ in range(node.level - 1):
                        pkg = pkg.rpartition(".")[0]
                    base = f"{pkg}.{node.module}" if node.module else pkg
                targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in mods else base for a in node.names]
            else:
                continue
            for t in targets:
                while t and t not in mods:  # ``import a.b.c`` of a module outside the packages: dropped
                    t = t.rpartition(".")[0]
                if t and t != name:
                    deps.add(t)
        graph[name] = deps
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
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
                    found.append(sorted(comp))
    return found


def test_no_import_cycles_inside_the_packages() -> None:
    dirs = _package_dirs(REPO)
    assert {"ninfer", "ninfer.api", "ninfer.actors"} <= set(dirs)
    graph = import_graph(dirs)
    assert (
        len(graph) > 100 and {"ninfer.engine.core", "ninfer.model"} <= graph["ninfer.actors._engine_adapter"]
    )
    assert cycles(graph) == [], "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles(graph))


def test_the_cycle_finder_finds_cycles(tmp_path: Path) -> None:
    """A deferred import, a relative one and a ``from pkg import submodule`` all close cycles; TYPE_CHECKING
    imports do not."""
    pkg = tmp_path / "p"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from p.sub import b\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "b.py").write_text("from .. import a\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from p import d\n")
    (pkg / "d.py").write_text("import p.c\n")
    assert cycles(import_graph({"p": pkg})) == [["p.a", "p.sub.b"]]
