"""The package's shape, read from its own imports (module level and inside functions):
no import cycles, no private name taken across modules, and the core never reaching Ray
or the actors except through the two entry points that start them."""
import ast
import pathlib

import raytune_kernels

CORE = pathlib.Path(raytune_kernels.__file__).parent
# the lazy forwards to actors.driver: rk.tune_network / rk.tune_tasks and `tune` of the CLI
ENTRY_POINTS = {"raytune_kernels", "raytune_kernels.cli"}


def _modules() -> dict[str, pathlib.Path]:
    out = {}
    for p in CORE.rglob("*.py"):
        parts = ("raytune_kernels",) + p.relative_to(CORE).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _imports(name: str, path: pathlib.Path):
    """(imported module, imported names, at module level) of every import in a module."""
    tree = ast.parse(path.read_text())
    top = {id(n) for n in tree.body}
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            yield base, [a.name for a in node.names], id(node) in top
        elif isinstance(node, ast.Import):
            for a in node.names:
                yield a.name, [], id(node) in top


def _edges() -> dict[str, set[str]]:
    mods = _modules()
    edges = {m: set() for m in mods}
    for m, p in mods.items():
        for base, names, _ in _imports(m, p):
            for n in names:
                if f"{base}.{n}" in mods:
                    edges[m].add(f"{base}.{n}")
            if base in mods and base != m:
                edges[m].add(base)
    return edges


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(v: str) -> list[str] | None:
        state[v] = 1
        stack.append(v)
        for w in sorted(edges[v]):
            if state.get(w) == 1:
                return stack[stack.index(w):] + [w]
            if w not in state and (found := visit(w)):
                return found
        stack.pop()
        state[v] = 2
        return None

    for v in sorted(edges):
        if v not in state and (found := visit(v)):
            return found
    return None


def test_the_import_graph_is_acyclic():
    edges = _edges()
    assert len(edges) > 60 and _cycle(edges) is None, " -> ".join(_cycle(edges) or [])


def test_a_cycle_would_be_found():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_private_name_crosses_modules():
    taken = [(m, base, n) for m, p in _modules().items() for base, names, _ in _imports(m, p)
             if base.startswith("raytune_kernels") for n in names
             if n.startswith("_") and not n.startswith("__")]
    assert taken == []


def test_the_core_never_imports_ray_or_the_actors():
    """Checked on every import, those inside functions too (what runs after a real run),
    so the one-way rule holds by construction, not only at load time."""
    found = [(m, base, top) for m, p in _modules().items() for base, _, top in _imports(m, p)
             if base.split(".")[0] in ("ray", "actors")]
    assert all(m in ENTRY_POINTS and base == "actors.driver" and not top
               for m, base, top in found), found
    assert {m for m, _, _ in found} == ENTRY_POINTS  # the forwards exist and are lazy


def test_every_project_name_imported_anywhere_exists():
    """Imports inside functions run only on their path: a GPU-only test imported a name
    its module had lost (seen on the first run on an H100). Every `from raytune_kernels /
    actors / tests ... import name` in the repository must resolve here."""
    import importlib

    root = CORE.parent
    files = [p for d in ("raytune_kernels", "actors", "tests", "bench")
             for p in (root / d).rglob("*.py")]
    missing = []
    for p in files:
        for node in ast.walk(ast.parse(p.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and
                    node.module.split(".")[0] in ("raytune_kernels", "actors", "tests")):
                continue
            module = importlib.import_module(node.module)
            for alias in node.names:
                if alias.name == "*" or hasattr(module, alias.name):
                    continue
                try:
                    importlib.import_module(f"{node.module}.{alias.name}")
                except ImportError:
                    missing.append(f"{p.relative_to(root)}: {node.module}.{alias.name}")
    assert len(files) > 100 and missing == []
