"""The package's shape, checked on every CI run: no import cycles (function-level imports included, since a cycle
hidden in a function is still a cycle), no private names used across modules, `core` below everything and `cli` above
everything, no module over 600 lines, no function body over 80 (complexity over 15 is ruff's C901, in pyproject.toml).
Reads the source with ast; imports nothing of trtforge."""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "trtforge"
MAX_LINES = 600
MAX_BODY_LINES = 80


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in ROOT.rglob("*.py")}


def _type_checking_nodes(tree: ast.Module) -> set[int]:
    """Imports under `if TYPE_CHECKING:` (annotations only; never executed)."""
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            skipped |= {id(n) for stmt in node.body for n in ast.walk(stmt)}
    return skipped


def imports(mods: dict[str, Path]) -> tuple[dict[str, set[str]], list[str]]:
    """(module -> the trtforge modules it imports anywhere, the private names imported or read across modules)."""

    def owner(dotted: str) -> str | None:
        while dotted and dotted not in mods:
            dotted = dotted.rpartition(".")[0]
        return dotted or None

    edges: dict[str, set[str]] = defaultdict(set)
    private: list[str] = []
    for name, path in mods.items():
        tree = ast.parse(path.read_text())
        skipped = _type_checking_nodes(tree)
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if id(node) in skipped:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("trtforge"):
                for alias in node.names:
                    full = f"{node.module}.{alias.name}"
                    target = full if full in mods else owner(node.module)
                    if full in mods:
                        aliases[alias.asname or alias.name] = full
                    if target and target != name:
                        edges[name].add(target)
                        if alias.name.startswith("_") and not alias.name.startswith("__") and target != "trtforge":
                            private.append(f"{name} imports {alias.name} from {node.module}")
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.startswith("trtforge") and (target := owner(alias.name)) and target != name:
                        edges[name].add(target)
                        if alias.asname:
                            aliases[alias.asname] = alias.name
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                private.append(f"{name} reads {aliases[node.value.id]}.{node.attr}")
    for targets in edges.values():
        targets.discard("trtforge")  # the package itself: __version__
    return edges, private


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    nodes = set(edges) | {t for ts in edges.values() for t in ts}
    for start in sorted(nodes):
        if start in index:
            continue
        work = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
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
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_cycle_finder_finds_a_cycle():
    """The finder itself: a hidden three-module cycle and a self-contained chain."""
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": {"c"}}) == []


def test_no_import_cycles():
    edges, _ = imports(modules())
    assert cycles(edges) == []


def test_no_private_names_across_modules():
    _, private = imports(modules())
    assert private == []


def test_core_is_below_and_cli_above_everything():
    edges, _ = imports(modules())
    upward = [f"{m} -> {t}" for m, ts in edges.items() if m.startswith("trtforge.core") for t in ts if not t.startswith("trtforge.core")]
    into_cli = [
        f"{m} -> {t}"
        for m, ts in edges.items()
        if not m.startswith("trtforge.cli") and m != "trtforge.__main__"
        for t in ts
        if t.startswith("trtforge.cli")
    ]
    assert upward == [] and into_cli == []


def test_no_module_over_600_lines():
    long = {name: n for name, path in modules().items() if (n := len(path.read_text().splitlines())) > MAX_LINES}
    assert long == {}


def test_every_folder_of_modules_is_a_package():
    """A folder of modules without __init__.py imports from a checkout but is left out of the wheel."""
    missing = [
        str(d.relative_to(ROOT.parent)) for d in ROOT.rglob("*") if d.is_dir() and any(d.glob("*.py")) and not (d / "__init__.py").exists()
    ]
    assert missing == []


def body_lines(function: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    """Lines of a function's body, its signature and docstring left out (a long docstring is not long code)."""
    body = function.body
    if len(body) > 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and isinstance(body[0].value.value, str):
        body = body[1:]
    return (body[-1].end_lineno or body[-1].lineno) - body[0].lineno + 1


def long_functions(source: str, limit: int = MAX_BODY_LINES) -> dict[str, int]:
    functions = [n for n in ast.walk(ast.parse(source)) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    return {f"{f.name}:{f.lineno}": n for f in functions if (n := body_lines(f)) > limit}


def test_long_function_finder_counts_the_body_only():
    code = 'def f(\n    a,\n):\n    """Doc.\n\n    More."""\n' + "    a += 1\n" * 3 + "    return a\n"
    assert long_functions(code, 4) == {} and long_functions(code, 3) == {"f:1": 4}


def test_no_function_body_over_80_lines():
    long = {f"{name}.{where}": n for name, path in modules().items() for where, n in long_functions(path.read_text()).items()}
    assert long == {}
