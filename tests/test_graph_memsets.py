"""A captured graph's small memsets as kernel nodes (wmbook.graph_memsets, the variant graph-memset-kernels)."""

from __future__ import annotations

import ctypes
import ctypes.util

import pytest
import torch

from wmbook import graph_memsets, variants, workloads
from wmbook.graph_memsets import MAX_BYTES, PTX, fill_for
from wmbook.graphs import GraphedCallable

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")


def test_which_memsets_become_kernels():
    f = fill_for(dst=4096, value=0, element_size=4, width=1, height=1)
    assert (f.kernel, f.n, f.size, f.blocks) == ("wm_fill32", 1, 4, 1)
    f = fill_for(dst=4097, value=0x1ABCD, element_size=1, width=1000, height=1)
    assert (f.kernel, f.value, f.blocks) == ("wm_fill8", 0xCD, 4)  # the low byte, as cudaMemset writes it
    assert fill_for(dst=4096, value=0xFFFF1234, element_size=2, width=8, height=1).value == 0x1234
    assert fill_for(dst=4096, value=0, element_size=4, width=MAX_BYTES // 4, height=1) is not None
    assert fill_for(dst=4096, value=0, element_size=4, width=MAX_BYTES // 4 + 1, height=1) is None
    assert fill_for(dst=4096, value=0, element_size=4, width=4, height=2) is None  # 2-D: stays
    assert fill_for(dst=4098, value=0, element_size=4, width=4, height=1) is None  # misaligned: stays
    assert fill_for(dst=4096, value=0, element_size=8, width=4, height=1) is None
    assert fill_for(dst=4096, value=0, element_size=4, width=0, height=1) is None
    for bits in (8, 16, 32):
        assert f".visible .entry wm_fill{bits}(" in PTX and f"st.global.u{bits} " in PTX


def test_refusals():
    with pytest.raises(ValueError, match="memset_kernels='yes' is not allowed; allowed values: True, False"):
        GraphedCallable(lambda: None, memset_kernels="yes")
    with pytest.raises(ValueError, match="raw_graph must be a captured cudaGraph_t"):
        graph_memsets.memsets_to_kernels(0)
    with pytest.raises(ValueError, match="max_bytes=0 is not allowed; allowed values: an integer >= 1"):
        graph_memsets.memsets_to_kernels(1, max_bytes=0)
    with pytest.raises(ValueError, match="'graph-memset-kernels' needs a CUDA device"):
        variants.resolve(["bf16", "graph-memset-kernels"], workloads.get("mg2"), "cpu")


def test_variant_flags_every_graph_and_recaptures_a_captured_one():
    from wmbook.variants.builtin.graphs import _graph_memset_kernels, memset_kernels

    class Pipe:
        pass

    class Ctx:
        notes: dict = {}

    pipe = Pipe()
    pipe.graphed = [GraphedCallable(lambda: None, name="a", device="cpu"), GraphedCallable(lambda: None, device="cpu")]
    assert not memset_kernels(pipe)
    _graph_memset_kernels(pipe, Ctx())
    assert memset_kernels(pipe) and all(g.memset_kernels for g in pipe.graphed)
    note = "small memsets as kernel nodes in 2 graphed callables and those made later"
    assert Ctx.notes["graph-memset-kernels"] == note

    class Captured:  # a graph the row before captured: dropped, to be captured again with the rewrite
        name, captured, memset_kernels, resets = "DiT forward", 1, False, 0

        def reset(self):
            self.resets += 1

    pipe.graphed = [c := Captured()]
    _graph_memset_kernels(pipe, Ctx())
    assert c.memset_kernels and c.resets == 1 and "(1 captured again)" in Ctx.notes["graph-memset-kernels"]
    assert not variants.get("graph-memset-kernels").denoiser  # a ladder row on the row before's pipeline


def _memset_async(bits: int, ptr: int, value: int, n: int) -> None:
    lib = ctypes.CDLL(ctypes.util.find_library("cuda") or "libcuda.so.1")
    fn = getattr(lib, f"cuMemsetD{bits}Async")
    vtype = {8: ctypes.c_ubyte, 16: ctypes.c_ushort, 32: ctypes.c_uint}[bits]
    fn.argtypes = (ctypes.c_uint64, vtype, ctypes.c_size_t, ctypes.c_void_p)
    fn.restype = ctypes.c_int
    assert fn(ptr, value, n, torch.cuda.current_stream().cuda_stream) == 0


@GPU
def test_rewritten_graph_writes_what_the_memsets_wrote():
    """Memsets of 1, 2 and 4-byte elements between kernels, captured: the rewritten graph has kernel nodes in
    their place (a large one stays) and every replay leaves the same bytes and results as eager execution."""
    dev = torch.device("cuda")
    x = torch.arange(1000, device=dev, dtype=torch.float32)
    b8 = torch.empty(777, device=dev, dtype=torch.uint8)
    b16 = torch.empty(300, device=dev, dtype=torch.int16)
    b32 = torch.empty(5, device=dev, dtype=torch.int32)
    big = torch.empty(MAX_BYTES // 4 + 10, device=dev, dtype=torch.int32)
    out = torch.empty(1000, device=dev)

    def body():
        x.mul_(2)
        _memset_async(8, b8.data_ptr(), 0xA7, b8.numel())
        _memset_async(16, b16.data_ptr(), 0x1234, b16.numel())
        _memset_async(32, b32.data_ptr(), 123456789, b32.numel())
        _memset_async(32, big.data_ptr(), 3, big.numel())
        out.copy_(x + b32[2].float() + b16[-1].float() + b8[5].float())

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph(keep_graph=True)
    with torch.cuda.graph(g, stream=side):
        body()
    done = graph_memsets.memsets_to_kernels(g.raw_cuda_graph())
    assert (done.memsets, done.replaced, done.bytes) == (4, 3, 777 + 600 + 20)
    g.instantiate()
    for b in (b8, b16, b32, big):
        b.zero_()
    x.copy_(torch.arange(1000, device=dev, dtype=torch.float32))
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    assert bool((b8 == 0xA7).all()) and bool((b16 == 0x1234).all()) and bool((b32 == 123456789).all())
    assert bool((big == 3).all())
    want = torch.arange(1000, device=dev, dtype=torch.float32) * 8 + 123456789 + 0x1234 + 0xA7
    assert torch.equal(out, want)


@GPU
@pytest.mark.parametrize("op", ["gemm", "sdpa", "conv"])
def test_library_kernels_replay_bit_identical(op):
    """A GEMM, cuDNN's attention and a channels-last convolution in bf16 at the wma UNet's shapes, captured with and
    without the rewrite: the replays are bit-identical (the rewrite changes which node zeroes a counter, not what
    any kernel computes). How many memsets a call makes is the library's kernel choice (none is possible); that the
    rewrite replaces memsets and the bytes stay is test_rewritten_graph_writes_what_the_memsets_wrote's case."""
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    if op == "gemm":
        a = torch.randn(2560, 320, device=dev, dtype=torch.bfloat16, generator=g)
        w = torch.randn(1280, 320, device=dev, dtype=torch.bfloat16, generator=g)

        def fn(a):
            return torch.nn.functional.linear(a, w)
        arg = a
    elif op == "sdpa":
        q = torch.randn(1, 5, 2560, 64, device=dev, dtype=torch.bfloat16, generator=g)

        def fn(q):
            from torch.nn.attention import SDPBackend, sdpa_kernel

            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION]):
                return torch.nn.functional.scaled_dot_product_attention(q, q * 0.5, q)
        arg = q
    else:
        conv = torch.nn.Conv2d(320, 320, 3, padding=1).to(dev, torch.bfloat16).to(memory_format=torch.channels_last)
        arg = torch.randn(16, 320, 40, 64, device=dev, dtype=torch.bfloat16,
                          generator=g).to(memory_format=torch.channels_last)

        def fn(x):
            return conv(x)
    outs = []
    for flag in (False, True):
        gc = GraphedCallable(fn, name=op, device=dev, memset_kernels=flag)
        for _ in range(4):
            y = gc(arg)
        e = next(iter(gc.entries.values()))
        assert e.graph is not None and e.failure is None
        assert (e.rewrite is not None) == flag
        if flag:
            assert e.rewrite.replaced == e.rewrite.memsets  # all of them small
            assert gc.table()["memsets as kernels"].iloc[0] == f"{e.rewrite.replaced} of {e.rewrite.memsets}"
        outs.append(y)
    assert torch.equal(outs[0], outs[1])
