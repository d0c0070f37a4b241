"""CUDA-graph capture (wmbook.graphs), static caches, the graph variants (notebook 06).

On a CPU: the argument flattening, the signatures, the eager fallback and the static caches (equal to fresh caches,
over more blocks than the KV window). On a GPU: replay equals eager and the capture fallback names the op that
synchronized.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

from wmbook import graphs, variants, workloads
from wmbook.graphs import GraphedCallable, _flatten, _signature, _unflatten
from wmbook.pipelines.causal import CausalStreamingPipeline

pytestmark = pytest.mark.numerics  # rerun with oneDNN and ATen held to older ISAs: `make test-isa`

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """Every test of this module on one thread (tests/conftest.py)."""


@dataclass
class Pair:
    a: torch.Tensor
    b: torch.Tensor | None


def test_flatten_round_trip_and_signatures():
    graphs.register_input_type(Pair)
    x, y = torch.randn(2, 3), torch.randn(4)
    state = object()
    tree = ((x, 3, "s"), {"p": Pair(y, None), "state": state, "grid": (1, 2, 3)})
    leaves = []
    spec = _flatten(tree, leaves)
    assert len(leaves) == 2 and leaves[0] is x and leaves[1] is y
    back = _unflatten(spec, leaves)
    assert back[0][0] is x and back[0][1:] == (3, "s") and back[1]["p"].a is y and back[1]["state"] is state
    # ints, strings, tuples of ints by value; other objects by identity
    assert _signature(spec) == _signature(_flatten(((x, 3, "s"), {"p": Pair(y, None), "state": state,
                                                                  "grid": (1, 2, 3)}), []))
    assert _signature(spec) != _signature(_flatten(((x, 4, "s"), {"p": Pair(y, None), "state": state,
                                                                  "grid": (1, 2, 3)}), []))
    assert _signature(spec) != _signature(_flatten(((x, 3, "s"), {"p": Pair(y, None), "state": object(),
                                                                  "grid": (1, 2, 3)}), []))
    with pytest.raises(ValueError, match="not a dataclass"):
        graphs.register_input_type(int)


def test_cpu_runs_eagerly_and_says_why():
    calls = []

    def fn(x):
        calls.append(1)
        return x * 2

    g = GraphedCallable(fn, name="double", device="cpu")
    assert torch.equal(g(torch.ones(3)), torch.full((3,), 2.0)) and len(calls) == 1
    t = g.table()
    assert not t["graph"].iloc[0] and "need a CUDA device" in t["why not"].iloc[0]
    with pytest.raises(ValueError, match="warmup=0 is not allowed"):
        GraphedCallable(fn, warmup=0)


def test_static_and_ring_caches_equal_fresh_caches_over_more_blocks_than_the_window():
    """Two generations through one pipeline with static caches (reset and refilled in place), ring caches, or both,
    give what fresh dynamic caches give, with more blocks than the KV window holds (the reference evicts, the ring
    wraps): static caches bit for bit, rings within fp32 rounding; static caches keep their addresses
    (wmbook.studies.graphs.static_cache_check, what notebook 06 shows)."""
    from wmbook.studies import graphs as study

    cfg = study.validate(workload="mg2", device="cpu")
    checks = study.static_cache_check(cfg)
    p = cfg.preset
    assert len(checks) == 6 and (checks["blocks"] > p.kv_capacity_frames() // p.num_frame_per_block).all()
    static = checks.loc["static-caches"]
    assert static["equal"].all() and (static["max abs diff"] == 0).all() and static["same cache addresses"].all()
    assert (checks["max rel diff"] < 1e-5).all()
    assert checks.loc["static-caches + ring-kv-cache"]["same cache addresses"].all()
    assert study.static_cache_check(study.validate(workload="wma", device="cpu")).empty  # no cross-call state


def test_the_forward_probe_keeps_caches_of_its_own():
    """Only `generate` shares the static caches: the probe must not rewrite a generation's slots."""
    pipe = CausalStreamingPipeline("tiny", device="cpu", dtype="fp32", vae_dtype="fp32", seed=0)
    workloads.get("mg2").static_caches(pipe)
    pipe.generate(pipe.prepare(2, seed=0), progress=False, decode=False)
    assert pipe.init_cache(pipe.prepare(2, seed=0)) is not pipe._static_cache


