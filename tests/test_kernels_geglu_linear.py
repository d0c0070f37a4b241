"""GEGLU's projection and gate as one GEMM (wmbook.kernels.geglu_linear) against the projection and GELU in fp64, on
a GPU or in the Triton interpreter on a CPU; its op under torch.compile; the variant `geglu-gemm` on the tiny UNet."""

from __future__ import annotations

import copy

import pytest

triton = pytest.importorskip("triton")  # on a CPU, TRITON_INTERPRET=1 (conftest): kernels run in the interpreter

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from wmbook import workloads  # noqa: E402
from wmbook.kernels import geglu_linear as gl  # noqa: E402
from wmbook.variants import REGISTRY  # noqa: E402
from wmbook.variants.registry import VariantContext  # noqa: E402

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
# relative L2 against fp64: fp32 accumulates in fp32 (sums of K products, a few units of 2^-24 each) and the GELU in
# fp32; bf16 and fp16 round the inputs' products exactly and the output once (unit roundoff 2^-9, 2^-12)
BUDGET = {torch.float32: 1e-5, torch.bfloat16: 4e-3, torch.float16: 5e-4}


def _want(x, w, b):
    a, g = F.linear(x.double(), w.double(), b.double()).chunk(2, dim=-1)
    return a * F.gelu(g)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,n", [
    ((150, 64), 70),  # several tiles in rows and columns (the interpreter's are 64 x 64), edge tiles in both
    ((37, 48), 40),  # one edge tile
    ((2, 19, 45), 33),  # a batch of rows, K with a partial last K-tile, N odd
    ((1, 64), 16),  # one row
])
def test_geglu_linear_matches_projection_and_gelu(dtype, shape, n):
    g = torch.Generator().manual_seed(sum(shape) + n)
    x = torch.randn(*shape, generator=g).to(DEV, dtype)
    w = (torch.randn(2 * n, shape[-1], generator=g) / shape[-1] ** 0.5).to(DEV, dtype)
    b = torch.randn(2 * n, generator=g).to(DEV, dtype)
    out = gl.geglu_linear(x, w, b)
    assert out.shape == (*shape[:-1], n) and out.dtype == dtype and out.is_contiguous()
    want = _want(x, w, b)
    err = ((out.double() - want).norm() / want.norm()).item()
    assert err < BUDGET[dtype], err
    ref = gl.geglu_linear_ref(x, w, b)
    assert ((ref.double() - want).norm() / want.norm()).item() < BUDGET[dtype]


def test_geglu_linear_reads_strided_rows_and_refuses_bad_shapes():
    g = torch.Generator().manual_seed(3)
    x = torch.randn(40, 2, 24, generator=g)[:, 0]  # rows 48 elements apart
    w = torch.randn(24, 20, generator=g).t()  # [2N, K] with K strided
    b = torch.randn(20, generator=g)
    torch.testing.assert_close(gl.geglu_linear(x.to(DEV), w.to(DEV), b.to(DEV)), gl.geglu_linear_ref(x, w, b).to(DEV),
                               rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"weight must be \[2N, K\]"):
        gl.geglu_linear(x, torch.randn(19, 24), torch.randn(19))
    with pytest.raises(ValueError, match=r"bias must be \[2N\]"):
        gl.geglu_linear(x, w, torch.randn(10))
    with pytest.raises(ValueError, match="tiles="):
        gl.geglu_linear(x, w, b, tiles=(1, 2, 3, 4, 5))
    empty_k = gl.geglu_linear(torch.randn(3, 0), torch.randn(4, 0), torch.arange(4.0))  # the bias's halves alone
    torch.testing.assert_close(empty_k, (torch.arange(2.0) * F.gelu(torch.arange(2.0, 4.0))).expand(3, 2))
    assert gl.geglu_linear(torch.randn(0, 5), torch.randn(4, 5), torch.randn(4)).shape == (0, 2)
    assert gl.geglu_linear_bytes(x, w, b) == (x.numel() + w.numel() + b.numel() + 40 * 10) * 4


def test_geglu_op_under_compile():
    """The op as torch.compile sees it (its fake implementation's shape, its launch traced) gives the eager op's
    output."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 21, 32, generator=g).to(DEV)
    w = (torch.randn(48, 32, generator=g) / 32 ** 0.5).to(DEV)
    b = torch.randn(48, generator=g).to(DEV)
    eager = gl.geglu_linear_op(x, w, b)
    compiled = torch.compile(lambda a: gl.geglu_linear_op(a, w, b) * 2.0, backend="aot_eager", fullgraph=True)(x)
    torch.testing.assert_close(compiled, eager * 2.0, rtol=1e-5, atol=1e-5)


def test_geglu_gemm_variant_on_the_tiny_unet():
    """Every feed-forward's GEGLU swapped, the state dict's keys unchanged, each swapped feed-forward's output the
    reference's within fp32 rounding (the kernel itself is tested above); fp8-static leaves the fused projections
    alone; a denoiser without GEGLU is refused."""
    from wmbook.models.wma.unet import FeedForward
    from wmbook.pipelines.ddim import WMAInteractionPipeline
    from wmbook.variants.epilogues import FusedGEGLU
    from wmbook.variants.fp8_static import eligible_linears

    wl = workloads.get("wma")
    pipe = WMAInteractionPipeline("tiny-wma", device=DEV, dtype="fp32", seed=0)
    fused = copy.deepcopy(pipe)
    ctx = VariantContext(workload=wl, device=DEV)
    keys = set(pipe.model.state_dict())
    REGISTRY["geglu-gemm"].apply(fused, ctx)
    n = sum(isinstance(m, FusedGEGLU) for m in fused.model.modules())
    assert n and ctx.notes["geglu-gemm"].startswith(f"{n} GEGLU") and set(fused.model.state_dict()) == keys
    pairs = [(a, b) for a, b in zip(pipe.model.modules(), fused.model.modules()) if isinstance(a, FeedForward)]
    assert len(pairs) == n
    g = torch.Generator().manual_seed(2)
    with torch.no_grad():
        for a, b in pairs[:3]:
            x = torch.randn(2, 7, a.net[0].proj.in_features, generator=g).to(DEV)
            torch.testing.assert_close(b(x), a(x), rtol=1e-5, atol=1e-5)
    fused.model.to(torch.bfloat16)
    projs = {id(m.proj) for m in fused.model.modules() if isinstance(m, FusedGEGLU)}
    assert projs and not projs & {id(m) for _, m in eligible_linears(fused.model, 16)}
    with pytest.raises(ValueError, match="geglu-gemm found no GEGLU"):
        REGISTRY["geglu-gemm"].apply(fused, ctx)
