"""The reference sampler's DDIM update with device-side coefficients (`WMAInteractionPipeline.update_step`), what the
wma workload's cuda-graphs variant captures as one graph for every step (notebook 06).

On a CPU: `update_step` equals `ddim_update` + the heads' diffusers `DDIMScheduler.step` bit for bit, step after
step; a whole iteration with `device_update` on equals the default one; the wma graph targets switch it on. On a
GPU: the same equality with CUDA tensors (diffusers divides by a CPU scalar as a multiplication by its reciprocal
there) and the captured iteration equals the eager one.
"""

from __future__ import annotations

from contextlib import contextmanager

import pytest
import torch

from wmbook import workloads
from wmbook.graphs import GraphedCallable
from wmbook.pipelines.ddim import ddim_table, ddim_update, head_coef_table, video_coef_table

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and the CUDA kernels' rounding need a "
                                                                "CUDA device")


# the tiny-wma pipeline and inputs of the pipeline tests, on one thread (module-scoped fixtures, shared)
from test_wma_pipeline import _one_thread, inputs, pipe  # noqa: E402, F401

pytestmark = pytest.mark.numerics  # rerun with oneDNN and ATen held to older ISAs: `make test-isa`


def _chains(pipe, steps: int, eta: float, device, out_dtype=torch.float32, seed: int = 0) -> tuple[int, int]:
    """Step the reference update and `update_step` side by side from the same state with the same (random, large
    enough to clip the heads' x0) model outputs; assert equality after every step. Returns (steps, clipped steps)."""
    p = pipe.preset
    for s in (pipe.scheduler, pipe.action_scheduler, pipe.state_scheduler):
        s.set_timesteps(steps)
    table = ddim_table(p, pipe.scheduler, steps, eta)
    ts = table.timesteps
    vtab = video_coef_table(table, device)
    atab, stab = head_coef_table(pipe.action_scheduler, ts, device), head_coef_table(pipe.state_scheduler, ts, device)
    assert vtab.shape == atab.shape == stab.shape == (steps, 5) and vtab.dtype == torch.float32
    g = torch.Generator("cpu").manual_seed(seed)

    def rand(*shape, scale=1.0):
        return (torch.randn(shape, generator=g) * scale).to(device)

    x, act, st = rand(2, *p.latent_shape), rand(2, p.horizon, p.agent_action_dim), rand(2, p.horizon, p.agent_state_dim)
    x2, act2, st2 = x.clone(), act.clone(), st.clone()
    clipped = 0
    for j, t in enumerate(ts):
        v, ea, es = (o.to(out_dtype) for o in (rand(*x.shape, scale=2.0), rand(*act.shape, scale=3.0),
                                               rand(*st.shape, scale=3.0)))
        noise = rand(*x.shape)
        ref_x, _ = ddim_update(table, j, x, v.float(), None, noise=noise)
        step_a = pipe.action_scheduler.step(ea.float(), t, act)
        ref_act = step_a.prev_sample
        ref_st = pipe.state_scheduler.step(es.float(), t, st).prev_sample
        clipped += bool((step_a.pred_original_sample.abs() == 1.0).any())
        nz = noise if table.sigma[j] > 0.0 else torch.zeros_like(noise)
        x2, act2, st2 = pipe.update_step(x2, act2, st2, v, ea, es, nz, vtab[j], atab[j], stab[j])
        for name, a, b in (("video", ref_x, x2), ("actions", ref_act, act2), ("states", ref_st, st2)):
            assert a.dtype == b.dtype == torch.float32
            assert torch.equal(a, b), (f"{name} differs at step {j} (t={t}, {steps} steps, eta {eta}): max abs "
                                       f"{(a - b).abs().max().item():.3g}")
        x, act, st = ref_x, ref_act, ref_st
    return len(ts), clipped


# --- CPU ----------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("steps", [3, 5])
@pytest.mark.parametrize("eta", [1.0, 0.0])
def test_update_step_equals_ddim_update_and_head_steps(pipe, steps, eta):
    n, clipped = _chains(pipe, steps, eta, torch.device("cpu"))
    assert n == steps and clipped >= 1  # the heads' clamp was exercised


def test_update_step_takes_low_precision_model_outputs(pipe):
    """A bf16 model's outputs are upcast inside, as the reference's `.float()` calls do."""
    _chains(pipe, 5, 1.0, torch.device("cpu"), out_dtype=torch.bfloat16, seed=1)


def test_head_coef_table_checks_its_scheduler(pipe):
    pipe.action_scheduler.set_timesteps(3)
    with pytest.raises(ValueError, match="set to 3 steps, not 5"):
        head_coef_table(pipe.action_scheduler, [999, 799, 599, 399, 199])
    with pytest.raises(ValueError, match="prediction_type='v_prediction'"):
        head_coef_table(pipe.scheduler, [999, 666, 332])


@contextmanager
def _count_update_steps(pipe):
    """A list that grows by one per `pipe.update_step` call (the instance attribute removed again after)."""
    calls = []
    pipe.update_step = lambda *a: calls.append(1) or type(pipe).update_step(pipe, *a)
    try:
        yield calls
    finally:
        del pipe.update_step