def test_graph_variants_registered_and_gpu_only():
    assert {"static-caches", "cuda-graphs", "compile-regional-reduce-overhead"} <= set(
        variants.known(workloads.get("mg2")))
    assert ("static-caches" not in variants.known(workloads.get("wma"))
            and "cuda-graphs" in variants.known(workloads.get("wma")))
    with pytest.raises(ValueError, match="'cuda-graphs' needs a CUDA device"):
        variants.resolve(["bf16", "cuda-graphs"], workloads.get("mg2"), "cpu")
    for wl in workloads.all_workloads():
        targets = wl.graph_targets(wl.reference_pipeline(wl.presets[wl.tiny_preset], torch.device("cpu")))
        assert targets and all(callable(getattr(t.owner, t.attr)) for t in targets)


def test_replay_output_object_built_once_without_clones_and_fresh_with_them():
    """The replay's output handling, on a stub graph (no GPU needed): with clone_outputs=False every replay returns the
    same output object over the static buffers (built once: it costs host time per call); with clones, new tensors
    in a new structure each time."""
    from wmbook.graphs import _Entry, _flatten

    class StubGraph:
        replays = 0

        def replay(self):
            StubGraph.replays += 1

    buf = {"a": torch.arange(3.0), "b": [torch.ones(2)]}
    for clone in (False, True):
        g = GraphedCallable(lambda: buf, clone_outputs=clone, device="cpu")
        leaves: list = []
        e = _Entry(graph=StubGraph(), out_spec=_flatten(buf, leaves), static_out=leaves)
        first, second = g._replay(e, ()), g._replay(e, ())
        assert e.replays == 2 and torch.equal(first["a"], buf["a"]) and set(first) == {"a", "b"}
        if clone:
            assert first is not second and first["a"] is not buf["a"] and torch.equal(second["b"][0], buf["b"][0])
        else:
            assert first is second and first["a"] is buf["a"] and first["b"][0] is buf["b"][0]
    assert StubGraph.replays == 4


@GPU
def test_replay_equals_eager_and_outputs_are_copies():
    lin = torch.nn.Linear(64, 64).cuda()

    def fn(x, scale):
        return {"y": lin(x) * scale["s"]}

    g = GraphedCallable(fn, warmup=2)
    xs = [torch.randn(8, 64, device="cuda") for _ in range(5)]
    outs = [g(x, {"s": torch.tensor(2.0, device="cuda")})["y"] for x in xs]
    # the capture call runs eagerly
    assert g.captured == 1 and g.entries and next(iter(g.entries.values())).replays == 2
    for x, o in zip(xs, outs):
        torch.testing.assert_close(o, lin(x) * 2.0)  # earlier outputs not overwritten by later replays
    assert g(torch.randn(4, 64, device="cuda"), {"s": torch.tensor(1.0, device="cuda")})["y"].shape == (4, 64)
    assert len(g.entries) == 2  # a new shape is a new signature


@GPU
def test_a_call_without_arguments_replays_through_the_fast_path():
    """A captured callable without arguments (a motion fetch) replays without rebuilding its signature: the same
    results as eager (its state read from the device each replay), counted replays, and reset() drops the fast path
    with the graphs."""
    state = torch.randn(256, device="cuda")
    out = torch.empty_like(state)

    def fn():
        torch.mul(state, 3.0, out=out)
        return {"out": out}

    g = GraphedCallable(fn, warmup=2, clone_outputs=False)
    for _ in range(3):  # two eager calls, then the capture (whose call runs eagerly)
        g()
    assert g._no_args is not None and g._no_args.replays == 0
    for _ in range(4):
        state.normal_()
        torch.testing.assert_close(g()["out"], state * 3.0)
    assert g._no_args.replays == 4 and g.captured == 1
    assert g() is g()  # without clones, one output object over the static buffers
    g.reset()
    assert g._no_args is None and not g.entries
    keyed = GraphedCallable(fn, warmup=1, key_fn=lambda a, k: 0)  # a key_fn may change the signature: no fast path
    for _ in range(3):
        keyed()
    assert keyed._no_args is None and next(iter(keyed.entries.values())).replays == 1


