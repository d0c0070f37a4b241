"""The motion workload's library, quaternion math, eager reference and variants, against float64 references."""

from __future__ import annotations

import math

import pytest
import torch

from wmbook.motion import MOTION_PRESETS
from wmbook.motion import fetch as F
from wmbook.motion import quat as Q
from wmbook.motion import variants as mv
from wmbook.motion.library import generate
from wmbook.studies import motion_report as report
from wmbook.studies.motion import gate_state

TINY = MOTION_PRESETS["tiny-motion"].with_(num_motions=8)  # a few looping clips and a few clamping ones


@pytest.fixture(scope="module")
def lib():
    lib = generate(TINY, seed=0)
    assert lib.loop.any() and (~lib.loop).any()
    return lib


@pytest.fixture(scope="module")
def lib64(lib):
    return lib.to(dtype=torch.float64)


def _unit(g, *shape, dtype=torch.float64):
    q = torch.randn(*shape, 4, generator=g, dtype=dtype)
    return q / torch.linalg.vector_norm(q, dim=-1, keepdim=True)


def _same_rotation(a, b, atol):
    """a and b [..., 4] are the same rotations up to sign, within atol."""
    sign = torch.where((a * b).sum(-1, keepdim=True) < 0, -1.0, 1.0).to(a.dtype)
    torch.testing.assert_close(a * sign, b, atol=atol, rtol=0)


# --- quaternions ---------------------------------------------------------------------------------------------------

def test_quaternion_rotation_identities():
    g = torch.Generator().manual_seed(0)
    q, v = _unit(g, 64), torch.randn(64, 3, generator=g, dtype=torch.float64)
    torch.testing.assert_close(Q.quat_apply(q, v), (Q.quat_to_matrix(q) @ v.unsqueeze(-1)).squeeze(-1))
    torch.testing.assert_close(Q.quat_apply_inverse(q, Q.quat_apply(q, v)), v)
    torch.testing.assert_close(Q.quat_apply(Q.quat_mul(q, Q.quat_conjugate(q)), v), v)
    # (x, y, z, w): a quarter turn about z takes x to y
    qz = Q.quat_from_axis_angle(torch.tensor([0.0, 0.0, 1.0], dtype=torch.float64), torch.tensor(math.pi / 2,
                                                                                                  dtype=torch.float64))
    torch.testing.assert_close(Q.quat_apply(qz, torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64)),
                               torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64))


@pytest.mark.parametrize("t", [0.0, 0.3, 0.5, 1.0])
def test_slerp_random_inputs_and_ends(t):
    g = torch.Generator().manual_seed(1)
    q0, q1 = _unit(g, 500), _unit(g, 500)
    exact = Q.slerp_exact(q0, q1, t)
    out = Q.slerp(q0.float(), q1.float(), torch.full((500, 1), t))
    torch.testing.assert_close(out.double(), exact, atol=2e-6, rtol=0)  # same sign too: the short arc from q0
    torch.testing.assert_close(Q.slerp(q0, q1, torch.full((500, 1), t, dtype=torch.float64)), exact, atol=1e-12,
                               rtol=0)
    if t == 0.0:
        torch.testing.assert_close(out, q0.float(), atol=1e-6, rtol=0)
    if t == 1.0:
        _same_rotation(out, q1.float(), atol=1e-6)


def test_slerp_equal_opposite_and_near_parallel():
    g = torch.Generator().manual_seed(2)
    q0 = _unit(g, 50)
    t = torch.rand(50, 1, generator=g, dtype=torch.float64)
    for q1 in (q0.clone(), -q0):  # exactly equal, exactly opposite (the same rotation): q0, never NaN
        out = Q.slerp(q0.float(), q1.float(), t.float())
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, q0.float(), atol=1e-6, rtol=0)
    for angle in (1e-7, 1e-5, 1e-3, 3e-3):  # near parallel, both sides of the normalized-lerp threshold
        axis = torch.nn.functional.normalize(torch.randn(50, 3, generator=g, dtype=torch.float64), dim=-1)
        q1 = Q.quat_mul(q0, Q.quat_from_axis_angle(axis, torch.full((50,), angle, dtype=torch.float64)))
        for sign in (1.0, -1.0):  # the flipped copy takes the same short arc
            exact = Q.slerp_exact(q0, sign * q1, t)
            torch.testing.assert_close(Q.slerp(q0.float(), (sign * q1).float(), t.float()).double(), exact, atol=1e-6,
                                       rtol=0)
            torch.testing.assert_close(Q.slerp(q0, sign * q1, t), exact, atol=1e-9, rtol=0)  # nlerp: O(theta^3)


