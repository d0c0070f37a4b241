"""torch.compile tools (wmbook.variants.compile, wmbook.variants.compile_monitor): spec checks, regional compile,
recompile and graph-break accounting, cache directories, cold vs warm compile time.

Dynamo-side checks use backend="eager" (no codegen); one tiny inductor compile measures cold vs warm.
"""

from __future__ import annotations

import logging
import os

import pytest
import torch

from wmbook.variants.compile import (
    CompileSpec,
    apply_compile,
    cpp_compiler_available,
    get_recompile_limit,
    inductor_cache_dir,
    measure_compile_time,
    recompile_limit_name,
    remove_compile,
    set_recompile_limit,
)
from wmbook.variants.compile_monitor import CompileMonitor, graph_break_report

EAGER = dict(backend="eager")


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


class Block(torch.nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        return torch.relu(self.proj(x)) + x


class Stack(torch.nn.Module):
    def __init__(self, n=6, dim=8):
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(dim) for _ in range(n))
        self.head = torch.nn.Linear(dim, dim)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


# --- spec ---------------------------------------------------------------------------------------------------


def test_spec_validation_and_name():
    assert CompileSpec().name == "regional-default-static"
    assert CompileSpec(scope="whole", mode="max-autotune-no-cudagraphs", dynamic=True).name == \
        "whole-max-autotune-no-cudagraphs-dynamic"
    assert CompileSpec(dynamic=None, backend="eager").name == "regional-default-auto-eager"
    with pytest.raises(ValueError, match="scope"):
        CompileSpec(scope="blocks")
    assert CompileSpec(mode="reduce-overhead").name == "regional-reduce-overhead-static"
    with pytest.raises(ValueError, match="also captures CUDA graphs.*reduce-overhead"):
        CompileSpec(mode="max-autotune")
    with pytest.raises(ValueError, match="mode='fast'.*allowed values"):
        CompileSpec(mode="fast")
    with pytest.raises(ValueError, match="dynamic"):
        CompileSpec(dynamic=1)
    with pytest.raises(ValueError, match="backend"):
        CompileSpec(backend="cudagraphs")
    with pytest.raises(ValueError, match="needs backend='inductor'"):
        CompileSpec(mode="max-autotune-no-cudagraphs", backend="eager")
    with pytest.raises(ValueError, match="fullgraph"):
        CompileSpec(fullgraph="yes")
    assert "mode" not in CompileSpec().compile_kwargs()


def test_apply_compile_refusals():
    m = Stack(2)
    with pytest.raises(ValueError, match="empty"):
        apply_compile(m, CompileSpec(**EAGER), regions=[])
    with pytest.raises(ValueError, match="needs regions"):
        apply_compile(m, CompileSpec(**EAGER))
    with pytest.raises(ValueError, match="only for scope='regional'"):
        apply_compile(m, CompileSpec(scope="whole", **EAGER), regions="blocks")
    with pytest.raises(ValueError, match="submodules"):
        apply_compile(m, CompileSpec(**EAGER), regions=[Block()])
    with pytest.raises(ValueError, match="contains other regions"):
        apply_compile(m, CompileSpec(**EAGER), regions=[m.blocks[0], m.blocks[0].proj])
    rec = apply_compile(m, CompileSpec(**EAGER), regions="blocks")
    assert rec.targets == ["blocks.0", "blocks.1"] and rec.classes == {"Block": 2}
    with pytest.raises(RuntimeError, match="already compiled"):
        apply_compile(m, CompileSpec(**EAGER), regions="blocks")
    with pytest.raises(RuntimeError, match="already compiled"):  # a whole compile on top of regions, too
        apply_compile(m, CompileSpec(scope="whole", **EAGER))
    remove_compile(m)
    apply_compile(m, CompileSpec(scope="whole", **EAGER))


# --- regional compile ---------------------------------------------------------------------------------------


def test_regional_compile_of_identical_blocks_compiles_one_graph():
    m = Stack(6)
    x = torch.randn(2, 8)
    with torch.no_grad():
        ref = m(x)
        rec = apply_compile(m, CompileSpec(**EAGER), regions=lambda model: list(model.blocks))
        with CompileMonitor() as mon:
            out = m(x)
            m(x)
    torch.testing.assert_close(out, ref)
    s = mon.summary()
    assert rec.n_targets == 6 and rec.shares_code
    assert s["graphs"] == 1 and s["frames_compiled"] == 1 and s["recompiles"] == 0, s


def test_regional_compile_of_torch_defined_modules_really_compiles():
    # nn.Module.compile() compiles nothing for nn.Sequential (its forward lives in torch.nn): forward is wrapped
    m = torch.nn.Sequential(*[torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()) for _ in range(3)])
    rec = apply_compile(m, CompileSpec(**EAGER), regions=list(m))
    assert rec.methods == ["forward"] * 3
    with torch.no_grad(), CompileMonitor() as mon:
        m(torch.randn(2, 8))
    assert mon.summary()["graphs"] == 1
    remove_compile(m)
    assert all("forward" not in b.__dict__ for b in m)


# --- recompiles ---------------------------------------------------------------------------------------------


def scale(x, n):
    return x * n


