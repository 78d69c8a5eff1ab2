"""The shape of the code (DESIGN.md, "Layout of the repo"): the package's rooms import along
the flow inputs -> layout -> cost -> search -> their users -> render -> cli, without circles; an
import against the flow is one of the few named here with its reason; imports inside functions
only at the command-line boundary (cli, validate: they keep ``plan3d --help`` fast and torch
optional); functions short enough to read; a layout axis named where it is defined, costed,
ruled, solved, exported and validated, not everywhere. Read from the source with ast."""

from __future__ import annotations

import ast
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "planner"

# (room, module prefixes) in the order of the flow: a module imports from its own room or an
# earlier one. The longest matching prefix decides ("planner" alone: the package's top modules).
ROOMS = [
    ("inputs", ["planner", "planner.errors", "planner.units", "planner.quantities", "planner.fmt",
                "planner.files", "planner.hardware_spec", "planner.framework_spec",
                "planner.checkpoint_spec", "planner.model_schema", "planner.specs",
                "planner.hf_fields", "planner.hf_config", "planner.hf_moe", "planner.catalog",
                "planner.inputs"]),
    ("layout", ["planner.layout", "planner.plan"]),
    ("cost", ["planner.cost", "planner.schedule"]),
    ("search", ["planner.search", "planner.explain", "planner.explain_bands"]),
    ("users", ["planner.frameworks", "planner.placement", "planner.timeline", "planner.fidelity",
               "planner.validate",
               "planner.regress", "planner.baseline", "planner.export", "planner.outputs"]),
    ("render", ["planner.render"]),
    ("cli", ["planner.cli"]),
]
# Imports against the flow, each with why it stays (importer, imported module).
AGAINST_FLOW = {
    ("planner.outputs", "planner.render.console"): "outputs writes the files it renders to stdout",
    ("planner.validate.__main__", "planner.render"): "the validator's own command line prints",
    ("planner.validate.__main__", "planner.render.validate"): "as above",
}
BOUNDARY = ("planner.cli", "planner.validate")  # inner imports allowed (lazy: --help, torch)
MAX_FUNCTION_LINES = 60
AXIS_MODULES = 8  # modules that name one solved layout axis (offload_layers) at most


@lru_cache(maxsize=None)
def _tree(path: Path) -> ast.Module:
    return ast.parse(path.read_text())


@lru_cache(maxsize=None)
def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        name = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = path
    return out


def _imports(name: str, path: Path):
    """(imported module, line, inside a function?) of each planner import of a module."""
    tree = _tree(path)
    base = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                mod = ".".join(base[:len(base) - node.level + 1] + [node.module or ""]).strip(".")
            else:
                mod = node.module or ""
            if mod.startswith("planner"):
                yield mod, node.lineno, node.col_offset > 0, [a.name for a in node.names]


def _room(mod: str) -> int:
    best = (-1, -1)
    for i, (_, prefixes) in enumerate(ROOMS):
        for p in prefixes:
            if (mod == p or mod.startswith(p + ".")) and len(p) > best[1]:
                best = (i, len(p))
    return best[0]


def test_every_module_has_a_room():
    assert all(_room(m) >= 0 for m in _modules())


def test_imports_follow_the_flow():
    against = {(m, mod) for m, p in _modules().items() for mod, *_ in _imports(m, p)
               if _room(mod) > _room(m)}
    assert against <= set(AGAINST_FLOW), sorted(against - set(AGAINST_FLOW))


def test_no_import_circles():
    modules = _modules()
    edges = defaultdict(set)
    for m, p in modules.items():
        for mod, _, _, names in _imports(m, p):
            for target in [f"{mod}.{n}" for n in names] + [mod]:
                while target and target not in modules:
                    target = target.rpartition(".")[0]
                if target and target != m:
                    edges[m].add(target)
                    break
    # Tarjan's strongly connected components, iteratively
    index, low, stack, on, circles, counter = {}, {}, [], set(), [], [0]
    for root in modules:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(edges[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    circles.append(sorted(comp))
    assert circles == []


def test_inner_imports_only_at_the_boundary():
    inner = [(m, mod, line) for m, p in _modules().items() for mod, line, nested, _ in _imports(m, p)
             if nested and not m.startswith(BOUNDARY)]
    assert inner == []


def test_functions_fit_on_a_screen():
    long = []
    for m, p in _modules().items():
        for node in ast.walk(_tree(p)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                lines = node.end_lineno - node.lineno + 1
                if lines > MAX_FUNCTION_LINES:
                    long.append((m, node.name, lines))
    assert long == []


def test_a_solved_axis_is_named_where_it_belongs():
    """offload_layers: defined (layout.axes), costed (cost.memory, cost.offload), ruled
    (search.framework_rules), solved (search.least_layers), exported (frameworks.megatron,
    frameworks.nemo) and validated (validate.miniature); every other module asks those."""
    named = sorted(m for m, p in _modules().items() if "offload_layers" in p.read_text())
    assert len(named) <= AXIS_MODULES, named