@GPU
def test_capture_fallback_names_the_syncing_op():
    def syncing(x):
        n = int(x.sum().item() > 0)  # a host read: no graph can hold it
        return x * (n + 1)

    g = GraphedCallable(syncing, warmup=1)
    x = torch.ones(4, device="cuda")
    for _ in range(3):
        assert torch.equal(g(x), x * 2)  # eager after the failed capture, same result
    assert g.captured == 0 and len(g.failures) == 1
    why = g.failures[0]
    assert why.startswith("synchronizes with the host") and "test_graphs.py" in why and ".item()" in why, why
    assert "item()" in g.table()["why not"].iloc[0]
    torch.randn(4, device="cuda", generator=torch.Generator("cuda").manual_seed(0))  # the RNG still works


@GPU
def test_cuda_graphs_variant_equals_eager_on_the_tiny_dit():
    from wmbook.variants.ladder import apply_stack

    wl = workloads.get("mg2")
    dev = torch.device("cuda")
    ref = wl.reference_pipeline(wl.presets["tiny"], dev)
    eager, _ = apply_stack(ref, wl, ["bf16", "hygiene"], dev)
    graphed, _ = apply_stack(ref, wl, ["bf16", "hygiene", "static-caches", "cuda-graphs"], dev)
    for _ in range(2):  # the second generation replays the graphs captured in the first
        a = wl.end_to_end(eager, 0).latents
        b = wl.end_to_end(graphed, 0).latents
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    from wmbook.variants.builtin import graphed_callables

    (g,) = graphed_callables(graphed)
    assert g.captured >= 1 and not g.failures


@GPU
def test_notebook_06_wma_stack_on_the_tiny_unet():
    """Notebook 06's wma stack on a GPU at the tiny shape, as its H100 run builds it: the base with notebook 05's
    kernels under inductor's whole-UNet compile, skip-unused-heads (its flags outside the graphs), the captured
    steps. Each pass's read outputs within bf16 rounding of the same stack without graphs, the graphs captured with
    no fallback, the unread outputs None."""
    from wmbook.studies import graphs as study06
    from wmbook.variants.builtin import graphed_callables
    from wmbook.variants.ladder import apply_stack

    wl = workloads.get("wma")
    dev = torch.device("cuda")
    cfg = study06.validate(workload="wma", preset="tiny-wma", device="cuda")
    base = [v.name for v in study06.base_stack(cfg)]
    assert "triton-fused" in base and "head-conv-gemm" in base and base[-1] == "compile-whole"
    ref = wl.reference_pipeline(wl.presets["tiny-wma"], dev)
    plain, _ = apply_stack(ref, wl, [*base, "skip-unused-heads"], dev)
    graphed, _ = apply_stack(ref, wl, [*base, "skip-unused-heads", "cuda-graphs"], dev)
    with torch.no_grad():
        for _ in range(2):  # the second iteration replays what the first captured
            a = plain.run_iteration(plain.prepare(seed=0), ddim_steps=3, progress=False)
            b = graphed.run_iteration(graphed.prepare(seed=0), ddim_steps=3, progress=False)
    assert b.decision.states is None and b.world.actions is None
    for x, y in ((a.world.latents, b.world.latents), (a.decision.actions, b.decision.actions),
                 (a.world.states, b.world.states)):
        torch.testing.assert_close(y.float(), x.float(), rtol=0.05, atol=0.05)
    gs = graphed_callables(graphed)
    assert gs and all(g.captured >= 1 and not g.failures for g in gs), [g.failures for g in gs]


def test_launch_count_on_the_h100_trace_fixture():
    from pathlib import Path

    from wmbook.profiling.trace import Trace
    from wmbook.variants.ladder import launch_count

    trace = Path(__file__).parent / "data" / "trace_tiny_h100.json.gz"
    n = launch_count(trace)
    assert 0 < n <= len(Trace.load(trace).device_activities)


def test_reduce_overhead_row_notes_why_inductor_skipped_its_graphs():
    """inductor says only in a log line that it ran a reduce-overhead graph without CUDA graphs (mutated inputs: the
    H200 run of notebook 06); the row's notes get the reason, the latest row's notes only, and the interpretation
    (skipped_graphs) repeats it."""
    from types import SimpleNamespace

    from torch._inductor.cudagraph_utils import log_cudagraph_skip_and_bump_counter

    from wmbook.studies.graphs import skipped_graphs
    from wmbook.variants.builtin import _note_cudagraph_skips

    first, second = {}, {}
    _note_cudagraph_skips(first)
    _note_cudagraph_skips(second)  # a later row: the handler is installed once and writes to the latest notes
    log_cudagraph_skip_and_bump_counter("skipping cudagraphs due to mutated inputs (6 instances)")
    assert first == {} and second == {"reduce-overhead": "inductor skipped its CUDA graphs due to mutated inputs "
                                                         "(6 instances): this row runs without them"}
    from torch._inductor.cudagraph_utils import cudagraphs_log

    assert sum(type(h).__name__ == "_CudagraphSkips" for h in cudagraphs_log.handlers) == 1
    row = SimpleNamespace(variant="base, compiled with mode reduce-overhead", note="recompile limit 64; "
                          + second["reduce-overhead"])
    lad = SimpleNamespace(rows=[SimpleNamespace(), SimpleNamespace(variant="base", note="x"), row])
    assert skipped_graphs(lad) == ["`base, compiled with mode reduce-overhead`: inductor skipped its CUDA graphs due "
                                   "to mutated inputs (6 instances): this row runs without them."]