# --- the library -------------------------------------------------------------------------------------------------

def test_library_is_deterministic_and_well_formed(lib):
    again = generate(TINY, seed=0)
    assert all(torch.equal(lib.fields[k], again.fields[k]) for k in lib.fields)
    assert torch.equal(lib.start, again.start) and torch.equal(lib.loop, again.loop)
    other = generate(TINY, seed=1)
    assert not torch.equal(lib.fields["root_pos"][:10], other.fields["root_pos"][:10])
    n = lib.num_frames
    assert int(n.sum()) == lib.total_frames and torch.equal(lib.start, torch.cumsum(n, 0) - n)
    assert (n >= 2).all() and set(lib.fps.tolist()) <= set(TINY.fps_choices)
    torch.testing.assert_close(lib.length, (n - 1).float() * lib.dt)
    assert lib.fields["body_rot"].shape == (lib.total_frames, 30, 4) and lib.fields["dof_pos"].shape[1] == 29
    for k in ("root_rot", "body_rot"):
        torch.testing.assert_close(torch.linalg.vector_norm(lib.fields[k], dim=-1),
                                   torch.ones(lib.fields[k].shape[:-1]), atol=1e-6, rtol=0)
    torch.testing.assert_close(lib.fields["body_pos"][:, 0], lib.fields["root_pos"])  # body 0 is the pelvis
    flipped = (lib.fields["body_rot"][:-1] * lib.fields["body_rot"][1:]).sum(-1) < 0  # stored negated next frame
    assert 0.2 < flipped.float().mean() < 0.5
    for kind in ("packed", "grouped"):
        lay = lib.layout(kind)
        rows = getattr(lib, kind)()
        assert rows.shape == (lib.total_frames, 281)
        assert all(torch.equal(v.reshape(lib.fields[k].shape), lib.fields[k]) for k, v in lay.views(rows).items())


# --- the reference ---------------------------------------------------------------------------------------------

def test_frame_blend_at_clip_ends(lib):
    for m in (int(torch.nonzero(~lib.loop)[0]), int(torch.nonzero(lib.loop)[0])):
        L, n, s, dt = float(lib.length[m]), int(lib.num_frames[m]), int(lib.start[m]), float(lib.dt[m])
        times = torch.tensor([-1.0, 0.0, 0.5 * dt, L - 1e-4, L, L + 0.25 * dt, 2 * L + 0.5 * dt])
        f0, f1, b = F.calc_frame_blend(lib, torch.full((7,), m), times)
        assert (f0 >= s).all() and (f1 < s + n).all() and (f1 - f0 <= 1).all() and ((b >= 0) & (b <= 1)).all()
        assert (f0[1], f1[1], float(b[1])) == (s, s + 1, 0.0)
        assert abs(float(b[2]) - 0.5) < 1e-3 and f0[2] == s
        if bool(lib.loop[m]):  # the end is the start again
            assert f0[0] == s + int((-1.0 % L) / L * (n - 1))  # before 0: wrapped into the clip
            assert (f0[4], float(b[4])) == (s, 0.0)
            assert f0[5] == s and abs(float(b[5]) - 0.25) < 1e-3
            assert f0[6] == s and abs(float(b[6]) - 0.5) < 1e-3
        else:  # clamped at both ends
            assert (f0[0], float(b[0])) == (s, 0.0)
            assert f0[4] == f1[4] == s + n - 1 and float(b[4]) == 0.0
            assert f0[5] == f0[6] == s + n - 1 and f1[6] == s + n - 1


def test_state_at_a_frame_is_that_frame_in_the_root_frame(lib64):
    ids = torch.tensor([0, 1, 2, 3])
    frames = torch.tensor([0, 3, 1, 0])
    times = frames.double() * lib64.dt[ids]
    s = F.get_motion_state(lib64, ids, times, F.no_label)
    rows = lib64.start[ids] + frames
    w = {k: v[rows] for k, v in lib64.fields.items()}
    torch.testing.assert_close(s.root_pos, w["root_pos"])
    _same_rotation(s.root_rot, w["root_rot"], atol=1e-12)
    tol = dict(atol=1e-6, rtol=0)  # the stored fp32 quaternions are unit to ~1e-7: q * conj(q) is not exactly 1
    body = Q.quat_apply(w["root_rot"].unsqueeze(1).expand(-1, 30, -1), s.body_pos_b) + w["root_pos"].unsqueeze(1)
    torch.testing.assert_close(body, w["body_pos"], **tol)
    _same_rotation(Q.quat_mul(w["root_rot"].unsqueeze(1).expand(-1, 30, -1), s.body_rot_b), w["body_rot"], atol=1e-6)
    torch.testing.assert_close(Q.quat_apply(w["root_rot"], s.root_lin_vel_b), w["root_lin_vel"], **tol)
    torch.testing.assert_close(s.dof_vel, w["dof_vel"])


