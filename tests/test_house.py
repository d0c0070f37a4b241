"""The house's rules, read from the source: no import circle, no module over 600 lines, workloads named only
inside ``wmbook/workloads/``.

The import graph counts every ``import`` of a ``wmbook`` module, at module top or inside a function: an import
deferred into a function still ties the two modules together, it only hides the tie from a reader.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PKG = ROOT / "wmbook"
MAX_LINES = 600


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _modules(pkg: Path = PKG) -> dict[str, Path]:
    return {_module_name(p): p for p in sorted(pkg.rglob("*.py"))}


def _resolve(module: str, is_package: bool, level: int, target: str | None) -> str:
    """The absolute name a (possibly relative) ``from`` import points at."""
    if level == 0:
        return target or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        base = base[: len(base) - (level - 1)]
    return ".".join(base + ([target] if target else []))


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Edges module -> the ``wmbook`` modules it imports (submodules named in ``from pkg import sub`` count as
    the submodule)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name in modules:
                        edges.add(alias.name)
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(name, is_package, node.level, node.module)
                for alias in node.names:
                    sub = f"{target}.{alias.name}" if target else alias.name
                    if sub in modules:
                        edges.add(sub)
                    elif target in modules:
                        edges.add(target)
        edges.discard(name)
        graph[name] = edges
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0

    def visit(v: str) -> None:
        nonlocal counter
        index[v] = low[v] = counter
        counter += 1
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_circle_finder_finds_a_circle_and_a_clean_chain():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_graph_reads_relative_and_function_level_imports(tmp_path):
    pkg = tmp_path / "wmbook"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from . import b\n")
    (pkg / "b.py").write_text("from .sub.c import thing\n")
    (pkg / "sub" / "__init__.py").write_text("")
    (pkg / "sub" / "c.py").write_text("from .. import a\n")
    global ROOT
    saved, ROOT = ROOT, tmp_path
    try:
        graph = import_graph(_modules(pkg))
    finally:
        ROOT = saved
    assert circles(graph) == [["wmbook.a", "wmbook.b", "wmbook.sub.c"]]


def test_the_package_has_no_import_circle():
    found = circles(import_graph(_modules()))
    assert not found, "import circles (each line one circle):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_no_module_is_over_600_lines():
    long = {n: len(p.read_text().splitlines()) for n, p in _modules().items()}
    over = {n: k for n, k in long.items() if k > MAX_LINES}
    assert not over, f"modules over {MAX_LINES} lines: {over}"


def _workload_names() -> set[str]:
    from wmbook import workloads

    return set(workloads.names())


def workload_name_uses(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, what) for each workload name compared (``==``, ``!=``, ``in``), listed (a list, tuple or set literal) or
    returned in `source`. A ``requires=`` set names workload *features* (one of them, "motion", is spelled like the
    motion workload): it is not read."""
    tree = ast.parse(source)
    features = {id(n) for kw in ast.walk(tree) if isinstance(kw, ast.keyword) and kw.arg == "requires"
                for n in ast.walk(kw.value)}
    found = []
    for node in ast.walk(tree):
        if id(node) in features:
            continue
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                consts = side.elts if isinstance(side, (ast.List, ast.Tuple, ast.Set)) else [side]
                if any(isinstance(c, ast.Constant) and c.value in names for c in consts):
                    found.append((node.lineno, "compared"))
                    break
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            if any(isinstance(c, ast.Constant) and c.value in names for c in node.elts):
                found.append((node.lineno, "listed"))
        elif isinstance(node, ast.Return) and isinstance(node.value, ast.Constant) and node.value.value in names:
            found.append((node.lineno, "returned"))
    return sorted(set(found))


def test_workload_name_rule_finds_comparisons_and_lists():
    names = {"mg2", "wma"}
    src = ('if wl == "mg2":\n    pass\nWORKLOADS = ("mg2", "wma")\nok = x in ["wma"]\n'
           'fine = workloads.get("mg2")\ndefault = "mg2"\nSPEC = NotebookSpec(requires=frozenset({"wma"}))\n'
           'def workload_of(p):\n    return "wma"\n')
    assert workload_name_uses(src, names) == [(1, "compared"), (3, "listed"), (4, "compared"), (4, "listed"),
                                              (9, "returned")]


def test_workloads_are_named_only_inside_the_workloads_package():
    """The rest of the package asks the workload object (its features, metric, presets) instead of naming it: a
    third world model is added in wmbook/workloads/ alone. A name as a default value or a lookup key
    (``workloads.get("mg2")``) is neither a comparison nor a list."""
    names = _workload_names()
    bad = {}
    for name, path in _modules().items():
        if name.startswith("wmbook.workloads"):
            continue
        uses = workload_name_uses(path.read_text(), names)
        if uses:
            bad[str(path.relative_to(ROOT))] = uses
    assert not bad, f"workload names compared or listed outside wmbook/workloads/: {bad}"


def test_a_runs_stacks_are_resolved_once_into_variant_objects():
    """A stack parameter's value in the RunConfig is the resolved Variants (a group expanded to its members), and the
    ladder code passes them through as they are: nothing downstream looks a name up again."""

    from wmbook import variants
    from wmbook.motion import variants as mvariants
    from wmbook.studies import compile as study04
    from wmbook.studies import graphs as study06
    from wmbook.studies import kernels as study05
    from wmbook.studies import motion as study07
    from wmbook.studies import steps as study03

    cfg = study06.validate(workload="mg2", preset="tiny", device="cpu", base="bf16,hygiene", steps="static-caches")
    assert all(isinstance(v, variants.Variant) for v in cfg.options.base + cfg.options.steps)
    assert [v.name for v in cfg.options.base] == ["bf16", *variants.hygiene_parts(cfg.workload)]
    assert cfg.params()["base"] == ",".join(v.name for v in cfg.options.base)  # a results row records the names
    again = variants.resolve(cfg.options.base, cfg.workload, cfg.device)
    assert all(a is b for a, b in zip(again, cfg.options.base))
    for stack in (study06.base_stack(cfg), study06.graph_steps(cfg), study06.best_of_04(cfg)):
        assert stack and all(isinstance(v, variants.Variant) for v in stack)
    c04 = study04.validate(workload="wma", device="cpu", ladder="bf16,channels-last")
    assert [v.name for v in c04.options.ladder] == ["bf16", "channels-last"]
    assert all(isinstance(v, variants.Variant) for v in study04.default_ladder(c04))
    c05 = study05.validate(workload="wma", device="cpu", preset="tiny-wma")
    assert all(isinstance(v, variants.Variant) for v in study05.base_stack(c05) + study05.kernel_steps(c05))
    c03 = study03.validate(workload="mg2", preset="tiny", device="cpu", base="bf16")
    assert [type(v) for v in c03.options.base] == [variants.Variant]
    c07 = study07.validate(device="cpu")
    assert all(isinstance(v, mvariants.MotionVariant) for v in study07.ladder_steps(c07))
    with pytest.raises(ValueError, match="base"):  # an unknown name is refused at the check, naming the parameter
        study06.validate(workload="mg2", preset="tiny", device="cpu", base="bf16,turbo")
