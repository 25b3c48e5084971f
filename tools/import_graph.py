"""Figures of dynemb's import graph: cycles, imports of the front, function-level imports.

Usage: python tools/import_graph.py [--list]

The front is dynemb/__init__.py and DynamicEmb's module paths (FRONT): they only
re-export, and no other module of dynemb imports them. Imports under TYPE_CHECKING do
not count. --list prints every offending import, not only the counts.
"""

import argparse
import ast
import pathlib

import grimp

ROOT = pathlib.Path(__file__).resolve().parent.parent

FRONT = (
    "dynemb",
    "dynemb.batched_dynamicemb_tables",
    "dynemb.dump_load",
    "dynemb.incremental_dump",
    "dynemb.get_planner",
    "dynemb.embedding_admission",
    "dynemb.dynamicemb_config",
    "dynemb.types",
    "dynemb.utils",
    "dynemb.optimizer",
    "dynemb.shard",
    "dynemb.planner",
)

# The TBE module classes: a walk over a model finds them by protocol, not by class.
TBE_CLASSES = ("BatchedDynamicEmbeddingTables", "BatchedDynamicEmbeddingTablesV2")


def cycles(graph) -> list[set[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []
    counter = 0
    for root in sorted(graph.modules):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.find_modules_directly_imported_by(root))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append(
                        (child, iter(sorted(graph.find_modules_directly_imported_by(child))))
                    )
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def front_imports(graph) -> list[tuple[str, str]]:
    """(importer, front module) for every import of the front by a module behind it."""
    return sorted(
        (importer, front)
        for front in FRONT
        for importer in graph.find_modules_that_directly_import(front)
        if importer not in FRONT
    )


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def function_imports() -> list[tuple[str, int, str]]:
    """(file, line, imported module) for every import inside a function of dynemb/."""
    found = []
    for path in sorted((ROOT / "dynemb").rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))

        def visit(node, in_function, path=path):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.If) and _is_type_checking(child):
                    continue
                if in_function and isinstance(child, ast.Import):
                    for alias in child.names:
                        found.append((str(path.relative_to(ROOT)), child.lineno, alias.name))
                elif in_function and isinstance(child, ast.ImportFrom):
                    name = "." * child.level + (child.module or "")
                    found.append((str(path.relative_to(ROOT)), child.lineno, name))
                visit(
                    child,
                    in_function
                    or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)),
                )

        visit(tree, False)
    return found


def tbe_isinstance() -> list[tuple[str, int]]:
    """(file, line) of every isinstance / issubclass check against a TBE module class."""
    found = []
    for path in sorted((ROOT / "dynemb").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in ("isinstance", "issubclass")
                and len(node.args) == 2
                and any(
                    isinstance(n, ast.Name)
                    and n.id in TBE_CLASSES
                    or isinstance(n, ast.Attribute)
                    and n.attr in TBE_CLASSES
                    for n in ast.walk(node.args[1])
                )
            ):
                found.append((str(path.relative_to(ROOT)), node.lineno))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--list", action="store_true", help="print every offending import")
    args = parser.parse_args()
    graph = grimp.build_graph("dynemb", exclude_type_checking_imports=True, cache_dir=None)
    found = cycles(graph)
    front = front_imports(graph)
    local = function_imports()
    internal = [entry for entry in local if entry[2].startswith(("dynemb", "."))]
    checks = tbe_isinstance()
    print(f"modules: {len(graph.modules)}")
    print(
        f"import cycles (strongly connected components): {len(found)}, sizes {sorted(map(len, found), reverse=True)}"
    )
    print(
        f"imports of the front by other modules: {len(front)} from {len({i for i, _ in front})} modules"
    )
    print(f"function-level imports: {len(local)} ({len(internal)} of dynemb's own modules)")
    print(f"isinstance/issubclass on TBE module classes: {len(checks)}")
    if args.list:
        for component in found:
            print("cycle:", " ".join(sorted(component)))
        for importer, imported in front:
            print(f"front import: {importer} -> {imported}")
        for file, line, name in local:
            print(f"function-level import: {file}:{line} {name}")
        for file, line in checks:
            print(f"isinstance: {file}:{line}")


if __name__ == "__main__":
    main()