def test_python_int_recompiles_and_the_fixes():
    x = torch.randn(4)
    f = torch.compile(scale, backend="eager", dynamic=False)
    with CompileMonitor() as mon:
        for n in range(1, 5):
            f(x, n)
    s = mon.summary()
    assert s["recompiles"] == 3 and s["graphs"] == 4, s
    rc = mon.recompiles
    assert len(rc) == 3 and set(rc["function"]) == {"scale"}
    assert all("n ==" in g for g in rc["guard"]), rc["guard"].tolist()

    torch._dynamo.reset()
    f = torch.compile(scale, backend="eager", dynamic=False)
    with CompileMonitor() as mon:  # fix 1: the step scalar as a tensor
        for n in range(1, 5):
            f(x, torch.tensor(float(n)))
    assert mon.summary()["recompiles"] == 0 and mon.summary()["graphs"] == 1

    torch._dynamo.reset()
    f = torch.compile(scale, backend="eager", dynamic=True)
    with CompileMonitor() as mon:  # fix 2: the int dynamic (a SymInt in the graph)
        for n in range(1, 5):
            f(x, n)
    assert mon.summary()["recompiles"] == 0 and mon.summary()["graphs"] == 1


def test_recompile_limit_hit_is_counted_and_context_restores():
    name = recompile_limit_name()
    old = get_recompile_limit()
    x = torch.randn(4)
    f = torch.compile(scale, backend="eager", dynamic=False)
    with set_recompile_limit(2) as prev, CompileMonitor() as mon:
        assert prev == old and getattr(torch._dynamo.config, name) == 2
        outs = [f(x, n) for n in range(1, 6)]
    assert get_recompile_limit() == old
    for n, o in zip(range(1, 6), outs):  # past the limit it runs eager, still correct
        torch.testing.assert_close(o, x * n)
    s = mon.summary()
    assert s["recompile_limit_hits"] == 1 and s["recompiles"] == 1, s
    assert mon.limit_hits["function"].tolist() == ["scale"]
    with pytest.raises(KeyError), set_recompile_limit(3):
        raise KeyError("boom")
    assert get_recompile_limit() == old
    with pytest.raises(ValueError):
        with set_recompile_limit(0):
            pass


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return self.lin(x).sum(-1)


@pytest.mark.parametrize("dynamic,recompiles", [(False, 1), (True, 0)])
def test_monitor_counts_shape_recompiles(dynamic, recompiles):
    m = Net()
    apply_compile(m, CompileSpec(scope="whole", dynamic=dynamic, **EAGER))
    with torch.no_grad(), CompileMonitor() as mon:
        m(torch.randn(2, 8))
        m(torch.randn(3, 8))
        m(torch.randn(3, 8))
    s = mon.summary()
    assert s["recompiles"] == recompiles and s["graphs"] == 1 + recompiles, s
    if recompiles:
        assert "size" in mon.recompiles["guard"].iloc[0]


# --- graph breaks -------------------------------------------------------------------------------------------


def uses_item(x):
    y = x.sum().item()  # graph break
    return x * y


ITEM_LINE = uses_item.__code__.co_firstlineno + 1


def test_item_graph_break_report_has_location():
    rep = graph_break_report(uses_item, torch.randn(4))
    assert rep.graphs == 2 and rep.graph_breaks == 1
    row = rep.breaks.iloc[0]
    assert "item" in row["reason"]
    assert os.path.samefile(row["file"], __file__) and row["line"] == ITEM_LINE and row["count"] == 1


def test_monitor_graph_break_location_and_nesting_restores_loggers():
    loggers = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict) if n.endswith(".__graph_breaks")]
    before = [(lg.level, lg.propagate, list(lg.handlers)) for lg in loggers]
    f = torch.compile(uses_item, backend="eager")
    with CompileMonitor() as outer:
        with CompileMonitor() as inner:
            f(torch.randn(4))
        f(torch.randn(4) + 1)
    assert [(lg.level, lg.propagate, list(lg.handlers)) for lg in loggers] == before
    for mon in (outer, inner):
        s = mon.summary()
        assert s["graph_breaks"] >= 1 and s["frames_compiled"] >= 1, s
        gb = mon.graph_breaks
        hit = gb[gb["line"] == ITEM_LINE]
        assert len(hit) == 1 and "item" in hit["reason"].iloc[0] and os.path.samefile(hit["file"].iloc[0], __file__)
    assert outer.summary()["frames_compiled"] >= inner.summary()["frames_compiled"]
    with pytest.raises(RuntimeError, match="not run yet"):
        CompileMonitor().summary()


# --- caches and compile time --------------------------------------------------------------------------------


def test_inductor_cache_dir_restores_env(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/somewhere/else")
    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    with inductor_cache_dir() as d:
        assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == d and os.path.isdir(d)
        assert os.environ["TRITON_CACHE_DIR"] == os.path.join(d, "triton")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/else" and "TRITON_CACHE_DIR" not in os.environ
    assert not os.path.exists(d)  # a temporary directory is removed
    with pytest.raises(RuntimeError), inductor_cache_dir(tmp_path / "kept") as d2:
        raise RuntimeError("restores on error too")
    assert os.path.isdir(d2) and os.environ["TORCHINDUCTOR_CACHE_DIR"] == "/somewhere/else"


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 32)
        self.b = torch.nn.Linear(32, 16)

    def forward(self, x):
        return self.b(torch.nn.functional.gelu(self.a(x)))


@pytest.mark.skipif(not cpp_compiler_available(), reason="inductor on CPU needs a C++ compiler; none found")
def test_measure_compile_time_cold_slower_than_warm():
    x = torch.randn(4, 16)

    def run(model):
        with torch.no_grad():
            return model(x)

    row = measure_compile_time(MLP, run, CompileSpec(scope="whole"), device="cpu", steady_repeats=2)
    assert row["cold_s"] > row["warm_s"] > 0, row
    assert row["cold_fx_cache_misses"] >= 1 and row["warm_fx_cache_hits"] >= 1, row
    assert row["cold_graphs"] == 1 and row["cold_recompiles"] == 0 and row["steady_recompiles"] == 0
    assert row["cold_inductor_s"] > 0 and row["cache_mb"] > 0 and row["steady_ms"] > 0