def test_run_goal_and_trace_size():
    import pandas as pd

    from wmbook.studies import graphs as study06

    e = pd.DataFrame({"gate": ["pass", "pass", "FAIL"], "frames judged": [True, True, True],
                      "run s": [7.77, 6.55, 1.0]}, index=["base", "+ cuda-graphs", "+ broken"])
    f = pd.DataFrame({"wall / busy": [1.07, 1.00, 1.0], "GPU busy ms": [63.1, 62.9, 10.0]}, index=e.index)
    short = study06._run_goal(e, f)
    assert "`+ cuda-graphs`" in short[0] and "1.19x, short of the goal of 2x" in short[0]  # the failed row not counted
    assert "62.9 ms" in short[1] and "GPU work" in short[1]
    # the GPU work per forward the goal needs at the same share of the run: 62.9 ms x (7.77 / 2) / 6.55 = 37.3 ms
    assert short[2] == "At the same share of the run, the goal needs about 37.3 ms of GPU work per forward."
    cats = pd.DataFrame({"+ cuda-graphs": {"convolution": 30.0, "normalization": 15.0, "GEMM/linear": 10.0,
                                           "attention": 5.0, "other": 2.9}}).T  # Ladder.categories()
    said = study06._run_goal(e, f, cats)[2]
    assert said.endswith("its GPU time goes to convolution 30 ms (48%), normalization 15 ms (24%), GEMM/linear 10 ms "
                         "(16%), attention 5 ms (8%).")
    met = study06._run_goal(e.assign(**{"run s": [7.77, 3.5, 1.0]}), f)
    assert len(met) == 1 and "2.22x, meeting the goal of 2x" in met[0]
    assert study06._run_goal(e.iloc[:1], f) == []
    cfg = study06.validate(workload="wma", preset="tiny-wma", device="cpu", e2e_ddim_steps=50)
    assert study06.trace_size(cfg).ddim_steps == study06.TRACE_DDIM_STEPS
    assert study06.trace_size(study06.validate(workload="wma", preset="tiny-wma", device="cpu",
                                               e2e_ddim_steps=3)).ddim_steps == 3