def test_fp32_reference_matches_float64_and_the_gate_catches_errors(lib, lib64):
    term = F.MotionDataTerm(lib, 96, 2)
    term.reset(*F.sample_queries(lib, 96, seed=3, spread=(-0.5, 2.5)))  # clamped and wrapped times too
    ids, times = term.prepare_query()
    ref = F.get_motion_state(lib64, ids, times.double(), F.no_label)
    state = term.fetch()
    assert state.body_rot_b.shape == (96, 2, 30, 4)
    g = gate_state(state, ref)
    assert g.passed and max(g.rel_l2().values()) < 1e-6, g.table()
    flipped = F.MotionState(**{k: (-v if k == "body_rot_b" else v) for k, v in state.items()})
    assert gate_state(flipped, ref).passed  # q and -q: the same rotation
    bad = F.MotionState(**{k: (v + 1e-3 if k == "dof_vel" else v) for k, v in state.items()})
    g = gate_state(bad, ref, anchors=gate_state(state, ref).rel_l2())
    assert not g.passed and g.worst == "dof_vel" and not g.fields["dof_vel"].passed and g.fields["dof_pos"].passed


def test_term_fetches_future_frames_and_steps(lib):
    term = F.MotionDataTerm(lib, 5, 3, step_dt=0.02)
    ids, times = F.sample_queries(lib, 5, seed=4)
    term.reset(ids, times)
    s = term.fetch().dof_pos.clone()
    for k in range(3):
        one = F.MotionDataTerm(lib, 5, 1)
        one.reset(ids, times + 0.02 * k)
        torch.testing.assert_close(one.fetch().dof_pos[:, 0], s[:, k])
    term.step()
    torch.testing.assert_close(term.episode_times, times + 0.02)
    with pytest.raises(ValueError, match="num_envs=0 is not allowed"):
        F.MotionDataTerm(lib, 0)


# --- the variants --------------------------------------------------------------------------------------------------

def test_every_variant_matches_the_float64_reference(lib, lib64):
    ctx = mv.MotionContext(device=torch.device("cpu"), compile_backend="aot_eager")
    ids, times = F.sample_queries(lib, 40, seed=5, spread=(-0.3, 2.0))
    ref_term = F.MotionDataTerm(lib, 40, 2)
    ref_term.reset(ids, times)
    qi, qt = ref_term.prepare_query()
    ref = F.get_motion_state(lib64, qi, qt.double(), F.no_label)
    anchors = gate_state(ref_term.fetch(), ref).rel_l2()
    names = mv.known("cpu")
    assert names == ["packed-gather", "contiguous-layout", "fused-quat", "compile", "triton"]
    for i in range(1, len(names) + 1):
        term = mv.apply_stack(names[:i], lib, 40, 2, ctx=ctx)
        term.reset(ids, times)
        for _ in range(2):
            state = term.fetch()
        g = gate_state(state, ref, anchors)
        assert g.passed, (names[:i], g.table())
    assert mv.effective(names) == ["packed-gather", "contiguous-layout", "triton"]
    assert "interpreter" in ctx.notes["triton"] or "reference" in ctx.notes["triton"]


def test_variant_stacks_are_checked_before_any_work():
    with pytest.raises(mv.UnknownMotionVariantError, match=r"variant 'turbo' is not known; known variants: "
                                                          r"\['packed-gather', 'contiguous-layout'"):
        mv.resolve(["packed-gather", "turbo"])
    with pytest.raises(ValueError, match=r"'fused-quat' needs \['contiguous-layout'\] before it"):
        mv.resolve(["packed-gather", "fused-quat"])
    with pytest.raises(ValueError, match="listed more than once"):
        mv.resolve(["compile", "compile"])
    with pytest.raises(ValueError, match="'cuda-graph' needs a CUDA device"):
        mv.resolve(["cuda-graph"], "cpu")
    assert "cuda-graph" not in mv.known("cpu") and mv.known()[-1] == "cuda-graph"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and the compiled Triton kernel need a GPU")
