"""The fused motion-fetch kernel against its reference and the float64 eager reference (under the Triton interpreter
on a CPU), its custom op, its input checks and its bytes count."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")  # on a CPU, TRITON_INTERPRET=1 (conftest): kernels run in the interpreter

import torch  # noqa: E402

from wmbook.motion import MOTION_PRESETS  # noqa: E402
from wmbook.motion import fetch as F  # noqa: E402
from wmbook.motion import kernel as K  # noqa: E402
from wmbook.motion.library import generate  # noqa: E402
from wmbook.studies.motion import gate_state  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _args(lib, ids, times, k):
    return (lib.grouped(), lib.start, lib.num_frames, lib.length, lib.dt, lib.loop.to(torch.int32), ids, times,
            torch.arange(k, dtype=torch.float32, device=lib.device) * 0.02, lib.num_joints, lib.num_bodies)


@pytest.mark.parametrize("joints,bodies,envs,k", [(29, 30, 37, 2), (5, 3, 129, 1), (1, 1, 7, 3)])
def test_kernel_matches_reference_and_float64(joints, bodies, envs, k):
    """Odd sizes (tiles partly masked, more than one program), times before, inside and past every clip."""
    lib = generate(MOTION_PRESETS["tiny-motion"].with_(num_joints=joints, num_bodies=bodies, num_motions=5),
                   seed=joints).to(DEV)
    ids, times = F.sample_queries(lib, envs, seed=envs, spread=(-0.5, 2.5))
    ends = torch.arange(envs, device=DEV) % 3 == 0  # exactly at a clip's end for a third of the robots
    times = torch.where(ends, lib.length[ids], times)
    args = _args(lib, ids, times, k)
    width = 3 * (bodies + 3) + 2 * joints + 4 * (bodies + 1)
    out = torch.full((envs * k, width), float("nan"), device=DEV)  # poisoned: every element must be written
    K.motion_fetch(*args, out=out)
    ref = K.motion_fetch_ref(*args)
    torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
    term = F.MotionDataTerm(lib, envs, k)
    term.reset(ids, times)
    qi, qt = term.prepare_query()
    ref64 = F.get_motion_state(lib.to(dtype=torch.float64), qi, qt.double(), F.no_label)
    g = gate_state(F.state_from_rows(out.view(envs, k, width), joints, bodies), ref64)
    assert g.passed, g.table()


def test_custom_op_bad_input_and_bytes():
    lib = generate(MOTION_PRESETS["tiny-motion"].with_(num_motions=3), seed=0)
    ids, times = F.sample_queries(lib, 4, seed=0)
    args = _args(lib, ids, times, 2)
    torch.library.opcheck(K.motion_fetch_op, args)
    assert K.motion_fetch_op(*args).shape == (8, 281)
    with pytest.raises(ValueError, match=r"table must be fp32 \[frames, 281\]"):
        K.motion_fetch(lib.packed()[:, :100], *args[1:])
    with pytest.raises(ValueError, match="motion_ids must be int64"):
        K.motion_fetch(*args[:6], ids.int(), *args[7:])
    with pytest.raises(ValueError, match="out must be contiguous"):
        K.motion_fetch(*args, out=torch.empty(8, 281)[:, :280])
    # two frame rows read and one state written per query, clip ids and times per robot, five values per clip
    assert K.motion_fetch_bytes(*args[:1], lib.start, ids, args[8]) == 3 * 8 * 281 * 4 + 4 * 12 + 3 * 28


def test_block_size_is_tuned_per_query_count_on_cuda():
    """On CUDA the queries per program and warps come from triton.autotune over TUNE_CONFIGS, one pick per query
    count (tuned_config reports it); on a CPU the interpreter's one fixed block, nothing tuned."""
    assert {bq for bq, _ in K.TUNE_CONFIGS} >= {1, 8} and all(nw in (1, 2, 4) for _, nw in K.TUNE_CONFIGS)
    lib = generate(MOTION_PRESETS["tiny-motion"].with_(num_joints=5, num_bodies=3, num_motions=4), seed=1).to(DEV)
    ids, times = F.sample_queries(lib, 33, seed=2)
    out = K.motion_fetch(*_args(lib, ids, times, 2))
    torch.testing.assert_close(out, K.motion_fetch_ref(*_args(lib, ids, times, 2)), atol=2e-5, rtol=1e-5)
    picked = K.tuned_config(66)
    if DEV == "cuda":
        assert picked is not None and (picked["BLOCK_Q"], picked["num_warps"]) in K.TUNE_CONFIGS
        assert K.tuned_config(67) is None  # not measured at that count
    else:
        assert picked is None
