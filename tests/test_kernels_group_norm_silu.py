"""GroupNorm + SiLU kernel against its reference (on a GPU, or the Triton interpreter on a CPU), and its custom op."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")  # on a CPU, TRITON_INTERPRET=1 (conftest): kernels run in the interpreter

import torch  # noqa: E402

from wmbook.kernels import group_norm_silu as gns  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # a GPU where there is one, else the interpreter
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}
FORMAT = {4: torch.channels_last, 5: torch.channels_last_3d}


def _inputs(shape, dtype, channels_last, with_add, seed):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=g) * 3 + 1).to(DEV, dtype)
    if channels_last:
        x = x.contiguous(memory_format=FORMAT[x.dim()])
    c = shape[1]
    weight, bias = torch.randn(c, generator=g).to(DEV), torch.randn(c, generator=g).to(DEV)
    add = (torch.randn(shape[0], c, generator=g) * 2).to(DEV, dtype) if with_add else None
    return x, weight, bias, add




@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("shape,groups,with_add", [
    ((2, 96, 5, 7), 32, True),  # 3 channels a group, 35 positions: a group fills no power of two
    ((1, 40, 3, 5, 6), 8, False),  # 5-D video, 5 channels a group
    ((1, 40, 3, 5, 6), 8, True),
    ((1, 6, 1, 1), 1, True),  # a single group and a single position
    ((1, 4, 4, 64, 64), 1, False),  # a long group: 65536 elements in 64 chunks, merged
])
@pytest.mark.parametrize("path", ["three kernels", "size rule"])
def test_group_norm_silu_matches_reference(poisoned, monkeypatch, dtype, channels_last, shape, groups, with_add,
                                           path):
    """Channels-last by the three kernels at any size, or by the launcher's size rule with any program count (the
    one-launch kernel at these sizes but the long group's)."""
    if path == "three kernels":
        monkeypatch.setattr(gns, "_CL_ONE_MAX", 0)
    elif not channels_last:
        pytest.skip("channels-first has no one-launch path")
    else:
        monkeypatch.setattr(gns, "_CL_ONE_MAX", gns._CL_ONE_RULE_MAX)  # the rule on (off by default)
        monkeypatch.setattr(gns, "_CL_ONE_PROGRAMS", 1)  # the tiny shapes' few programs: the rule picks one launch
    x, weight, bias, add = _inputs(shape, dtype, channels_last, with_add, seed=shape[1] + len(shape))
    out = gns.group_norm_silu(x, weight, bias, groups, 1e-5, add)
    assert out.stride() == x.stride()  # the input's memory format kept
    torch.testing.assert_close(out, gns.group_norm_silu_ref(x, weight, bias, groups, 1e-5, add), **TOL[dtype])
    # the reference equals the model's unfused sequence: h + emb, GroupNorm32 (fp32, cast back), then SiLU
    h = x + add.reshape(*add.shape, *([1] * (x.dim() - 2))) if with_add else x
    norm = torch.nn.GroupNorm(groups, shape[1], eps=1e-5).to(DEV)
    with torch.no_grad():
        norm.weight.copy_(weight)
        norm.bias.copy_(bias)
        want = torch.nn.functional.silu(norm(h.float()).to(x.dtype))
    torch.testing.assert_close(gns.group_norm_silu_ref(x, weight, bias, groups, 1e-5, add), want, **TOL[dtype])


def test_group_norm_silu_one_chunk_loops_over_the_group(poisoned, monkeypatch):
    """With one program per group, each program walks its whole group in blocks (Chan's merge inside a program)."""
    monkeypatch.setattr(gns, "_TARGET_PROGRAMS", 1)
    monkeypatch.setattr(gns, "_BLOCK", 1024)
    assert gns._split(2, 2 * 4 * 32 * 33) == (1024, 16, 1)  # 9 blocks a group, 16 iterations: 7 empty
    for channels_last in (False, True):
        x, weight, bias, add = _inputs((1, 4, 4, 32, 33), torch.float32, channels_last, True, seed=7)
        x = x + 50  # a mean far from zero: a naive sum of squares would lose the variance
        # against float64: torch's own fp32 group_norm on a channels-last CPU tensor is off by ~4e-4 here
        h = (x + add[..., None, None, None]).double()
        want = torch.nn.functional.silu(torch.nn.functional.group_norm(h, 2, weight.double(), bias.double(), 1e-5))
        torch.testing.assert_close(gns.group_norm_silu(x, weight, bias, 2, 1e-5, add).double(), want,
                                   rtol=1e-5, atol=1e-5)


