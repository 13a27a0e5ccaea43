"""Tests of the import graph of sample_fc/, read from the source with `ast` (every import
statement, lazy ones inside functions included): it has no cycle, and the checkpoint package
does not load the head kernels."""
import ast
import subprocess
from pathlib import Path

from conftest import REPO

HEAD_KERNELS = ("sample_fc.pfc.head", "sample_fc.pfc.device_head", "sample_fc.module",
                "sample_fc.run.memory_plan")


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
    (head, device_head, softmax, module, memory_plan): saving a checkpoint loads none of them."""
    graph = import_graph(REPO / "sample_fc")
    imported = reachable(graph, "sample_fc.checkpoint")
    assert "sample_fc.checkpoint.layout" in imported
    assert not imported & set(HEAD_KERNELS), f"sample_fc.checkpoint imports {sorted(imported & set(HEAD_KERNELS))}"


# The floors (each subpackage's __init__ docstring is its map): a package may not import the
# packages listed against it, directly or through a module at another level.
FORBIDDEN = {
    "sample_fc.pfc": ("sample_fc.run", "sample_fc.models", "sample_fc.tools",
                      "sample_fc.checkpoint", "sample_fc.data"),
    "sample_fc.data": ("sample_fc.pfc", "sample_fc.run", "sample_fc.models", "sample_fc.tools"),
    "sample_fc.checkpoint": ("sample_fc.run", "sample_fc.models", "sample_fc.tools"),
    "sample_fc.models": ("sample_fc.run", "sample_fc.tools"),
    "sample_fc.run": ("sample_fc.tools",),
}


def _within(module, package):
    return module == package or module.startswith(package + ".")


def layering_violations(graph, forbidden):
    """[(package, module of it, forbidden module it reaches)] for the rules `forbidden`."""
    found = []
    for package, banned in forbidden.items():
        for module in sorted(m for m in graph if _within(m, package)):
            for reached in sorted(reachable(graph, module)):
                if any(_within(reached, other) for other in banned):
                    found.append((package, module, reached))
    return found


def test_the_layering_checker_sees_a_forbidden_import_through_another_module():
    """Test that the layering check finds a package reaching a forbidden one through a module
    at another level, and passes a graph that keeps the rule (guards the guard)."""
    graph = {"pkg.low.a": {"pkg.mid"}, "pkg.mid": {"pkg.high.b"}, "pkg.high.b": set()}
    assert layering_violations(graph, {"pkg.low": ("pkg.high",)}) == [("pkg.low", "pkg.low.a", "pkg.high.b")]
    assert layering_violations(graph, {"pkg.high": ("pkg.low",)}) == []


def test_each_floor_imports_only_the_floors_below_it():
    """Test the layering of sample_fc/: pfc/ imports nothing of run/, models/, tools/, bench/,
    checkpoint/ or data/; data/ nothing of pfc/ and above; checkpoint/ and models/ nothing of the
    run, the tools or the benchmarks; run/ nothing of the tools or the benchmarks (lazy imports
    count)."""
    graph = import_graph(REPO / "sample_fc")
    assert "sample_fc.pfc.partial_fc" in graph and "sample_fc.run.run_events" in graph
    assert layering_violations(graph, FORBIDDEN) == []


def absolute_imports(path):
    """The top-level names of the absolute imports anywhere in the file `path` (lazy ones included)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and not node.level else []
        found.update(name.split(".")[0] for name in names)
    return found


def test_the_package_top_level_keeps_to_twelve_modules_and_never_imports_the_scripts():
    """Test that sample_fc/ holds at most 12 modules beside its subpackages, that no module of
    the package imports the repository's default.py, train.py, optimizer.py or the benchmarks
    (bench/, outside the installed package), that bench/ does not import default.py either (it takes
    the configuration from sample_fc.config; its fuzzer runs train.py's main in its worker), and
    that the card default.py is named in one place only, the presets that read its datasets
    (sample_fc/config/presets.py)."""
    top = sorted(p.stem for p in (REPO / "sample_fc").glob("*.py") if p.name != "__init__.py")
    assert len(top) <= 12, top
    card_readers = []
    for path in (REPO / "sample_fc").rglob("*.py"):
        source = path.read_text()
        if "CARD = 'default'" in source or "import_module('default')" in source:
            card_readers.append(path.relative_to(REPO).as_posix())
        assert not {"default", "train", "optimizer", "bench"} & absolute_imports(path), path
    assert card_readers == ["sample_fc/config/presets.py"]
    bench_files = list((REPO / "bench").rglob("*.py"))
    assert len(bench_files) > 30 and not (REPO / "sample_fc" / "bench").exists()
    assert all("default" not in absolute_imports(path) for path in bench_files)
    assert "train" in set().union(*map(absolute_imports, bench_files))       # the scan sees what it should


PRODUCT_SUFFIXES = (".py", ".sh", ".cc", ".c", ".h")
LINE_LIMIT = 120


def product_files():
    """The repository's own code outside tests/ (git's list: what a clone holds)."""
    listed = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout
    return [name for name in listed.split() if name.endswith(PRODUCT_SUFFIXES) and not name.startswith("tests/")]


def test_no_product_line_is_longer_than_120_characters():
    files = product_files()
    assert "train.py" in files and "scripts/bootstrap.sh" in files and "sample_fc/_mx_ops.cc" in files
    long_lines = [f"{name}:{number}: {len(line)}" for name in files
                  for number, line in enumerate((Path(REPO) / name).read_text().splitlines(), 1)
                  if len(line) > LINE_LIMIT]
    assert not long_lines, long_lines


def string_constants(path):
    """The string literals of the Python file `path` that are not docstrings (a module's, a class's or a
    function's first statement) nor f-string pieces."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree) if isinstance(node, ast.Constant)
            and isinstance(node.value, str) and id(node) not in docstrings]


def test_network_names_are_written_only_in_sample_fc_symbols():
    """Test that no product code outside sample_fc/symbols/ (the library, train.py, the scripts) writes a network's
    name as a string: presets, recipes, measured rows and defaults are the catalog's (docstrings and
    the docs may name them; the benchmarks in bench/ and the tests are not the product)."""
    from sample_fc.symbols.catalog import NETWORKS
    files = [REPO / name for name in product_files() if name.endswith(".py")
             and not name.startswith(("sample_fc/symbols/", "bench/"))]
    assert REPO / "sample_fc" / "run" / "layout.py" in files and REPO / "train.py" in files
    named = {(path.relative_to(REPO).as_posix(), text) for path in files for text in string_constants(path)
             if text in NETWORKS}
    assert not named, sorted(named)
    assert "mbf" in string_constants(REPO / "sample_fc" / "symbols" / "catalog.py")         # the scan sees a name where it is
