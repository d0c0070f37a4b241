"""The layout of wmbook.profiling: no import cycles (function-level imports included), collection apart from
analysis, and the one definition of a label's device time quoted where label times are computed."""

import ast
from pathlib import Path

import wmbook.profiling as prof

ROOT = Path(prof.__file__).resolve().parent


def _module(path: Path) -> str:
    parts = ("wmbook",) + path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports() -> dict[str, set[str]]:
    """Module -> the wmbook.profiling modules it imports anywhere in its body (module and function level)."""
    graph = {}
    for path in ROOT.rglob("*.py"):
        name = _module(path)
        pkg = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
        deps = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
                deps |= {target + "." + a.name for a in node.names} if node.module is None else {target}
            elif isinstance(node, ast.ImportFrom) and node.module:
                deps.add(node.module)
            elif isinstance(node, ast.Import):
                deps |= {a.name for a in node.names}
        graph[name] = {d for d in deps if d.startswith("wmbook.profiling") and d != name}
    return graph


def test_no_import_cycles_inside_profiling():
    graph = _imports()

    def reach(a):
        seen, todo = set(), [a]
        while todo:
            for b in graph.get(todo.pop(), ()):
                if b not in seen:
                    seen.add(b)
                    todo.append(b)
        return seen

    # a package importing its own submodules (its __init__) is not a cycle
    cycles = sorted({tuple(sorted((a, b))) for a in graph for b in graph[a]
                     if a in reach(b) and not a.startswith(b + ".") and not b.startswith(a + ".")})
    assert not cycles, cycles


def test_analysis_does_not_collect_and_trace_does_not_analyse():
    graph = _imports()
    for mod, deps in graph.items():
        if mod.startswith(("wmbook.profiling.analysis", "wmbook.profiling.trace")):
            assert "wmbook.profiling.collect" not in deps, mod
        if mod == "wmbook.profiling.trace":
            assert not {d for d in deps if d.startswith("wmbook.profiling.analysis")}, deps


def test_modules_stay_small():
    sizes = {p.relative_to(ROOT).as_posix(): len(p.read_text().splitlines()) for p in ROOT.rglob("*.py")}
    assert max(sizes.values()) <= 600, sorted(sizes.items(), key=lambda kv: -kv[1])[:3]


def test_one_definition_of_label_device_time():
    from wmbook.profiling.analysis import labels

    d = prof.LABEL_DEVICE_TIME_DEFINITION
    assert d is labels.LABEL_DEVICE_TIME_DEFINITION and "launched while that label was open" in d
    for fn in (labels.label_tree, labels.label_table, prof.kernel_summary):
        assert "LABEL_DEVICE_TIME_DEFINITION" in fn.__doc__, fn.__name__