def test_group_norm_silu_channels_last_many_tiles(poisoned, monkeypatch):
    """Channels-last with small tiles: many position tiles, channel blocks that do not divide C, a finalize
    kernel that merges its group's partial statistics over several loop iterations."""
    monkeypatch.setattr(gns, "_CL_TILE", 32)
    monkeypatch.setattr(gns, "_CL_MERGE", 16)
    monkeypatch.setattr(gns, "_CL_PROGRAMS", 40)
    monkeypatch.setattr(gns, "_CL_ONE_MAX", 0)  # the three kernels at any size
    # no block of 64/32/16 divides 24: one masked block of 32; 2 x 189 tiles over 40 programs: 16 tiles a program
    assert gns._cl_blocks(24, 3 * 7 * 9, 2) == (1, 32, 16)
    assert gns._cl_blocks(320, 10) == (1, 64, 2)  # the UNet's widths: whole 64-channel blocks; 50 tiles, 2 a program
    for dtype in (torch.float32, torch.bfloat16):
        x, weight, bias, add = _inputs((2, 24, 3, 7, 9), dtype, True, True, seed=3)
        # fp32: a mean far from zero. Not in bf16: Triton's CPU interpreter rounds fp32 -> bf16 toward zero (the GPU
        # to nearest), which at 20 (1 ulp = 0.125) biases the rounded x + add by far more than the tolerance
        x = x + 20 if dtype == torch.float32 else x
        h = (x + add[..., None, None, None]).double()  # x + add in x's dtype (bf16 rounds it), as the model
        want = torch.nn.functional.silu(torch.nn.functional.group_norm(h, 4, weight.double(), bias.double(), 1e-5))
        got = gns.group_norm_silu(x, weight, bias, 4, 1e-5, add)
        assert got.is_contiguous(memory_format=torch.channels_last_3d)
        if dtype == torch.float32:
            torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
        else:  # the bf16 output's rounding (1 ulp = 0.125 at 16) is the difference: compare like the other tests
            torch.testing.assert_close(got, gns.group_norm_silu_ref(x, weight, bias, 4, 1e-5, add), **TOL[dtype])


@pytest.mark.parametrize("stats_tile", [32, 4096])
def test_group_norm_silu_channels_last_shifted_statistics(poisoned, monkeypatch, stats_tile):
    """stats="shifted": each span's statistics from sums of x - k and (x - k)^2 (k the span's first position) over
    tiles of stats_tile elements within the launcher's spans: many tiles a span and a partial last span (32), or
    the whole span in one tile (4096); a mean far from the data's spread, the time embedding added, masked channels."""
    monkeypatch.setattr(gns, "_CL_TILE", 64)
    monkeypatch.setattr(gns, "_CL_PROGRAMS", 6)
    x, weight, bias, add = _inputs((2, 24, 3, 7, 9), torch.float32, True, True, seed=13)
    x = x + 40  # with plain sums of squares in fp32 the variance would be lost in the mean's
    h = (x + add[..., None, None, None]).double()
    want = torch.nn.functional.silu(torch.nn.functional.group_norm(h, 4, weight.double(), bias.double(), 1e-5))
    got = gns._group_norm_silu_cl(x, weight, bias, 4, 1e-5, add, torch.empty_like(x), stats="shifted",
                                  stats_tile=stats_tile, one_launch=False)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    xb, wb, bb, ab = _inputs((2, 24, 3, 7, 9), torch.bfloat16, True, True, seed=14)
    torch.testing.assert_close(gns._group_norm_silu_cl(xb, wb, bb, 4, 1e-5, ab, torch.empty_like(xb), stats="shifted",
                                                       stats_tile=stats_tile, one_launch=False),
                               gns.group_norm_silu_ref(xb, wb, bb, 4, 1e-5, ab), **TOL[torch.bfloat16])
    with pytest.raises(ValueError, match="stats='welford' is not allowed; allowed values: \\['chan', 'shifted'\\]"):
        gns._group_norm_silu_cl(x, weight, bias, 4, 1e-5, add, torch.empty_like(x), stats="welford")


