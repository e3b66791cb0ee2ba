"""The project's shape, read from its own imports (module level and inside functions): the
layers, declared once below, with every import pointing down them; no import cycles; no
private name taken across modules; the core never importing Ray, and reaching the actors
only from the entry points, inside the functions that start them."""
import ast
import pathlib
import re

import raytune_kernels

CORE = pathlib.Path(raytune_kernels.__file__).parent
ROOT = CORE.parent
ROOT_PACKAGE = "raytune_kernels"  # as a layer entry: the package's __init__ alone
# Bottom to top, as docs/architecture.md ("Layers") lists them. A module may import the
# modules of its own layer and of the layers below, never one above. An entry names a
# module and, when it is a package, every module inside it (the root package excepted).
LAYERS = [
    {"raytune_kernels.errors", "raytune_kernels.version", "raytune_kernels.precision",
     "raytune_kernels.target", "raytune_kernels.task", "raytune_kernels.cache",
     "raytune_kernels.placement", "raytune_kernels.timing"},
    {"raytune_kernels.frontend"},
    {"raytune_kernels.space", "raytune_kernels.measure"},
    {"raytune_kernels.cpu", "raytune_kernels.cuda"},
    {"raytune_kernels.layout"},
    {"raytune_kernels.backend"},
    {"raytune_kernels.tune"},
    {"raytune_kernels.compile"},
    {"actors"},
    {ROOT_PACKAGE, "raytune_kernels.cli", "raytune_kernels.__main__", "raytune_kernels.zoo"},
]
BACKENDS = ("raytune_kernels.cpu", "raytune_kernels.cuda")  # one layer, neither imports the other


def _modules(packages=("raytune_kernels", "actors")) -> dict[str, pathlib.Path]:
    out = {}
    for package in packages:
        for p in (ROOT / package).rglob("*.py"):
            parts = p.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = p
    return out


def _names(entry: str, module: str) -> bool:
    return module == entry or (entry != ROOT_PACKAGE and module.startswith(entry + "."))


def _layer(module: str, layers=LAYERS) -> int:
    """The index of the one layer naming `module`."""
    found = [i for i, layer in enumerate(layers) for entry in layer if _names(entry, module)]
    assert len(found) == 1, f"{module} is named by {len(found)} layer entries, not one"
    return found[0]


def _upward(edges: dict[str, set[str]], layers=LAYERS) -> list[str]:
    return [f"{m} (layer {_layer(m, layers)}) imports {d} (layer {_layer(d, layers)})"
            for m, deps in sorted(edges.items()) for d in sorted(deps)
            if _layer(d, layers) > _layer(m, layers)]


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


def test_every_module_sits_on_one_layer():
    mods = _modules()
    assert {_layer(m) for m in mods} == set(range(len(LAYERS)))  # and every layer is used


def test_no_module_imports_one_on_a_higher_layer():
    """Module-level imports and those inside functions alike: a lazy import still runs."""
    assert _upward(_edges()) == []


def test_an_upward_import_would_be_found():
    layers = [{"p.low"}, {"p.high", ROOT_PACKAGE}]
    edges = {"p.low.a": {"p.high.b"}, "p.high.b": {"p.low"}, ROOT_PACKAGE: {"p.low.a"}}
    assert _upward(edges, layers) == ["p.low.a (layer 0) imports p.high.b (layer 1)"]
    assert _layer("raytune_kernels", LAYERS) == len(LAYERS) - 1
    assert _layer("raytune_kernels.tune.records", LAYERS) == 6


def test_the_architecture_doc_lists_the_same_layers():
    """docs/architecture.md's "Layers": one numbered item per layer, bottom to top, its
    modules in backquotes before the first colon."""
    text = (ROOT / "docs" / "architecture.md").read_text().split("## Layers", 1)[1]
    items = re.findall(r"^\d+\. (.*?)(?=^\d+\. |^$)", text, re.M | re.S)

    def module(name: str) -> str:
        if name == "raytune_kernels/__init__.py":
            return ROOT_PACKAGE
        name = name.rstrip("/")
        return name if name == "actors" else f"raytune_kernels.{name}"
    documented = [{module(n) for n in re.findall(r"`([^`]+)`", item.split(":", 1)[0])}
                  for item in items]
    assert documented == LAYERS


def test_the_two_backends_never_import_each_other():
    crossing = [(m, d) for m, deps in _edges().items() for d in deps
                for mine, other in (BACKENDS, BACKENDS[::-1])
                if _names(mine, m) and _names(other, d)]
    assert crossing == []


def test_a_cycle_would_be_found():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_private_name_crosses_modules():
    taken = [(m, base, n) for m, p in _modules().items() for base, names, _ in _imports(m, p)
             if base.split(".")[0] in ("raytune_kernels", "actors") for n in names
             if n.startswith("_") and not n.startswith("__")]
    assert taken == []


def test_the_core_never_imports_ray_and_reaches_the_actors_only_lazily_from_the_top():
    """Checked on every import, those inside functions too (what runs after a real run):
    below the actors' layer nothing imports them; the entry points above it import the
    driver inside the functions that start it, so `import raytune_kernels` stays light."""
    found = [(m, base, top) for m, p in _modules(("raytune_kernels",)).items()
             for base, _, top in _imports(m, p) if base.split(".")[0] in ("ray", "actors")]
    assert all(base == "actors.driver" and not top and _layer(m) == len(LAYERS) - 1
               for m, base, top in found), found
    assert {m for m, _, _ in found} == {ROOT_PACKAGE}  # tune_network, tune_tasks, ...


def test_every_project_name_imported_anywhere_exists():
    """Imports inside functions run only on their path: a GPU-only test once imported a
    name its module had lost, and only a machine with a GPU ran it. Every `from
    raytune_kernels / actors / tests ... import name` in the repository must resolve here."""
    import importlib

    root = ROOT
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
