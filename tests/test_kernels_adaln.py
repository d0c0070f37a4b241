"""adaLN modulate kernel against its reference (on a GPU, or the Triton interpreter on a CPU), and its custom op."""

from __future__ import annotations

import pytest

triton = pytest.importorskip("triton")  # on a CPU, TRITON_INTERPRET=1 (conftest): kernels run in the interpreter

import torch  # noqa: E402

from wmbook.kernels import adaln  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")  # a GPU where there is one, else the interpreter
TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.bfloat16: dict(rtol=2e-2, atol=2e-2)}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("b,f,s,c", [(1, 3, 5, 96), (2, 2, 7, 100), (1, 1, 1, 33), (1, 3, 4, 1536)])
def test_adaln_modulate_matches_reference(dtype, b, f, s, c):
    g = torch.Generator().manual_seed(c + s)
    x = (torch.randn(b, f * s, c, generator=g) * 3 + 1).to(DEV, dtype)
    shift = torch.randn(b, f, 1, c, generator=g).to(DEV, dtype)
    scale = torch.randn(b, f, 1, c, generator=g).to(DEV, dtype) * 0.1
    out = torch.full_like(x, float("nan"))  # poisoned: every element must be written
    out.copy_(adaln.adaln_modulate(x, shift, scale))
    torch.testing.assert_close(out, adaln.adaln_modulate_ref(x, shift, scale), **TOL[dtype])
    # the reference equals the model's unfused sequence (WanLayerNorm in fp32, then the per-frame modulate)
    h = torch.nn.functional.layer_norm(x.float(), (c,), eps=1e-6)
    want = (h.unflatten(1, (f, -1)) * (1 + scale.float()) + shift.float()).flatten(1, 2)
    torch.testing.assert_close(adaln.adaln_modulate_ref(x, shift, scale).float(), want, **TOL[dtype])


def test_adaln_modulate_reads_chunked_modulation_in_place():
    """shift and scale as chunks of one [B, F, 6, C] tensor (the DiT block's): the same output as contiguous copies."""
    g = torch.Generator().manual_seed(2)
    b, f, s, c = 2, 3, 4, 80
    x = torch.randn(b, f * s, c, generator=g).to(DEV)
    e = torch.randn(b, f, 6, c, generator=g).to(DEV)
    shift, scale = e[:, :, 0:1], e[:, :, 1:2]
    got = adaln.adaln_modulate(x, shift, scale)
    torch.testing.assert_close(got, adaln.adaln_modulate(x, shift.contiguous(), scale.contiguous()), rtol=0, atol=0)
    torch.testing.assert_close(got, adaln.adaln_modulate_ref(x, shift, scale), rtol=1e-5, atol=1e-5)


def test_adaln_modulate_custom_op_and_bad_input():
    x = torch.randn(1, 6, 40, device=DEV)
    shift = torch.randn(1, 2, 1, 40, device=DEV)
    scale = torch.randn(1, 2, 1, 40, device=DEV)
    torch.library.opcheck(adaln.adaln_modulate_op, (x, shift, scale, 1e-6))
    # a strided x (a transposed view): the fake must give the real op's contiguous output
    x_t = torch.randn(1, 40, 6, device=DEV).transpose(1, 2)
    torch.library.opcheck(adaln.adaln_modulate_op, (x_t, shift, scale, 1e-6))
    with pytest.raises(ValueError, match="shift must be"):
        adaln.adaln_modulate(x, torch.randn(1, 4, 1, 40, device=DEV), scale)
    with pytest.raises(ValueError, match="dtype"):
        adaln.adaln_modulate(x.long(), shift, scale)
    assert adaln.adaln_modulate_bytes(x, shift, scale) == 2 * 240 * 4 + 2 * 80 * 4  # x in and out, shift and scale


@pytest.mark.parametrize("rows", [2, 4, 8])
@pytest.mark.parametrize("b,f,s,c", [(2, 3, 5, 100), (1, 1, 1, 33), (1, 2, 9, 64)])
def test_adaln_modulate_several_rows_per_program(rows, b, f, s, c):
    # rows per program that do not divide the row count (the last program masks its tail), rows of different frames
    # in one program (each reads its own modulation): equal to one row per program, every element written
    g = torch.Generator().manual_seed(rows + c)
    x = (torch.randn(b, f * s, c, generator=g) * 3 + 1).to(DEV)
    shift = torch.randn(b, f, 1, c, generator=g).to(DEV)
    scale = torch.randn(b, f, 1, c, generator=g).to(DEV) * 0.1
    out = torch.full_like(x, float("nan"))
    out.copy_(adaln.adaln_modulate(x, shift, scale, rows=rows, num_warps=2))
    torch.testing.assert_close(out, adaln.adaln_modulate(x, shift, scale), rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out, adaln.adaln_modulate_ref(x, shift, scale), **TOL[torch.float32])


@pytest.mark.parametrize("rows, match", [(3, "rows=3 is not allowed; allowed values: 1, 2, 4"), (0, "rows=0"),
                                         (True, "rows=True"), (32, "at most 32768")])
def test_adaln_modulate_rows_bad_input(rows, match):
    x, mod = torch.zeros(1, 2, 1536, device=DEV), torch.zeros(1, 1, 1, 1536, device=DEV)
    with pytest.raises(ValueError, match=match):
        adaln.adaln_modulate(x, mod, mod, rows=rows)


def test_row_sweep_tool_gates_every_setting():
    """tools/row_sweep.py on the CPU (the kernels in the interpreter, no timing): every quick setting of both DiT row
    kernels at tiny's call sites passes the gate."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "tools" / "row_sweep.py"
    spec = importlib.util.spec_from_file_location("row_sweep", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    df = mod.sweep("mg2", None, torch.device("cpu"), quick=True, rep_ms=1.0)
    assert set(df["kernel"]) == {"adaln_modulate", "gated_residual_adaln"}
    assert len(df) == sum(len(mod.settings(True, int(s.split("x")[-1]))) for s in df["shape"].unique()) * 2
    assert set(df["gate"]) == {"pass"}, df[["site", "setting", "gate"]]
    assert mod.settings(False, 16384) == [dict(rows=r, num_warps=w) for r in (1, 2) for w in mod.WARPS]