@pytest.mark.parametrize("shape,groups,max_block_c,tile", [
    ((2, 96, 5, 7), 32, 64, 64),  # 3 channels a group: 21 groups a program in 64 channels, the last block of 11
    ((3, 120, 4, 6), 6, 64, 32),  # 20 channels a group: 3 a program in a masked block of 64, tiles of 1 position
    ((1, 40, 3, 5, 6), 8, 16, 2048),  # 5-D, one sample: 5 channels a group, 3 a program, the block of 8 masked
    ((2, 160, 3, 3), 4, 16, 64),  # 40 channels a group wider than max_block_c: one group a program (block 64)
])
def test_group_norm_silu_one_launch(poisoned, shape, groups, max_block_c, tile):
    """The one-launch kernel: whole groups a program (Cg not a power of two, group blocks masked at C's end, a group
    wider than max_block_c), its statistics against float64 with a mean 40 times the spread and the time embedding
    added; bf16 against the reference; the GroupNorm alone (silu=False)."""
    x, weight, bias, add = _inputs(shape, torch.float32, True, True, seed=shape[1])
    x = x + 40  # plain sums of squares in fp32 would lose the variance in the mean's
    h = (x + add.reshape(*add.shape, *([1] * (x.dim() - 2)))).double()
    norm = torch.nn.functional.group_norm(h, groups, weight.double(), bias.double(), 1e-5)
    for silu, want in ((True, torch.nn.functional.silu(norm)), (False, norm)):
        got = gns._group_norm_silu_cl_one(x, weight, bias, groups, 1e-5, add, torch.empty_like(x),
                                          max_block_c=max_block_c, tile=tile, silu=silu)
        assert got.stride() == x.stride()
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    xb, wb, bb, ab = _inputs(shape, torch.bfloat16, True, True, seed=shape[1] + 1)
    torch.testing.assert_close(gns._group_norm_silu_cl_one(xb, wb, bb, groups, 1e-5, ab, torch.empty_like(xb),
                                                           max_block_c=max_block_c, tile=tile),
                               gns.group_norm_silu_ref(xb, wb, bb, groups, 1e-5, ab), **TOL[torch.bfloat16])


def test_group_norm_silu_one_launch_rule(monkeypatch):
    """The size rule at the wma UNet's sites (16 frames folded into the batch; one sample's frames in the temporal
    conv block): the two lowest levels' ResBlocks take one launch, the levels above and one sample's 32 groups the
    three kernels, where it is on (_CL_ONE_RULE_MAX); _CL_ONE_MAX 0, the default, turns it off; the launcher refuses a
    one_launch that is not None, True or False."""
    assert gns._CL_ONE_MAX == 0  # off by default: it lost inside the wma iteration (the module's comment)
    monkeypatch.setattr(gns, "_CL_ONE_MAX", gns._CL_ONE_RULE_MAX)
    assert gns._cl_one_plan(1280, 40, 40) == (1, 64, 32, 2)  # 5 x 8: one 40-channel group a program
    assert gns._cl_one_plan(640, 640, 20)[:2] == (3, 64)  # 20 x 32: three groups in 64 channels
    assert gns._cl_one_plan(320, 2560, 10, max_block_c=16)[:2] == (1, 16)
    assert gns._cl_one_launch(16, 1280, 40, 40) and gns._cl_one_launch(16, 1280, 160, 40)
    assert not gns._cl_one_launch(16, 640, 640, 20)  # 12,800 elements a program
    assert not gns._cl_one_launch(1, 1280, 16 * 40, 40)  # one sample: 32 programs
    assert not gns._cl_one_launch(16, 320, 2560, 10) and not gns._cl_one_launch(1, 320, 16 * 2560, 10)
    monkeypatch.setattr(gns, "_CL_ONE_MAX", 0)
    x, weight, bias, _ = _inputs((1, 8, 2, 2), torch.float32, True, False, seed=1)
    calls = []
    monkeypatch.setattr(gns, "_group_norm_silu_cl_one", lambda *a, **k: calls.append(1))
    gns.group_norm_silu(x, weight, bias, 2)
    assert not calls  # off: the three kernels
    gns._group_norm_silu_cl(x, weight, bias, 2, 1e-5, None, torch.empty_like(x), one_launch=True)
    assert calls == [1]
    with pytest.raises(ValueError, match="one_launch='yes' is not allowed; allowed values: None"):
        gns._group_norm_silu_cl(x, weight, bias, 2, 1e-5, None, torch.empty_like(x), one_launch="yes")


