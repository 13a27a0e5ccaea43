"""Tests of the import graph of sample_fc/, read from the source with `ast` (every import
statement, lazy ones inside functions included): it has no cycle, and the checkpoint package
does not load the head kernels."""
import ast
from pathlib import Path

from conftest import REPO

HEAD_KERNELS = ("sample_fc.head", "sample_fc.host_head", "sample_fc.softmax", "sample_fc.module",
                "sample_fc.memory_plan")


def module_files(root):
    """{dotted module name: path} of every .py file under the package directory `root`."""
    root = Path(root)
    files = {}
    for path in sorted(root.rglob("*.py")):
        parts = (root.name,) + path.relative_to(root).with_suffix("").parts
        files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return files


def imported_modules(name, path, known):
    """The modules of `known` that the file `path` of module `name` imports anywhere in it:
    relative imports resolved, `from PACKAGE import x` counted as the submodule x when
    there is one, else as PACKAGE."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[:len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base
                       for alias in node.names]
        else:
            continue
        for target in targets:
            while target and target not in known:      # `import a.b.c` of a non-module c: a.b
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(root):
    """{module: set of modules it imports} for the package directory `root`."""
    files = module_files(root)
    return {name: imported_modules(name, path, files) for name, path in files.items()}


def find_cycle(graph):
    """One cycle of `graph` as [a, b, ..., a], or None when it has none (depth-first search)."""
    done, path = set(), []

    def visit(node):
        if node in path:
            return path[path.index(node):] + [node]
        if node in done:
            return None
        path.append(node)
        for successor in sorted(graph.get(node, ())):
            cycle = visit(successor)
            if cycle:
                return cycle
        path.pop()
        done.add(node)
        return None

    for start in sorted(graph):
        cycle = visit(start)
        if cycle:
            return cycle
    return None


def reachable(graph, start):
    """Every module `start` imports, directly or through others."""
    seen, todo = set(), [start]
    while todo:
        for successor in graph.get(todo.pop(), ()):
            if successor not in seen:
                seen.add(successor)
                todo.append(successor)
    return seen


def test_the_graph_reader_and_cycle_finder_see_a_hand_made_cycle(tmp_path):
    """Test that a lazy `from . import b` and a `from .sub import c` of a hand-made package are
    edges, that the cycle through them is found and named, and that an acyclic graph has none."""
    package = tmp_path / "pkg"
    (package / "sub").mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sub" / "__init__.py").write_text("")
    (package / "a.py").write_text("import os\n\ndef f():\n    from . import b\n    return b\n")
    (package / "b.py").write_text("from .sub.c import g\n")
    (package / "sub" / "c.py").write_text("from ..a import f\nfrom .. import sub\n")
    graph = import_graph(package)
    assert graph == {"pkg": set(), "pkg.sub": set(), "pkg.a": {"pkg.b"}, "pkg.b": {"pkg.sub.c"},
                     "pkg.sub.c": {"pkg.a", "pkg.sub"}}
    assert find_cycle(graph) == ["pkg.a", "pkg.b", "pkg.sub.c", "pkg.a"]
    assert reachable(graph, "pkg.b") == {"pkg.a", "pkg.b", "pkg.sub", "pkg.sub.c"}
    del graph["pkg.sub.c"]
    assert find_cycle(graph) is None


def test_the_import_graph_of_sample_fc_has_no_cycle():
    """Test that the import graph of sample_fc/ has no cycle (lazy imports count: a cycle
    through one works only while the import happens late enough)."""
    graph = import_graph(REPO / "sample_fc")
    assert "sample_fc.checkpoint.layout" in graph and graph["sample_fc.dist"]     # the reader sees the package
    cycle = find_cycle(graph)
    assert cycle is None, "import cycle: " + " -> ".join(cycle)


def test_the_checkpoint_package_imports_no_head_kernel():
    """Test that the transitive imports of sample_fc.checkpoint exclude the head kernels
    (head, host_head, softmax, module, memory_plan): saving a checkpoint loads none of them."""
    graph = import_graph(REPO / "sample_fc")
    imported = reachable(graph, "sample_fc.checkpoint")
    assert "sample_fc.checkpoint.layout" in imported
    assert not imported & set(HEAD_KERNELS), f"sample_fc.checkpoint imports {sorted(imported & set(HEAD_KERNELS))}"