def test_on_a_gpu_the_base_holds_notebook_05s_kernels_and_the_goal_counts_from_notebook_04s_best():
    """On a GPU notebook 06 builds on notebook 04's best stack with notebook 05's denoiser kernels compiled into it
    (one compile, not one per row), adds no kernel rows itself, and measures notebook 04's best stack alone as a
    comparison row, the baseline of the 2x goal; on a CPU (the interpreter) the base is notebook 04's best. Notebook
    05's own base never holds the kernels it measures."""
    import dataclasses

    import pandas as pd

    from wmbook.studies import graphs as study06
    from wmbook.studies import kernels as study05

    def names(stack):  # the stacks are resolved Variants; compared by name
        return [v.name for v in stack]

    for wl, preset in (("mg2", "tiny"), ("wma", "tiny-wma")):
        cpu = study06.validate(workload=wl, preset=preset, device="cpu")
        gpu = dataclasses.replace(cpu, device=torch.device("cuda"))
        assert study06.base_stack(cpu) == study06.best_of_04(cpu)
        assert "cuda-graphs" not in names(study06.graph_steps(cpu))
        base, best = names(study06.base_stack(gpu)), names(study06.best_of_04(gpu))
        kernels = (["triton-fused", "norm-conv-bias", "head-conv-gemm", "upsample-fold", "frames-norm-triton"]
                   if wl == "wma"
                   else ["triton-fused", "ffn-gelu-epilogue", "action-norm-rope"])
        assert base == [*best[:-1], *kernels, best[-1]] and best[-1].startswith("compile-")
        rows = names(study06.graph_steps(gpu))
        assert "cuda-graphs" in rows and not set(kernels) & set(rows)
        if wl == "wma":  # the iteration's own waste first, then the captured UNet, then the decoder rows
            assert rows == ["skip-unused-decode", "skip-unused-encode", "constant-conditioning", "skip-unused-heads",
                            "cuda-graphs", "vae-encoder-bf16", "conditioning-compile", "conditioning-cuda-graphs",
                            "vae-decoder-bf16", "vae-batch-frames",
                            "vae-upsample-fold", "vae-triton-fused", "vae-norm-conv-bias", "vae-attn-gemm",
                            "vae-compile", "vae-cuda-graphs", "graph-memset-kernels"]
        else:  # cuDNN's algorithm search on before the bf16 decoder's convolutions first run (it keeps its first pick)
            decoder = rows[rows.index("cuda-graphs") + 1:rows.index("vae-stream-buffers")]
            assert decoder == ["cudnn-benchmark", "vae-bf16"]
            assert rows[-3:] == ["graph-memset-kernels", "decode-first", "stream-frames"]
        assert names(study05.base_stack(gpu)) == best and study05.base_stack(cpu) == study06.best_of_04(cpu)
        given = study06.validate(workload=wl, preset=preset, device="cpu", base="bf16")
        assert names(study06.base_stack(dataclasses.replace(given, device=torch.device("cuda")))) == ["bf16"]
        # notebook 04's best stack alone is measured beside the ladder on a GPU wherever the base differs from it:
        # the kernels of the automatic base, or rows folded into a given base (one compile instead of one per row)
        assert study06.BEST_OF_04 in study06.comparison_rows(gpu, study06.base_stack(gpu))
        assert study06.BEST_OF_04 not in study06.comparison_rows(cpu, study06.base_stack(cpu))
        for stack, compared in ((best, False), ([*base[:-1], rows[0], base[-1]], True)):
            cfg = dataclasses.replace(study06.validate(workload=wl, preset=preset, device="cpu", base=",".join(stack)),
                                      device=torch.device("cuda"))
            assert (study06.BEST_OF_04 in study06.comparison_rows(cfg, study06.base_stack(cfg))) == compared
            got = study06.comparison_rows(cfg, study06.base_stack(cfg)).get(study06.BEST_OF_04)
            assert got is None or names(got) == best
    e = pd.DataFrame({"gate": ["pass", "pass", "pass"], "frames judged": [True, True, True],
                      "run s": [9.0, 5.5, 12.0]}, index=["base", "+ cuda-graphs", study06.BEST_OF_04])
    f = pd.DataFrame({"wall / busy": [2.0, 1.0, 2.1], "GPU busy ms": [55.0, 54.0, 59.0]}, index=e.index)
    said = study06._run_goal(e, f)[0]
    assert "against 12 s for notebook 04's best stack, measured in this run: 2.18x, meeting the goal of 2x" in said
    assert "`+ cuda-graphs`" in said
    failed = study06._run_goal(e.assign(**{"run s": [9.0, 5.5, float("nan")]}), f)
    assert failed == [f"`{study06.BEST_OF_04}` gave no run time (see its row), so the 2x goal is not judged."]


def test_row_results_store_the_kernel_categories():
    from wmbook.bench import Samples
    from wmbook.studies import graphs as study06
    from wmbook.variants.ladder import LadderRow

    cfg = study06.validate(workload="wma", preset="tiny-wma", device="cpu")
    r = LadderRow(stack=[], tolerance="bf16", forward=Samples([63.1, 63.0, 63.2]), flops=1.0, gpu_busy_ms=62.9,
                  categories={"convolution": 24.0, "normalization": 18.5, "attention": float("nan")}, gate="pass")
    rows = {x["metric"]: x for x in study06.row_results(cfg, r)}
    assert rows["category_ms:convolution"]["value"] == 24.0 and rows["category_ms:normalization"]["unit"] == "ms"
    assert "category_ms:attention" not in rows and rows["forward_ms"]["value"] == pytest.approx(63.1)
    assert not [m for m in study06.row_results(cfg, LadderRow(stack=[], tolerance="bf16", forward=Samples([1.0]),
                                                                 flops=1.0)) if m["metric"].startswith("category")]