def test_group_norm_silu_custom_op_and_bad_input():
    x, weight, bias, add = _inputs((2, 12, 3, 5), torch.float32, False, True, seed=0)
    torch.library.opcheck(gns.group_norm_silu_op, (x, weight, bias, 4, 1e-5, add))
    torch.library.opcheck(gns.group_norm_silu_op, (x, weight, bias, 3, 1e-6, None))
    torch.testing.assert_close(gns.group_norm_silu_op(x, weight, bias, 4, 1e-5, add),
                               gns.group_norm_silu_ref(x, weight, bias, 4, 1e-5, add), **TOL[torch.float32])
    with pytest.raises(ValueError, match="num_groups must be"):
        gns.group_norm_silu(x, weight, bias, 5)  # 12 channels in 5 groups
    with pytest.raises(ValueError, match="weight must be"):
        gns.group_norm_silu(x, weight[:6], bias, 4)
    with pytest.raises(ValueError, match="bias must be"):
        gns.group_norm_silu(x, weight, bias[None], 4)
    with pytest.raises(ValueError, match="add must be"):
        gns.group_norm_silu(x, weight, bias, 4, add=add[:1])
    with pytest.raises(ValueError, match="add must have x's dtype"):
        gns.group_norm_silu(x, weight, bias, 4, add=add.bfloat16())
    with pytest.raises(ValueError, match="x has dtype"):
        gns.group_norm_silu(x.long(), weight, bias, 4)
    with pytest.raises(ValueError, match="x must be"):
        gns.group_norm_silu(x[:, :, 0, 0], weight, bias, 4)
    # x in and out, weight and bias, add
    assert gns.group_norm_silu_bytes(x, weight, bias, add) == 2 * 360 * 4 + 2 * 12 * 4 + 24 * 4


@pytest.mark.parametrize("setting", [dict(tile=4096, programs=8, max_block_c=1024, num_warps=8),
                                     dict(tile=64, programs=3, max_block_c=16, num_warps=2),
                                     dict(tile=64, programs=3, max_block_c=16, num_warps=2, stats="shifted")])
def test_group_norm_silu_channels_last_settings_tools_sweep(poisoned, setting):
    """The launcher settings tools/gn_sweep.py sweeps on a GPU (a whole row of 40 channels in one masked block of 64;
    small tiles of 16-channel blocks) give the same result."""
    x, weight, bias, add = _inputs((2, 40, 5, 6), torch.float32, True, True, seed=5)
    got = gns._group_norm_silu_cl(x, weight, bias, 4, 1e-5, add, torch.empty_like(x), one_launch=False, **setting)
    h = (x + add[..., None, None]).double()
    want = torch.nn.functional.silu(torch.nn.functional.group_norm(h, 4, weight.double(), bias.double(), 1e-5))
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert gns._cl_blocks(40, 30, 2, 4096, 8, 1024)[1] == 64 and gns._cl_blocks(40, 30, 2, 64, 3, 16)[1] == 16


@pytest.mark.parametrize("setting", [dict(block=4096, programs=4096, num_warps=8),
                                     dict(block=16, programs=3, num_warps=2)])
