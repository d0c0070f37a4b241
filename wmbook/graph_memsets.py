"""Small memsets of a captured CUDA graph replaced by kernel nodes that write the same bytes.

cuBLAS's persistent GEMM kernels (nvjet), cuDNN's SDPA and some of its implicit-GEMM convolutions zero a 4-byte
counter with cudaMemsetAsync before each launch (their tile schedulers count work done). Captured in a graph each is
a memset node, and the GPU idles around it longer than between two kernel nodes. In a profiled wma iteration
(notebook 06's best stack on an H200, about 1,480 memsets) a kernel started a median 2.8 us after a memset and a
memset 1.4 us after the kernel before it, against 0.4 us between two kernels: 6.4 ms of gaps around memsets, 1.2 ms
around the kernel nodes that replaced them (0.86 us a fill). Timed without the profiler, side by side, the iteration
went from 209.2 to 208.0 ms, so much of the gap the profile shows is inferred to be the profiler's own (NOTES.md).
A kernel node that stores the same value keeps the order and the bytes and pays a kernel's gap instead.

`memsets_to_kernels(raw_graph)` rewrites a graph that `torch.cuda.CUDAGraph(keep_graph=True)` captured, before it is
instantiated: every memset node of one row of at most MAX_BYTES becomes a kernel node with the same dependencies and
dependents. Larger or 2-D memsets stay as they are (the graphs measured have none). The fill kernels are PTX of
our own, loaded once per CUDA context; the graph edits go through the CUDA driver API (ctypes on the driver torch
has loaded), each symbol asked for at the CUDA 12.0 ABI that the structures below follow.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from dataclasses import dataclass

MAX_BYTES = 1 << 16  # a memset of more bytes stays a memset node
_THREADS = 256  # threads per block of a fill kernel

_NODE_MEMSET = 2  # CUgraphNodeType
_ABI = 12000  # the CUDA version whose signatures and structures this module declares

# One entry per element size: each thread i < n stores the value's low bytes at p + i * size. PTX stores of
# narrow types take a 32-bit register (the ISA allows a wider source operand for st).
_PTX_HEAD = ".version 7.0\n.target sm_70\n.address_size 64\n"
_PTX_BODY = """
.visible .entry wm_fill{bits}(.param .u64 p, .param .u32 v, .param .u32 n)
{{
  .reg .pred %q;
  .reg .b32 %r<6>;
  .reg .b64 %d<4>;
  ld.param.u64 %d1, [p];
  ld.param.u32 %r1, [v];
  ld.param.u32 %r2, [n];
  mov.u32 %r3, %ctaid.x;
  mov.u32 %r4, %ntid.x;
  mov.u32 %r5, %tid.x;
  mad.lo.s32 %r3, %r3, %r4, %r5;
  setp.ge.u32 %q, %r3, %r2;
  @%q bra DONE;
  cvta.to.global.u64 %d2, %d1;
  mul.wide.u32 %d3, %r3, {size};
  add.s64 %d2, %d2, %d3;
  st.global.u{bits} [%d2], %r1;
DONE:
  ret;
}}
"""
PTX = _PTX_HEAD + "".join(_PTX_BODY.format(bits=8 * s, size=s) for s in (1, 2, 4))


class _MemsetParams(ctypes.Structure):  # CUDA_MEMSET_NODE_PARAMS
    _fields_ = [("dst", ctypes.c_uint64), ("pitch", ctypes.c_size_t), ("value", ctypes.c_uint),
                ("elementSize", ctypes.c_uint), ("width", ctypes.c_size_t), ("height", ctypes.c_size_t)]


class _KernelParams(ctypes.Structure):  # CUDA_KERNEL_NODE_PARAMS (v2 of CUDA 12.0: kern and ctx null, func set)
    _fields_ = [("func", ctypes.c_void_p), ("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint),
                ("gridDimZ", ctypes.c_uint), ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint),
                ("blockDimZ", ctypes.c_uint), ("sharedMemBytes", ctypes.c_uint),
                ("kernelParams", ctypes.POINTER(ctypes.c_void_p)), ("extra", ctypes.POINTER(ctypes.c_void_p)),
                ("kern", ctypes.c_void_p), ("ctx", ctypes.c_void_p)]


@dataclass(frozen=True)
class Fill:
    """What a kernel node must do for one memset node: `n` elements of `size` bytes from `dst`, each `value`."""

    dst: int
    value: int
    size: int
    n: int

    @property
    def kernel(self) -> str:
        return f"wm_fill{8 * self.size}"

    @property
    def blocks(self) -> int:
        return -(-self.n // _THREADS)


def fill_for(dst: int, value: int, element_size: int, width: int, height: int,
             max_bytes: int = MAX_BYTES) -> Fill | None:
    """The Fill replacing a memset node of these parameters (width in elements), or None where it stays a memset:
    more than one row, more than max_bytes, an element size other than 1, 2 or 4 bytes, or nothing to write."""
    if height != 1 or element_size not in (1, 2, 4) or width < 1 or width * element_size > max_bytes:
        return None
    if dst % element_size:
        return None
    return Fill(dst=dst, value=value & ((1 << (8 * element_size)) - 1), size=element_size, n=width)


class _Driver:
    """The driver API entry points this module uses, at the CUDA 12.0 ABI (cuGetProcAddress)."""

    _SIGNATURES = {
        "cuGraphGetNodes": (ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t)),
        "cuGraphNodeGetType": (ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)),
        "cuGraphMemsetNodeGetParams": (ctypes.c_void_p, ctypes.POINTER(_MemsetParams)),
        "cuGraphNodeGetDependencies": (ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                       ctypes.POINTER(ctypes.c_size_t)),
        "cuGraphNodeGetDependentNodes": (ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                         ctypes.POINTER(ctypes.c_size_t)),
        "cuGraphAddKernelNode": (ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                                 ctypes.c_size_t, ctypes.POINTER(_KernelParams)),
        "cuGraphAddDependencies": (ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
                                   ctypes.c_size_t),
        "cuGraphDestroyNode": (ctypes.c_void_p,),
        "cuCtxGetCurrent": (ctypes.POINTER(ctypes.c_void_p),),
        "cuModuleLoadData": (ctypes.POINTER(ctypes.c_void_p), ctypes.c_char_p),
        "cuModuleGetFunction": (ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p),
        "cuGetErrorString": (ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)),
    }

    def __init__(self):
        lib = ctypes.CDLL(ctypes.util.find_library("cuda") or "libcuda.so.1")
        proc = ctypes.POINTER(ctypes.c_void_p)
        if hasattr(lib, "cuGetProcAddress_v2"):  # CUDA 12.5 and later drivers
            get = lib.cuGetProcAddress_v2
            get.argtypes = (ctypes.c_char_p, proc, ctypes.c_int, ctypes.c_uint64, ctypes.POINTER(ctypes.c_int))
        else:
            get = lib.cuGetProcAddress
            get.argtypes = (ctypes.c_char_p, proc, ctypes.c_int, ctypes.c_uint64)
        get.restype = ctypes.c_int
        self.modules: dict[int, dict[str, int]] = {}  # context -> kernel name -> CUfunction (modules stay loaded)
        for name, args in self._SIGNATURES.items():
            ptr, status = ctypes.c_void_p(), ctypes.c_int()
            extra = (ctypes.byref(status),) if len(get.argtypes) == 5 else ()
            rc = get(name.encode(), ctypes.byref(ptr), _ABI, 0, *extra)
            if rc or not ptr.value:
                raise RuntimeError(f"the CUDA driver has no {name} at the CUDA {_ABI // 1000}.0 ABI (error {rc})")
            setattr(self, name, ctypes.CFUNCTYPE(ctypes.c_int, *args)(ptr.value))

    def check(self, rc: int, what: str) -> None:
        if rc:
            msg = ctypes.c_char_p()
            self.cuGetErrorString(rc, ctypes.byref(msg))
            raise RuntimeError(f"{what} failed: CUDA driver error {rc} ({(msg.value or b'?').decode()})")

    def functions(self) -> dict[str, int]:
        """The fill kernels in the current context (loaded the first time a context asks)."""
        ctx = ctypes.c_void_p()
        self.check(self.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        if not ctx.value:
            raise RuntimeError("no current CUDA context: capture the graph before rewriting it")
        if ctx.value not in self.modules:
            mod = ctypes.c_void_p()
            self.check(self.cuModuleLoadData(ctypes.byref(mod), PTX.encode()), "loading the fill kernels' PTX")
            funcs = {}
            for bits in (8, 16, 32):
                f = ctypes.c_void_p()
                self.check(self.cuModuleGetFunction(ctypes.byref(f), mod, f"wm_fill{bits}".encode()),
                           f"cuModuleGetFunction(wm_fill{bits})")
                funcs[f"wm_fill{bits}"] = f.value
            self.modules[ctx.value] = funcs
        return self.modules[ctx.value]

    def nodes(self, name: str, handle) -> list[int]:
        """The nodes a query (cuGraphGetNodes, cuGraphNodeGetDependencies, ...) returns for a graph or node."""
        fn, n = getattr(self, name), ctypes.c_size_t(0)
        self.check(fn(handle, None, ctypes.byref(n)), name)
        if not n.value:
            return []
        arr = (ctypes.c_void_p * n.value)()
        self.check(fn(handle, arr, ctypes.byref(n)), name)
        return [arr[i] for i in range(n.value)]


_DRIVER: _Driver | None = None


def _driver() -> _Driver:
    global _DRIVER
    if _DRIVER is None:
        _DRIVER = _Driver()
    return _DRIVER


@dataclass
class Rewrite:
    """What memsets_to_kernels did to one graph."""

    memsets: int = 0  # memset nodes in the graph before
    replaced: int = 0  # of them, now kernel nodes
    bytes: int = 0  # bytes the replaced ones write


def memsets_to_kernels(raw_graph: int, max_bytes: int = MAX_BYTES) -> Rewrite:
    """Replace every small one-row memset node of a captured, not yet instantiated CUDA graph (cudaGraph_t, as
    `torch.cuda.CUDAGraph.raw_cuda_graph()` gives it) by a kernel node writing the same bytes, with the memset's
    dependencies and dependents. Call it on the graph's device (its context current)."""
    if isinstance(raw_graph, bool) or not isinstance(raw_graph, int) or raw_graph == 0:
        raise ValueError(f"raw_graph must be a captured cudaGraph_t (a nonzero int), got {raw_graph!r}")
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ValueError(f"max_bytes={max_bytes!r} is not allowed; allowed values: an integer >= 1 (bytes)")
    d = _driver()
    funcs = d.functions()
    graph = ctypes.c_void_p(raw_graph)
    out = Rewrite()
    for node in d.nodes("cuGraphGetNodes", graph):
        kind = ctypes.c_int()
        d.check(d.cuGraphNodeGetType(node, ctypes.byref(kind)), "cuGraphNodeGetType")
        if kind.value != _NODE_MEMSET:
            continue
        out.memsets += 1
        p = _MemsetParams()
        d.check(d.cuGraphMemsetNodeGetParams(node, ctypes.byref(p)), "cuGraphMemsetNodeGetParams")
        fill = fill_for(p.dst, p.value, p.elementSize, p.width, p.height, max_bytes)  # one row: no pitch
        if fill is None:
            continue
        deps = d.nodes("cuGraphNodeGetDependencies", node)
        after = d.nodes("cuGraphNodeGetDependentNodes", node)
        args = (ctypes.c_uint64(fill.dst), ctypes.c_uint32(fill.value), ctypes.c_uint32(fill.n))
        argv = (ctypes.c_void_p * 3)(*(ctypes.cast(ctypes.pointer(a), ctypes.c_void_p) for a in args))
        kp = _KernelParams(func=funcs[fill.kernel], gridDimX=fill.blocks, gridDimY=1, gridDimZ=1,
                           blockDimX=_THREADS, blockDimY=1, blockDimZ=1, sharedMemBytes=0,
                           kernelParams=ctypes.cast(argv, ctypes.POINTER(ctypes.c_void_p)), extra=None,
                           kern=None, ctx=None)
        new = ctypes.c_void_p()
        dep_arr = (ctypes.c_void_p * max(1, len(deps)))(*deps)
        # the driver copies the argument values into the node: args and argv need only outlive this call
        d.check(d.cuGraphAddKernelNode(ctypes.byref(new), graph, dep_arr if deps else None, len(deps),
                                       ctypes.byref(kp)), "cuGraphAddKernelNode")
        if after:
            src = (ctypes.c_void_p * len(after))(*([new.value] * len(after)))
            dst = (ctypes.c_void_p * len(after))(*after)
            d.check(d.cuGraphAddDependencies(graph, src, dst, len(after)), "cuGraphAddDependencies")
        d.check(d.cuGraphDestroyNode(node), "cuGraphDestroyNode")
        out.replaced += 1
        out.bytes += fill.n * fill.size
    return out


__all__ = ["MAX_BYTES", "PTX", "Fill", "Rewrite", "fill_for", "memsets_to_kernels"]
