"""How the kernels' ops are defined (wmbook.kernels.define_op): triton_op where kernels compile, so torch.compile
launches them from its own code instead of calling an opaque custom op through the Python launcher (about 0.24 ms of
host time a call on the H100); custom_op under the Triton interpreter, which cannot run a kernel on fake tensors."""

import pytest
import torch

from wmbook import kernels
from wmbook.kernels import (
    adaln,
    block_attention,
    gated_residual_adaln,
    geglu_linear,
    group_norm_silu,
    qk_norm_rope,
    rms_norm_silu,
    short_attention,
)

GPU = torch.cuda.is_available() and not kernels.interpreting()

pytestmark = pytest.mark.numerics  # rerun with oneDNN and ATen held to older ISAs: `make test-isa`


def test_interpreter_and_switch_keep_custom_op(monkeypatch):
    if kernels.interpreting():  # the CPU test run: the ops were defined as custom ops, launches are not wrapped
        assert not kernels.uses_triton_op() and not kernels._triton_ops()
        assert kernels.launch(adaln._adaln_modulate_kernel) is adaln._adaln_modulate_kernel
    monkeypatch.setenv("WMBOOK_TRITON_OP", "0")
    assert not kernels.uses_triton_op()
    monkeypatch.setenv("WMBOOK_TRITON_OP", "1")
    assert kernels.uses_triton_op() == (kernels.triton_available() and not kernels.interpreting())


# a process without the interpreter, where the ops are triton_ops (it runs no kernel: no GPU needed)
_LAUNCH_CHILD = """
from torch._higher_order_ops.triton_kernel_wrap import TraceableTritonKernelWrapper
from torch._library.triton import set_wrap_triton_enabled
from wmbook import kernels
from wmbook.kernels import adaln

k = adaln._adaln_modulate_kernel
assert kernels._triton_ops()
with set_wrap_triton_enabled(False):  # how torch runs an eager call of a triton_op
    assert kernels.launch(k) is k
traced = kernels.launch(k)  # how tracing sees it afterwards
assert isinstance(traced, TraceableTritonKernelWrapper), type(traced)
print("ok")
"""


def test_launch_wraps_the_kernel_for_tracing_after_an_eager_call(run_uninterpreted):
    """An eager call of a triton_op launches the kernel itself (torch turns wrap_triton off there); a later traced
    call must still get the wrapper. Kept from the eager call, the bare kernel was launched on fake tensors when the
    model was compiled (H100, f07412f), which this catches without a GPU."""
    pytest.importorskip("triton")
    out = run_uninterpreted(_LAUNCH_CHILD)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-3000:]


def _cases(dev):
    g = torch.Generator(device="cpu").manual_seed(0)

    def r(*s, dtype=torch.bfloat16):
        return torch.randn(*s, generator=g).to(dev, dtype)

    x, y = r(1, 24, 64), r(1, 24, 64)
    mods = [r(1, 3, 1, 64, dtype=torch.float32) for _ in range(3)]
    cos, sin = torch.rand(24, 8, generator=g).to(dev), torch.rand(24, 8, generator=g).to(dev)
    xc = r(2, 32, 3, 6, 5)
    xl = r(2, 32, 6, 5).contiguous(memory_format=torch.channels_last)
    w, b = r(32, dtype=torch.float32), r(32, dtype=torch.float32)
    return {
        "adaln_modulate": (adaln.adaln_modulate_op, (x, mods[0], mods[1], 1e-6)),
        "gated_residual_adaln": (gated_residual_adaln.gated_residual_adaln_op, (x, y, *mods, 1e-6)),
        "qk_norm_rope": (qk_norm_rope.qk_norm_rope_op, (x, r(64, dtype=torch.float32), cos, sin, 4, 1e-6)),
        "rms_norm_silu": (rms_norm_silu.rms_norm_silu_op, (xc, r(32, 1, 1, 1, dtype=torch.float32), None, 1e-12)),
        "group_norm_silu": (group_norm_silu.group_norm_silu_op, (xc, w, b, 8, 1e-5, None)),
        "group_norm_silu channels-last": (group_norm_silu.group_norm_silu_op, (xl, w, b, 8, 1e-5, None)),
        # the temporal transformer's norm: a channels-last [(B T), C, h, w] seen as [B, C, T, h, w]
        "group_norm frames": (group_norm_silu.group_norm_op, (xl.unflatten(0, (1, 2)).transpose(1, 2), w, b, 8, 1e-6)),
        "geglu_linear": (geglu_linear.geglu_linear_op, (x, r(96, 64), r(96))),
        "short_attention": (short_attention.short_attention_op, (r(6, 16, 2, 32), r(6, 16, 2, 32), r(6, 16, 2, 32))),
        "block_attention": (block_attention.block_attention_op, (r(2, 40, 2, 32), r(2, 72, 2, 32), r(2, 72, 2, 32))),
    }


# the ops torch.compile takes in (triton_ops); block_attention stays an opaque custom op (inductor's copy of its
# kernel did not compile: wmbook.kernels.block_attention; tests/test_kernels_block_attention.py checks it opaque)
INLINE = [n for n in _cases("cpu") if n != "block_attention"]


@pytest.mark.skipif(not GPU, reason="triton_op compiles kernels on a CUDA GPU (the CPU tests run the interpreter)")
@pytest.mark.parametrize("name", INLINE)
def test_compiled_op_launches_the_kernel_inline_and_matches_eager(name):
    from torch._inductor.utils import run_and_get_code

    assert kernels._triton_ops()  # the kind the ops were defined as
    op, args = _cases(torch.device("cuda"))[name]
    torch.library.opcheck(op, args)
    eager = op(*args)
    torch._dynamo.reset()
    out, code = run_and_get_code(torch.compile(lambda *a: op(*a), backend="inductor", fullgraph=True), *args)
    eager, out = (eager if isinstance(eager, tuple) else (eager,)), (out if isinstance(out, tuple) else (out,))
    for e, o in zip(eager, out):
        torch.testing.assert_close(o.float(), e.float(), rtol=0, atol=0)
        assert o.stride() == e.stride()
    src = "\n".join(code)
    assert "torch.ops.wmbook" not in src, "the op stayed opaque: compiled code calls it through the dispatcher"