def test_group_norm_silu_channels_first_settings_tools_sweep(poisoned, setting):
    """The channels-first launcher's settings that tools/gn_sweep.py sweeps give the same result (one chunk per
    group of a whole block; many chunks of 16 elements)."""
    x, weight, bias, add = _inputs((2, 40, 5, 6), torch.float32, False, True, seed=6)
    got = gns._group_norm_silu_cf(x, weight, bias, 4, 1e-5, add, torch.empty_like(x), **setting)
    h = (x + add[..., None, None]).double()
    want = torch.nn.functional.silu(torch.nn.functional.group_norm(h, 4, weight.double(), bias.double(), 1e-5))
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_gn_sweep_tool_gates_every_setting():
    """tools/gn_sweep.py on DEV (a CPU: the kernels in the interpreter, no timing; a GPU: timed too): every quick
    setting at the UNet's group_norm_silu call sites of tiny-wma (channels-last: its two ResBlock sites; channels-first:
    the temporal conv block) passes the gate; --levels --grid rule: a lower level's ResBlock site, the launcher's
    default against the three kernels."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "gn_sweep.py"
    spec = importlib.util.spec_from_file_location("gn_sweep", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    df = mod.sweep("wma", "tiny-wma", DEV, quick=True, rep_ms=1.0, site="video UNet")
    n = df.groupby("layout")["site"].nunique()
    assert n["channels-last"] == 2 and n.drop("channels-last").sum() == 1
    own = df[df["setting"] != "torch.compile"]  # a GPU adds torch.compile's row at each site, as the reference
    assert len(own) == sum(k * len(mod.settings(True, layout)) for layout, k in n.items())
    assert set(own["gate"]) == {"pass"}, own[["site", "setting", "gate"]]
    if DEV.type == "cuda":
        ref = df[df["setting"] == "torch.compile"]
        assert len(ref) == n.sum() and set(ref["gate"]) == {"reference"}
        assert df["us"].notna().all() and (df["us"] > 0).all()
    lv = mod.sweep("wma", "tiny-wma", DEV, quick=True, rep_ms=1.0, site="level 1 ResBlock", grid="rule", levels=True)
    assert list(lv[lv["setting"] != "torch.compile"]["setting"]) == ["launcher default", "three kernels, defaults"]
    assert set(lv["gate"]) <= {"pass", "reference"} and lv["shape"].nunique() == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("channels_last", [False, True])
def test_group_norm_without_silu_over_a_samples_frames(poisoned, dtype, channels_last):
    """silu=False (the op wmbook::group_norm): the GroupNorm alone, as the temporal transformers call it: a [(B T), C,
    h, w] activation seen as [B, C, T, h, w]. From a channels-last activation that view is channels_last_3d, read in
    place and the output given its strides; from a channels-first one it is a transposed view, copied first."""
    b, t, c, h, w, groups = 2, 3, 40, 5, 6, 8
    x4, weight, bias, _ = _inputs((b * t, c, h, w), dtype, channels_last, False, seed=11)
    v = x4.unflatten(0, (b, t)).transpose(1, 2)
    assert gns.is_channels_last(v) == channels_last
    out = gns.group_norm_silu(v, weight, bias, groups, 1e-6, silu=False)
    if channels_last:
        assert out.stride() == v.stride()
    norm = torch.nn.GroupNorm(groups, c, eps=1e-6).to(DEV)
    with torch.no_grad():
        norm.weight.copy_(weight)
        norm.bias.copy_(bias)
        want = norm(v.float().contiguous()).to(dtype)
    torch.testing.assert_close(out, want, **TOL[dtype])
    torch.testing.assert_close(gns.group_norm_silu_ref(v, weight, bias, groups, 1e-6, silu=False), want, **TOL[dtype])
    torch.testing.assert_close(gns.group_norm_op(v, weight, bias, groups, 1e-6), want, **TOL[dtype])
    if dtype == torch.float32 and not channels_last:
        torch.library.opcheck(gns.group_norm_op, (v.contiguous(), weight, bias, groups, 1e-6))
    with pytest.raises(ValueError, match="silu=1 is not allowed"):
        gns.group_norm_silu(v, weight, bias, groups, silu=1)