def test_row_results_say_where_a_rows_minutes_went():
    """The first call's seconds (the compile), the whole row's seconds and the row's notes (recompiles, graph breaks,
    what the variants did) are stored with the row, so a row that eats a run's time limit (notebook 05's fp8 row)
    can be diagnosed from the results store; a row that did not measure them stores none."""
    from wmbook.bench import Samples
    from wmbook.studies import graphs as study06
    from wmbook.variants.ladder import LadderRow

    cfg = study06.validate(workload="wma", preset="tiny-wma", device="cpu")
    r = LadderRow(stack=[], tolerance="fp8", forward=Samples([50.0]), flops=1.0, gate="pass", first_call_s=612.5,
                  row_s=861.0, note="69 linears in fp8 (row-wise dynamic scales); 3 recompiles",
                  phases_s={"apply": 3.2, "first call": 612.5, "timing": 1.0, "end-to-end runs": 240.4})
    rows = {x["metric"]: x for x in study06.row_results(cfg, r)}
    assert rows["first_call_s"]["value"] == 612.5 and rows["row_s"]["unit"] == "s"
    assert rows["forward_ms"]["note"] == ("69 linears in fp8 (row-wise dynamic scales); 3 recompiles; seconds: "
                                          "apply 3, first call 612, timing 1, end-to-end runs 240")
    bare = {x["metric"] for x in study06.row_results(cfg, LadderRow(stack=[], tolerance="bf16",
                                                                      forward=Samples([1.0]), flops=1.0))}
    assert not bare & {"first_call_s", "row_s"}


def test_reduce_overhead_auto_follows_the_compile_scope():
    """auto: the comparison row where the workload compiles regionally (mg2), not where a row is a whole-denoiser
    compile (wma); a bool is taken as given; anything else is refused naming the allowed values."""
    from wmbook.params import ParameterError
    from wmbook.studies import graphs as study

    assert study.validate(workload="mg2", device="cpu").options.reduce_overhead is True
    assert study.validate(workload="wma", device="cpu").options.reduce_overhead is False
    assert study.validate(workload="wma", device="cpu", reduce_overhead=True).options.reduce_overhead is True
    with pytest.raises(ParameterError, match=r"reduce_overhead='yes'.*\['auto', True, False\]"):
        study.validate(workload="mg2", device="cpu", reduce_overhead="yes")


class _Pipe:
    """A pipeline as warm_up sees one: its graphed callables in `graphed`."""

    def __init__(self, *graphed):
        self.graphed = list(graphed)


def _simulated(monkeypatch, name: str, fail: bool = False) -> GraphedCallable:
    """A GraphedCallable whose capture is simulated on a CPU: its own accounting of warm-up calls, captures and
    replays, with the capture step standing in for CUDA's (`fail`: every capture fails, as a syncing op makes it)."""
    g = GraphedCallable(lambda x: x + 1, name=name, device="cpu")
    g.disabled_reason = None

    def capture(e, spec, leaves):
        if fail:
            e.failure = "capture failed: simulated"
            return None
        e.graph = object()
        return leaves[0] + 1

    monkeypatch.setattr(g, "_capture", capture)
    monkeypatch.setattr(g, "_replay", lambda e, leaves: (setattr(e, "replays", e.replays + 1), leaves[0] + 1)[1])
    return g


def test_warm_up_runs_until_the_graphs_a_run_calls_once_are_captured(monkeypatch):
    from wmbook.variants.builtin import warm_up

    once, often = _simulated(monkeypatch, "decode"), _simulated(monkeypatch, "forward")
    pipe, runs = _Pipe(once, often), []
    x = torch.zeros(2)

    def run(kind="full"):
        runs.append(kind)
        once(x)  # e.g. a wma iteration's decode: once a run
        for _ in range(5):  # e.g. the UNet's forward: every step
            often(x)

    assert warm_up(pipe, run) == 3 and runs == ["full"] * 3
    assert once.captured == 1 and once.entries[next(iter(once.entries))].eager_calls == 2 and not once.warming()
    run()  # the first timed run replays every graph
    assert all(e.replays >= 1 for g in (once, often) for e in g.entries.values())

    once.reset(), often.reset(), runs.clear()  # graph-memset-kernels captures them again
    assert warm_up(pipe, run, again=lambda: run("short")) == 3 and runs == ["full", "short", "short"]
    runs.clear()
    assert warm_up(pipe, run, 2) == 2 and runs == ["full"] * 2  # nothing left to capture: no extra run
    assert warm_up(pipe, run, 0) == 0 and runs == ["full"] * 2  # no warm-up asked for: none made

    from wmbook.variants.builtin import captures, graph_calls

    before = graph_calls(pipe)  # then the graphs are captured again (graph-memset-kernels): counts start over
    once.reset()
    run(), run(), run()
    since = {t["callable"].iloc[0]: t for t in captures(pipe, before)}
    assert since["decode"]["eager calls"].tolist() == [2] and since["decode"]["replays"].tolist() == [0]
    assert since["forward"]["replays"].tolist() == [15] and since["forward"]["eager calls"].tolist() == [0]