@pytest.mark.parametrize("guidance_scale", [1.0, 2.0])
def test_iteration_with_device_update_equals_the_default(pipe, inputs, guidance_scale):
    assert pipe.device_update is False  # off by default
    for eta, steps in ((1.0, 3), (0.0, 5)):
        with _count_update_steps(pipe) as calls:
            a = pipe.run_iteration(inputs, progress=False, guidance_scale=guidance_scale, eta=eta, ddim_steps=steps)
            assert not calls
            pipe.device_update = True
            try:
                b = pipe.run_iteration(inputs, progress=False, guidance_scale=guidance_scale, eta=eta,
                                       ddim_steps=steps)
            finally:
                pipe.device_update = False
        assert len(calls) == 2 * steps  # every step of both passes
        ra, rb = a.reference(), b.reference()
        assert set(ra) == set(rb)
        for k in ra:
            assert torch.equal(ra[k], rb[k]), f"{k} differs (guidance {guidance_scale}, eta {eta}, {steps} steps)"


def test_device_tables_are_copied_once_per_step_table_and_batch(pipe, inputs, monkeypatch):
    """A pass's coefficient tables go to the device at their first use only: a copy from pageable host memory waits
    for the stream to drain, which left the GPU idle at every pass's start. The kept tables give the same iteration."""
    import wmbook.pipelines.ddim as ddim_mod

    made = []
    real = ddim_mod.video_coef_table
    monkeypatch.setattr(ddim_mod, "video_coef_table", lambda *a, **k: made.append(1) or real(*a, **k))
    pipe.__dict__.pop("_device_table_cache", None)
    pipe.device_update = True
    try:
        a = pipe.run_iteration(inputs, progress=False, ddim_steps=3, eta=1.0)
        assert len(made) == 1  # both passes: one table (3 steps, eta 1, one batch)
        b = pipe.run_iteration(inputs, progress=False, ddim_steps=3, eta=1.0)
        assert len(made) == 1
        pipe.run_iteration(inputs, progress=False, decision_steps=2, world_steps=3, eta=1.0)
        assert len(made) == 2  # the 2-step table is new
    finally:
        pipe.device_update = False
        pipe.__dict__.pop("_device_table_cache", None)
    ra, rb = a.reference(), b.reference()
    for k in ra:
        assert torch.equal(ra[k], rb[k]), k


def test_multistep_solvers_keep_their_eager_update(pipe, inputs):
    with _count_update_steps(pipe) as calls:
        a = pipe.run_iteration(inputs, progress=False, solver="dpmsolver++", decode_decision=False)
        pipe.device_update = True
        try:
            b = pipe.run_iteration(inputs, progress=False, solver="dpmsolver++", decode_decision=False)
        finally:
            pipe.device_update = False
    assert not calls
    assert all(torch.equal(x, y) for x, y in zip(a.reference().values(), b.reference().values()))


def test_wma_graph_targets_capture_forward_and_update(pipe, inputs):
    """The workload's targets switch device_update on; wrapped (eagerly, on a CPU) they give the default outputs."""
    import copy

    wl = workloads.get("wma")
    ref = pipe.run_iteration(inputs, progress=False).reference()
    p2 = copy.deepcopy(pipe)
    targets = wl.graph_targets(p2)
    assert p2.device_update is True and pipe.device_update is False
    assert [(t.owner, t.attr) for t in targets] == [(p2.model, "forward"), (p2, "update_step")]
    wrapped = []
    for t in targets:
        g = GraphedCallable(getattr(t.owner, t.attr), name=t.name, device="cpu")
        setattr(t.owner, t.attr, g)
        wrapped.append(g)
    out = p2.run_iteration(inputs, progress=False).reference()
    assert all(torch.equal(ref[k], out[k]) for k in ref)
    for g in wrapped:
        assert g.table()["why not"].iloc[0].startswith("CUDA graphs need a CUDA device")


# --- GPU ----------------------------------------------------------------------------------------------------------


@GPU
@pytest.mark.parametrize("eta", [1.0, 0.0])
def test_update_step_equals_the_reference_on_cuda(pipe, eta):
    """CUDA rounds diffusers' division by sqrt(alpha_bar_t) (a CPU scalar) as a multiplication by its reciprocal;
    update_step does the same there."""
    _chains(pipe, 5, eta, torch.device("cuda"))


@GPU
@pytest.mark.parametrize("guidance_scale", [1.0, 2.0])
def test_cuda_graphs_variant_equals_eager_on_the_tiny_wma(guidance_scale):
    from wmbook.variants.builtin import graphed_callables
    from wmbook.variants.ladder import apply_stack

    wl = workloads.get("wma")
    dev = torch.device("cuda")
    ref = wl.reference_pipeline(wl.presets[wl.tiny_preset], dev)
    eager, _ = apply_stack(ref, wl, [], dev)
    graphed, _ = apply_stack(ref, wl, ["cuda-graphs"], dev)
    assert graphed.device_update is True and eager.device_update is False
    inputs = eager.prepare(seed=3)
    steps = 3  # decision pass: 2 warm-up calls, the capture; world-model pass: replays
    for _ in range(2):  # the second iteration replays in both passes
        a = eager.run_iteration(inputs, progress=False, guidance_scale=guidance_scale, ddim_steps=steps).reference()
        b = graphed.run_iteration(inputs, progress=False, guidance_scale=guidance_scale, ddim_steps=steps).reference()
        for k in a:
            torch.testing.assert_close(a[k], b[k], rtol=0, atol=0, msg=lambda m, k=k: f"{k}: {m}")
    gs = graphed_callables(graphed)
    assert [g.name for g in gs] == ["UNet + action/state heads forward", "DDIM update (video + action/state heads)"]
    for g in gs:
        t = g.table()
        assert g.captured >= 1 and not g.failures, t.to_string()
        assert int(t["replays"].sum()) > 0, t.to_string()
    upd = gs[1].table()
    assert len(upd) == 1  # one signature: one graph serves every step of both passes
    assert int(upd["replays"].iloc[0]) == 2 * (2 * steps) - 3  # 2 iterations x 2 passes x steps, less warm-up+capture