def test_gpu_stack_with_graph_replays_matches_reference():
    lib = generate(MOTION_PRESETS["tiny-motion"], seed=0).to("cuda")
    lib64 = lib.to(dtype=torch.float64)
    term = mv.apply_stack(mv.known("cuda"), lib, 256, 2, ctx=mv.MotionContext(device=torch.device("cuda")))
    term.reset(*F.sample_queries(lib, 256, seed=6))
    for _ in range(5):
        state = term.fetch()
    assert term._fetch.captured == 1 and term._fetch.failures == []
    ids, times = term.prepare_query()
    assert gate_state(state, F.get_motion_state(lib64, ids, times.double(), F.no_label)).passed


def test_graph_replay_floor_is_none_without_a_gpu():
    from wmbook.bench import graph_replay_floor

    assert graph_replay_floor("cpu") is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="a CUDA graph needs a GPU")
def test_graph_replay_floor_and_calls_in_one_graph_on_the_gpu():
    from wmbook.bench import graph_replay_floor

    rp = graph_replay_floor("cuda", calls=20, rounds=5)
    assert len(rp.loop.values) == 5 and 0 < rp.ms < 1.0 and 0 < rp.host_ms < 1.0  # microseconds, not milliseconds
    from wmbook.bench import time_in_graph

    x = torch.zeros(1, device="cuda")
    per = time_in_graph(lambda: x.add_(1), 8, rounds=5)
    assert len(per.values) == 5 and 0 < per.median < 1.0  # microseconds per call
    assert x.item() >= 8 * 5  # the captured calls ran on every replay (warm-ups too)


def test_the_replay_floor_enters_the_floor_table_rows_and_interpretation():
    """With a measured replay floor (faked here: the CPU has none) the floor table, the results rows and the
    interpretation give it and the best loop against the larger floor; without one (the CPU run) they leave it out."""
    import dataclasses

    from wmbook.bench import ReplayFloor, Samples
    from wmbook.studies import motion as study

    cfg = study.validate(preset="tiny-motion", device="cpu", steps="packed-gather", warmup=1, repeats=3,
                         scaling_envs="64")
    s = study.setup(cfg, {"copy_gbps": 100.0, "device_name": "test"})
    lad = study.run_ladder(s)
    assert lad.replay is None
    assert not any("replay" in q for q in study.floor_table(s, lad).index)
    assert "replays at" not in report.interpret(cfg, s, lad)
    assert study.step_floor_ms(s, lad) == s.floor_ms()

    floor = 10 * s.floor_ms()
    lad = dataclasses.replace(lad, replay=ReplayFloor(Samples([floor, floor, floor], "ms"), host_ms=floor / 2))
    assert study.step_floor_ms(s, lad) == pytest.approx(floor)
    tab = study.floor_table(s, lad)["value"]
    best = lad.best()
    assert tab["step floor ms (the larger floor)"] == pytest.approx(floor)
    assert tab["best in a loop x step floor"] == pytest.approx(best.loop.median / floor)
    rows = {r["metric"]: r for r in report.result_rows(cfg, s, lad)}
    assert rows["graph_replay_floor_ms"]["value"] == pytest.approx(floor)
    assert rows["graph_replay_host_ms"]["value"] == pytest.approx(floor / 2)
    text = report.interpret(cfg, s, lad)
    assert f"replays at {floor * 1e3:.1f} us" in text and "the replay's own cost" in text
    assert lad.in_graph is None and "fetches in one graph" not in text  # nothing captured on the CPU

    # the best row's fetch with IN_GRAPH_K fetches in one graph (faked): table, rows, text, against the loop
    per = best.loop.median / 4
    lad = dataclasses.replace(lad, in_graph=Samples([per, per, per], "ms"), in_graph_stack="packed-gather")
    tab = study.floor_table(s, lad)["value"]
    assert tab[f"packed-gather, {study.IN_GRAPH_K} fetches in one graph: ms per fetch"] == pytest.approx(per)
    assert tab["in one graph x bytes floor"] == pytest.approx(per / s.floor_ms())
    rows = {(r["metric"], r["variant"]): r for r in report.result_rows(cfg, s, lad)}
    assert rows[("in_graph_fetch_ms", "packed-gather")]["value"] == pytest.approx(per)
    assert rows[("in_graph_fetch_ms", "packed-gather")]["n"] == 3
    text = report.interpret(cfg, s, lad)
    assert f"{study.IN_GRAPH_K} fetches captured in one graph" in text and f"{per * 1e3:.1f} us a fetch" in text
    assert f"the other {(best.loop.median - per) * 1e3:.1f} us of the loop's step" in text


def test_time_in_graph_refuses_a_bad_k_and_needs_a_gpu():
    from wmbook.bench import time_in_graph

    with pytest.raises(ValueError, match="k=0 is not allowed"):
        time_in_graph(lambda: None, 0)
    assert time_in_graph(lambda: None, 4, device="cpu") is None