def test_warm_up_stops_at_a_failed_capture_a_new_signature_every_run_and_without_graphs(monkeypatch):
    from wmbook.variants.builtin import warm_up

    failing, idle = _simulated(monkeypatch, "syncs", fail=True), _simulated(monkeypatch, "idle")
    idle.warmup = 5  # never called: it raises the bound to 6 runs, so the 3 below are the failure's
    assert warm_up(_Pipe(failing, idle), lambda: failing(torch.zeros(1))) == 3  # two warm-up calls, a failed capture
    assert failing.failures and not failing.warming()
    growing, n = _simulated(monkeypatch, "grows"), [0]

    def run():  # a signature of its own every run: never captured, so at most 1 + its warm-up count runs
        n[0] += 1
        growing(torch.zeros(n[0]))

    assert warm_up(_Pipe(growing), run) == 3 and len(growing.warming()) == 3
    calls = []
    assert warm_up(_Pipe(), lambda: calls.append(1)) == 1 and calls == [1]  # no graphs: one run
    cpu = GraphedCallable(lambda x: x, name="cpu", device="cpu")  # graphs off on a CPU: nothing to wait for
    assert cpu.warming() == {} and warm_up(_Pipe(cpu), lambda: cpu(torch.zeros(1))) == 1
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match=r"n=.* is not allowed; allowed values: an integer >= 0"):
            warm_up(_Pipe(), lambda: None, bad)


def test_the_wma_warm_up_after_the_first_run_is_a_two_step_iteration():
    from wmbook.workloads import E2ESize

    assert workloads.get("wma").graph_warmup_size(E2ESize(blocks=3, ddim_steps=50)) == E2ESize(blocks=3, ddim_steps=2)
    assert workloads.get("wma").graph_warmup_size(E2ESize(ddim_steps=1)).ddim_steps == 1
    assert workloads.get("mg2").graph_warmup_size(E2ESize(blocks=4)) == E2ESize(blocks=4)  # blocks fill caches


@GPU
def test_after_the_warm_up_a_run_only_replays_the_graphs_a_run_calls_once():
    """Notebook 06's wma graphs on a GPU at the tiny shape: the conditioning's and the decoder's graphs, called once an
    iteration, are captured by warm_up (a full run, then two-step iterations), so the next iteration, a timed one,
    makes no eager call and no capture: it only replays."""
    from wmbook.variants.builtin import graph_calls, graphed_callables, warm_up
    from wmbook.variants.ladder import apply_stack
    from wmbook.workloads import E2ESize

    wl, dev = workloads.get("wma"), torch.device("cuda")
    ref = wl.reference_pipeline(wl.presets["tiny-wma"], dev)
    pipe, _ = apply_stack(ref, wl, ["bf16", "skip-unused-decode", "cuda-graphs", "conditioning-cuda-graphs",
                                    "vae-decoder-bf16", "vae-batch-frames", "vae-cuda-graphs"], dev)
    size = E2ESize(ddim_steps=3)
    with torch.no_grad():
        runs = warm_up(pipe, lambda: wl.end_to_end(pipe, 0, size),
                       again=lambda: wl.end_to_end(pipe, 0, wl.graph_warmup_size(size)))
        before = graph_calls(pipe)
        wl.end_to_end(pipe, 0, size)
    after = graph_calls(pipe)
    assert runs == 3 and set(after) == set(before), (runs, before, after)  # no signature new to the timed run
    assert all(after[k][0] == before[k][0] for k in after), (before, after)  # no eager call
    once = {"image tokens", "VAE encoder", "decoder step"}
    assert once <= {g.name for g in graphed_callables(pipe)}
    for key, (_, replays) in after.items():
        if key[0] in once:
            assert replays > before[key][1], (key, before, after)  # replayed, not captured
    assert not any(g.failures for g in graphed_callables(pipe))
