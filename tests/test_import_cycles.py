"""No import cycle between any two product modules, at any depth (issue 65, item 7).

import-linter's `acyclic_siblings` contract (pyproject.toml) sees cycles between the sibling modules of a package,
but not one between a package's `__init__` and a module inside it: `data_pipeline/readers/__init__.py` imported
`readers/ranges.py` at the top, and `ranges.split_file` imported the package back inside the function. Such a
cycle works only while the function-level import stays where it is, and it hides which module owns the shared
piece. This test reads the same import graph the lint does (grimp, type-checking imports left out) and fails
naming every cycle, module by module.
"""

from __future__ import annotations

from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "runconfig", "data_pipeline", "pretrain", "adapt", "launch")


def import_cycles(imports: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm, iterative: the graph has
    a few hundred modules), each sorted; a module that imports itself counts as a cycle too."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    for root in sorted(imports):
        if root in index:
            continue
        work = [(root, iter(sorted(imports[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(imports.get(child, ())))))
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
                if len(component) > 1 or node in imports.get(node, ()):
                    cycles.append(sorted(component))
    return sorted(cycles)


def product_imports() -> dict[str, set[str]]:
    graph = grimp.build_graph(
        *PACKAGES, include_external_packages=False, exclude_type_checking_imports=True, cache_dir=None
    )
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def test_the_finder_sees_a_package_and_its_module_importing_each_other():
    """The shape the lint missed: the package imports a module at the top, the module imports the package back."""
    graph = {
        "pkg": {"pkg.ranges", "pkg.base"},
        "pkg.ranges": {"pkg", "pkg.base"},
        "pkg.base": set(),
        "other": {"pkg"},
    }
    assert import_cycles(graph) == [["pkg", "pkg.ranges"]]
    graph["pkg.ranges"] = {"pkg.base"}
    assert import_cycles(graph) == []


def test_no_product_module_is_in_an_import_cycle():
    imports = product_imports()
    assert "data_pipeline.readers.ranges" in imports, "grimp did not read the product packages"
    cycles = import_cycles(imports)
    assert not cycles, (
        "import cycles (move the piece both need into a module that neither imports): "
        + "; ".join(" <-> ".join(c) for c in cycles)
    )
