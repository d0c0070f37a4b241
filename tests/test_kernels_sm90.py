"""Every Triton kernel of the package compiled for sm_90 (H100, H200) as its launcher launches it on a GPU, on a CPU.

The other kernel tests run the kernels in Triton's CPU interpreter, which accepts code the compiler rejects: the GEGLU
kernel read a Python float global inside the kernel ("Cannot access global variable ... from within @jit'ed
function") and called .to() on a scalar int argument, and both failed only on the H200 (e88df61).

How: a process without the interpreter (there @triton.jit gives the JITFunction a GPU host compiles; under the
interpreter even triton.language's own jit functions are interpreted, so nothing there can be compiled) calls each
launcher in CASES on CPU tensors, with Triton's launch replaced by a recorder; an autotuned launch records every
config, as the autotuner compiles each on the GPU. The launchers take their CUDA branches (`interpreting()` false,
runs_triton true, the motion table saying it is on CUDA, the H100's SM count), so block sizes, warps, stages and the
IEEE / UPCAST flags are the GPU's, not the interpreter's. Triton's own binder specializes each launch for an sm_90
backend as a real launch does (pointers and ints divisible by 16 marked so, ints equal to 1 made constants);
identical launches are compiled once, down to a cubin, and must fit the shared memory a block may have on sm_90.
Each is also lowered to TTIR with all its int arguments constants, which catches a scalar used as a tensor at any
size. Inputs are torch.empty at the workloads' sizes: no kernel runs, so nothing reads them, and the launchers choose
what they choose at those sizes. Whether every kernel has a case is checked in this process (the same recording).
"""

from __future__ import annotations

import json

import pytest

triton = pytest.importorskip("triton")

import torch  # noqa: E402
import triton.language as tl  # noqa: E402

from wmbook.kernels import (  # noqa: E402
    adaln,
    block_attention,
    gated_residual_adaln,
    geglu_linear,
    group_norm_silu,
    head_norm_rope,
    qk_norm_rope,
    rms_norm_silu,
    short_attention,
    wave_linear,
    window_conv,
)
from wmbook.motion import kernel as motion_kernel  # noqa: E402

SHARDS = 2  # child processes compiling the launches (pytest-xdist runs them side by side)
SM90_SHARED = 232448  # bytes of shared memory a block may opt into on sm_90 (227 KB); more fails the launch
SMS = 132  # streaming multiprocessors of an H100 SXM / H200 (wave_linear's default tiles depend on it)

bf16, fp32 = torch.bfloat16, torch.float32
CL, CL3 = torch.channels_last, torch.channels_last_3d


def _e(*shape, dtype=bf16, fmt=torch.contiguous_format):
    """An uninitialized CPU tensor (never read: the launches are recorded, not run)."""
    return torch.empty(shape, dtype=dtype, memory_format=fmt)


class _OnCuda(torch.Tensor):
    """A CPU tensor that says it is on CUDA: the motion launcher takes its autotuned CUDA branch."""

    @property
    def is_cuda(self):
        return True


# mg2-universal's causal DiT block: 3 latent frames of 44 x 80 / (2 x 2) = 880 tokens, 1536 channels, 12 heads of 128
N, C = 2640, 1536


def _mod(n=3, dtype=fp32):
    """The first n of the DiT block's modulation tensors: chunks of one [B, F, 6, C] sum (read in place)."""
    e = _e(1, 3, 6, C, dtype=dtype)
    return [e[:, :, i:i + 1] for i in range(n)]


def _gn(x, add=False, groups=32, eps=1e-5, **kw):
    """GroupNorm + SiLU of x (+ a time embedding [B, C] when add) with the UNet's 32 groups."""
    c = x.shape[1]
    a = _e(x.shape[0], c, dtype=x.dtype) if add else None
    group_norm_silu.group_norm_silu(x, _e(c, dtype=x.dtype), _e(c, dtype=x.dtype), groups, eps, a, **kw)


def _window(c, t, h, w, past=2, dtype=bf16):
    """A causal 3x3x3 convolution's padded channels-last window for t frames of h x w (the Wan decoder's)."""
    return _e(1, c, past + t, h + 2, w + 2, dtype=dtype, fmt=CL3)


def _motion(envs, k, joints=29, bodies=30, motions=512):
    """The fetch of `envs` Unitree G1 robots (motion preset g1-4096), k frames each."""
    width = 3 * (bodies + 3) + 2 * joints + 4 * (bodies + 1)
    i64 = torch.int64
    motion_kernel.motion_fetch(_e(1000, width, dtype=fp32).as_subclass(_OnCuda), _e(motions, dtype=i64),
                               _e(motions, dtype=i64), _e(motions, dtype=fp32), _e(motions, dtype=fp32),
                               _e(motions, dtype=torch.bool), _e(envs, dtype=i64), _e(envs, dtype=fp32),
                               _e(k, dtype=fp32), joints, bodies)


# (kernel module, case, the launcher call): the workloads' call sites in bf16 (fp32 where a launcher takes it and that
# changes the code: IEEE products, other tiles), and each branch a GPU takes (layouts, bias or none, add or none)
CASES = [
    ("adaln", "bf16 x, the DiT block's fp32 modulation chunks",
     lambda: adaln.adaln_modulate(_e(1, N, C), *_mod(2))),
    ("adaln", "fp32, 4 rows a program", lambda: adaln.adaln_modulate(_e(1, N, C, dtype=fp32), *_mod(2), rows=4)),
    ("gated_residual_adaln", "bf16, modulation chunks",
     lambda: gated_residual_adaln.gated_residual_adaln(_e(1, N, C), _e(1, N, C), *_mod(3))),
    ("gated_residual_adaln", "bf16, norm3's adaLN shared by every frame (strides 0), 4 rows a program",
     lambda: gated_residual_adaln.gated_residual_adaln(_e(1, N, C), _e(1, N, C), _mod(1)[0],
                                                       *[_e(1, 1, 1, C, dtype=fp32).expand(1, 3, 1, C)] * 2, rows=4)),
    ("gated_residual_adaln", "fp32",
     lambda: gated_residual_adaln.gated_residual_adaln(_e(1, N, C, dtype=fp32), _e(1, N, C, dtype=fp32), *_mod(3))),
    ("qk_norm_rope", "bf16, fp32 rotary tables",
     lambda: qk_norm_rope.qk_norm_rope(_e(1, N, C), _e(C), _e(N, 1, 64, dtype=fp32), _e(N, 1, 64, dtype=fp32), 12)),
    ("qk_norm_rope", "fp32", lambda: qk_norm_rope.qk_norm_rope(_e(1, N, C, dtype=fp32), _e(C, dtype=fp32),
                                                               _e(N, 1, 64, dtype=fp32), _e(N, 1, 64, dtype=fp32), 12)),
    # the action module's mouse queries: [880 locations, 3 frames, 16 heads, 64] unbound from the qkv projection
    ("head_norm_rope", "bf16, a strided view of the qkv projection",
     lambda: head_norm_rope.head_norm_rope(_e(880, 3, 3, 16, 64)[:, :, 0], _e(3, 4, dtype=fp32),
                                           _e(3, 4, dtype=fp32))),
    # the Wan VAE decoder: the middle block at latent resolution, the last up-block at full resolution
    ("rms_norm_silu", "bf16 channels-first, 384 channels, no bias",
     lambda: rms_norm_silu.rms_norm_silu(_e(1, 384, 1, 44, 80), _e(384, 1, 1, 1))),
    ("rms_norm_silu", "bf16 channels-first, 96 channels",
     lambda: rms_norm_silu.rms_norm_silu(_e(1, 96, 4, 352, 640), _e(96, 1, 1, 1))),
    ("rms_norm_silu", "bf16 channels-last, 96 channels, bias",
     lambda: rms_norm_silu.rms_norm_silu(_e(1, 96, 4, 352, 640, fmt=CL3), _e(96, 1, 1, 1), _e(96))),
    ("rms_norm_silu", "fp32 channels-last 4-D, 384 channels",
     lambda: rms_norm_silu.rms_norm_silu(_e(1, 384, 44, 80, dtype=fp32, fmt=CL), _e(384, dtype=fp32))),
    # the wma video UNet's top level (16 frames folded into the batch, 320 channels, 40 x 64, 32 groups) and the SD
    # VAE decoder's last up-block (fp32)
    ("group_norm_silu", "bf16 channels-last, the time embedding added", lambda: _gn(_e(16, 320, 40, 64, fmt=CL), True)),
    ("group_norm_silu", "bf16 channels-last", lambda: _gn(_e(16, 320, 40, 64, fmt=CL))),
    ("group_norm_silu", "bf16 channels-last, the Chan statistics (tools/gn_sweep.py's alternative)",
     lambda: group_norm_silu._group_norm_silu_cl(x := _e(16, 320, 40, 64, fmt=CL), _e(320), _e(320), 32, 1e-5,
                                                 None, x, stats="chan")),
    ("group_norm_silu", "bf16 channels-first, the time embedding added", lambda: _gn(_e(16, 320, 40, 64), True)),
    ("group_norm_silu", "bf16 channels-first 5-D (the temporal conv block)", lambda: _gn(_e(1, 320, 16, 40, 64))),
    ("group_norm_silu", "fp32 channels-first (SD VAE decoder)",
     lambda: _gn(_e(1, 128, 320, 512, dtype=fp32), eps=1e-6)),
    ("group_norm_silu", "fp32 channels-last", lambda: _gn(_e(16, 320, 40, 64, dtype=fp32, fmt=CL), True)),
    # the SD VAE decoder's last up-block in notebook 06's stack: a pass's 16 frames batched, bf16 channels-last
    ("group_norm_silu", "bf16 channels-last, the SD decoder's batched frames, shifted statistics",
     lambda: group_norm_silu._group_norm_silu_cl(
         x := _e(16, 128, 320, 512, fmt=CL), _e(128), _e(128), 32, 1e-6, None, x, stats="shifted", programs=4224,
         num_warps=8)),
    # the one-launch kernel at the UNet's lower levels: 1280 channels of 5 x 8 positions (one 40-channel group a
    # program), 640 of 20 x 32 (three 20-channel groups), and the temporal conv block's one sample (channels_last_3d)
    ("group_norm_silu", "bf16 channels-last, one launch, the time embedding added",
     lambda: _gn(_e(16, 1280, 5, 8, fmt=CL), True)),
    ("group_norm_silu", "bf16 channels-last, one launch, three groups a program",
     lambda: group_norm_silu._group_norm_silu_cl(x := _e(16, 640, 20, 32, fmt=CL), _e(640), _e(640), 32, 1e-5,
                                                 None, x, one_launch=True)),
    ("group_norm_silu", "bf16 channels-last 5-D, one launch, 8 warps",
     lambda: group_norm_silu._group_norm_silu_cl_one(x := _e(1, 1280, 16, 5, 8, fmt=CL3), _e(1280), _e(1280), 32,
                                                     1e-5, None, x, max_block_c=128, tile=4096, num_warps=8)),
    # the temporal transformers' GroupNorm alone over a sample's frames: a channels-last activation read in place
    ("group_norm_silu", "bf16 channels-last 5-D, no SiLU (frames-norm-triton)",
     lambda: _gn(_e(16, 320, 40, 64, fmt=CL).unflatten(0, (1, 16)).transpose(1, 2), eps=1e-6, silu=False)),
    # the UNet's temporal self-attention: 2560 positions x 16 frames, 5 heads of 64
    ("short_attention", "bf16", lambda: short_attention.short_attention(*[_e(2560, 16, 5, 64)] * 3)),
    ("short_attention", "fp32", lambda: short_attention.short_attention(*[_e(2560, 16, 5, 64, dtype=fp32)] * 3)),
    # the DiT's self-attention over its KV cache window (k/v a slice of the cache) and cross-attention to the 257
    # image tokens; the UNet's spatial self-attention (16 frames of 2560 tokens, 5 heads of 64); a head dim that is
    # not a power of two
    ("block_attention", "bf16 self-attention, k/v a window of the KV cache",
     lambda: block_attention.block_attention(_e(1, N, 12, 128), *[_e(1, 13200, 12, 128)[:, :5280]] * 2)),
    ("block_attention", "bf16 cross-attention to 257 image tokens",
     lambda: block_attention.block_attention(_e(1, N, 12, 128), *[_e(1, 257, 12, 128)] * 2)),
    ("block_attention", "bf16 head dim 64", lambda: block_attention.block_attention(*[_e(16, 2560, 5, 64)] * 3)),
    ("block_attention", "fp32 head dim 64 (wma in fp32)",
     lambda: block_attention.block_attention(*[_e(16, 2560, 5, 64, dtype=fp32)] * 3)),
    ("block_attention", "bf16 head dim 80 (masked head dim)",
     lambda: block_attention.block_attention(*[_e(2, 300, 4, 80)] * 3)),
    # the UNet's feed-forward at the top level: 40960 tokens, 320 -> 2 x 1280; every tile tools/geglu_bench.py times
    ("geglu_linear", "fp32", lambda: geglu_linear.geglu_linear(_e(40960, 320, dtype=fp32), _e(2560, 320, dtype=fp32),
                                                               _e(2560, dtype=fp32))),
    *[("geglu_linear", f"bf16 tiles {t}",
       lambda t=t: geglu_linear.geglu_linear(_e(40960, 320), _e(2560, 320), _e(2560), tiles=t))
      for t in geglu_linear.TILES],
    # the DiT's 1536-wide projections at every tile tools/gemm_bench.py times, and an uneven K without bias
    *[("wave_linear", f"bf16 tiles {t}", lambda t=t: wave_linear.wave_linear(_e(N, C), _e(C, C), _e(C), tiles=t))
      for t in wave_linear.TILES],
    ("wave_linear", "bf16 default tiles, K not a multiple of 64, no bias",
     lambda: wave_linear.wave_linear(_e(N, 1000), _e(C, 1000))),
    # the Wan decoder's head convolution (96 -> 3 channels, 3x3x3, 4 frames of 352 x 640) and the norm + SiLU into
    # the windows
    ("window_conv", "bf16 head convolution",
     lambda: window_conv.window_conv(_window(96, 4, 352, 640), _e(27 * 96, 3), _e(3), (3, 3, 3))),
    ("window_conv", "fp32, 384 -> 16 channels at latent resolution",
     lambda: window_conv.window_conv(_window(384, 1, 44, 80, dtype=fp32), _e(27 * 384, 16, dtype=fp32), None,
                                     (3, 3, 3))),
    ("window_conv", "e4m3 head convolution",
     lambda: window_conv.window_conv_fp8(_window(96, 4, 352, 640, dtype=torch.float8_e4m3fn), _e(1, dtype=fp32),
                                         _e(3, 27 * 96, dtype=torch.float8_e4m3fn), _e(3, dtype=fp32), _e(3),
                                         (3, 3, 3))),
    ("window_conv", "norm + SiLU into a window, 96 channels, no bias",
     lambda: window_conv.norm_silu_into(_e(1, 96, 4, 352, 640, fmt=CL3), _e(96, 1, 1, 1), None,
                                        _window(96, 4, 352, 640))),
    ("window_conv", "norm + SiLU into a window, 384 channels, bias",
     lambda: window_conv.norm_silu_into(_e(1, 384, 1, 44, 80, fmt=CL3), _e(384, 1, 1, 1), _e(384),
                                        _window(384, 1, 44, 80))),
    ("motion.kernel", "4096 robots, one frame each (autotuned: every config)", lambda: _motion(4096, 1)),
]


@triton.jit
def _probe_kernel(x_ptr, n, BLOCK: tl.constexpr):
    """Whether this Triton can compile for sm_90 at all (else the tests skip)."""
    i = tl.arange(0, BLOCK)
    tl.store(x_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1.0, mask=i < n)


# --- recording the launches (the child, and the completeness test under the interpreter) --------------------------

def _name(kernel) -> str:
    """module.qualname of a jit function (JITFunction or the interpreter's InterpretedFunction)."""
    return f"{kernel.fn.__module__}.{kernel.fn.__qualname__}"


def _record(cases, patch=setattr):
    """[(case, kernel, args, kwargs)] of every launch the cases make (kernel None: a case that launched nothing), with
    Triton's launch replaced by a recorder and the launchers on their CUDA branches; `patch(obj, name, value)` sets
    each replacement (monkeypatch.setattr to have them undone)."""
    from torch._library.triton import set_wrap_triton_enabled
    from triton.runtime.autotuner import Autotuner
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    seen, where = [], {"case": None}

    def run(self, *args, grid, warmup, **kwargs):
        seen.append((where["case"], self, args, kwargs))

    def tuned(self, *args, **kwargs):  # every config, as the autotuner compiles each on the GPU
        for config in self.configs:
            self.fn.run(*args, **kwargs, **config.all_kwargs())

    for cls in (JITFunction, InterpretedFunction):
        patch(cls, "run", run)
    patch(Autotuner, "run", tuned)
    for mod in _kernel_modules():
        if hasattr(mod, "interpreting"):
            patch(mod, "interpreting", lambda: False)
        if hasattr(mod, "runs_triton"):
            patch(mod, "runs_triton", lambda device: True)
    patch(wave_linear, "sm_count", lambda device: SMS)
    patch(motion_kernel, "_tuned_kernel", None)  # the autotuner the CUDA branch builds, made afresh
    with set_wrap_triton_enabled(False):  # launch(kernel) gives the kernel, as in an eager call of a triton_op
        for module, case, call in cases:
            where["case"] = f"{module}: {case}"
            n = len(seen)
            call()
            if len(seen) == n:
                seen.append((where["case"], None, (), {}))
    return seen


# --- the child process (no interpreter): specialize and compile ----------------------------------------------------

def _specialize(kernel, args, kwargs):
    """(signature, constexprs, attrs, options, bound arguments) of a launch for sm_90, by Triton's binder as
    JITFunction.run does."""
    from triton import knobs
    from triton.runtime.jit import create_function_from_signature

    backend = _backend()
    kwargs = {**kwargs, "debug": kwargs.get("debug", kernel.debug) or knobs.runtime.debug,
              "instrumentation_mode": knobs.compilation.instrumentation_mode}
    binder = create_function_from_signature(kernel.signature, kernel.params, backend)
    bound, specialization, options = binder(*args, **kwargs)
    options, signature, constexprs, attrs = kernel._pack_args(backend, kwargs, bound, specialization, options)
    return signature, constexprs, attrs, options, list(bound.values())


def _backend():
    """Triton's CUDA backend for an sm_90 target (a GPU need not be there)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend

    return make_backend(GPUTarget("cuda", 90, 32))


def compile_sm90(kernel, args, kwargs):
    """A launch kernel[grid](*args, **kwargs) compiled for sm_90 (raises what the compiler raises): the compiled
    kernel (asm: ttir ... cubin; metadata.shared: its shared memory in bytes)."""
    from triton.compiler.compiler import ASTSource

    signature, constexprs, attrs, options, _ = _specialize(kernel, args, kwargs)
    return triton.compile(ASTSource(kernel, signature, constexprs, attrs), target=_backend().target,
                          options=options.__dict__)


def ttir_with_constant_ints(kernel, args, kwargs):
    """The launch's TTIR with every int argument a constant (raises what the compiler raises). A GPU launch makes an
    int equal to 1 a constant, and inductor's analysis of a traced op makes every scalar one: code that needs a
    scalar argument to be a tensor (`N.to(tl.int64)`) compiles at the cases' sizes and fails there."""
    from triton.compiler.compiler import ASTSource

    signature, constexprs, attrs, options, values = _specialize(kernel, args, kwargs)
    for i, (name, ty) in enumerate(list(signature.items())):
        if ty[0] in "iu":  # i1 ... i64, u8 ... u64: not pointers ("*..."), floats or constexprs
            signature[name], constexprs[(i,)] = "constexpr", values[i]
            attrs.pop((i,), None)
    backend = _backend()
    context = triton._C.libtriton.ir.context()
    backend.load_dialects(context)
    return ASTSource(kernel, signature, constexprs, attrs).make_ir(
        backend.target, options, backend.get_codegen_implementation(options), backend.get_module_map(), context)


def _kernel_modules():
    """The package's modules that define @triton.jit functions (found by their source)."""
    import importlib
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    jit = re.compile(r"^\s*@triton\.jit\b", re.M)
    paths = sorted(p for p in (root / "wmbook").rglob("*.py") if jit.search(p.read_text()))
    return [importlib.import_module(".".join(p.relative_to(root).with_suffix("").parts)) for p in paths]


def _entry_kernels() -> list[str]:
    """The package's @triton.jit kernels: its jit functions that no jit function calls (the others are helpers such
    as wave_linear.grouped_tile, compiled inside the kernels that call them)."""
    import ast
    import inspect
    import textwrap
    from types import ModuleType

    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    jits = (JITFunction, InterpretedFunction)
    defined = {id(v): v for mod in _kernel_modules() for v in vars(mod).values()
               if isinstance(v, jits) and v.fn.__module__ == mod.__name__}
    called = set()
    for fn in defined.values():
        scope = fn.fn.__globals__
        for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(fn.fn)))):
            value = None
            if isinstance(node, ast.Name):
                value = scope.get(node.id)
            elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
                owner = scope.get(node.value.id)
                value = getattr(owner, node.attr, None) if isinstance(owner, ModuleType) else None
            if isinstance(value, jits):
                called.add(id(value))
    return sorted(_name(v) for k, v in defined.items() if k not in called)


def _error(e: Exception) -> str:
    lines = f"{type(e).__name__}: {e}".strip().splitlines()
    return "\n".join(lines[-30:])


def main(argv):
    """The child: compiles shard argv[0] of argv[1] of the cases' distinct launches; the last line of stdout is the
    JSON result (what failed, or why the tests skip)."""
    from triton import knobs

    from wmbook import kernels

    assert not kernels.interpreting(), "the child runs without TRITON_INTERPRET"
    knobs.compilation.allow_non_constexpr_globals = False  # as on a GPU host without that escape hatch
    try:
        compile_sm90(_probe_kernel, (torch.empty(16), 16), {"BLOCK": 16})
    except Exception as e:  # no NVIDIA backend, no ptxas
        print(json.dumps({"skip": f"Triton cannot compile for sm_90 here: {_error(e).splitlines()[-1]}"}))
        return
    shard, shards = int(argv[0]), int(argv[1])
    distinct, failures = {}, []
    for case, kernel, args, kwargs in _record(CASES):
        if kernel is None:
            continue
        try:
            spec = _specialize(kernel, args, kwargs)[:4]
        except Exception as e:  # what the launch itself would raise (an unknown keyword, an argument it cannot take)
            failures.append({"case": case, "kernel": _name(kernel), "error": _error(e)})
            continue
        key = repr((_name(kernel), spec[0], sorted(spec[1].items()), sorted(spec[2].items()),
                    sorted(spec[3].__dict__.items())))
        distinct.setdefault(key, (case, kernel, args, kwargs))
    mine = sorted(distinct)[shard::shards]
    for key in mine:
        case, kernel, args, kwargs = distinct[key]
        config = {k: v for k, v in kwargs.items() if k[0].isupper() or k.startswith("num_")}
        where = {"case": case, "kernel": _name(kernel), "config": repr(config)}
        try:
            smem = compile_sm90(kernel, args, kwargs).metadata.shared
        except Exception as e:
            failures.append({**where, "error": _error(e)})
            continue
        if smem > SM90_SHARED:  # the launch fails (an autotuner skips such a config: one that never runs)
            failures.append({**where, "error": f"{smem} bytes of shared memory, more than sm_90's {SM90_SHARED}"})
        try:
            ttir_with_constant_ints(kernel, args, kwargs)
        except Exception as e:
            failures.append({**where, "error": f"with its int arguments constants: {_error(e)}"})
    print(json.dumps({"compiled": len(mine), "distinct": len(distinct), "failures": failures}))


# --- the tests ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shard", range(SHARDS))
def test_kernels_compile_for_sm90(run_uninterpreted, tmp_path, shard):
    """Each distinct launch of the cases (this shard's share) compiles to an sm_90 cubin and fits its shared memory.
    In a process without the interpreter, with its own Triton cache: every launch really compiled."""
    code = (f"import os\nos.environ['TRITON_CACHE_DIR'] = {str(tmp_path / 'triton')!r}\n"
            f"from tests.test_kernels_sm90 import main\nmain([{shard}, {SHARDS}])\n")
    out = run_uninterpreted(code)
    assert out.returncode == 0, out.stderr[-5000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if "skip" in result:
        pytest.skip(result["skip"])
    assert result["compiled"] > 0, result
    grouped = {}  # one error, every launch that met it
    for f in result["failures"]:
        grouped.setdefault((f["kernel"], f["error"]), []).append(f"{f['case']} {f.get('config', '')}".strip())
    report = "\n\n".join(f"{kernel}, {len(where)} launch(es):\n  " + "\n  ".join(where) + f"\n{error}"
                         for (kernel, error), where in grouped.items())
    assert not grouped, f"{len(result['failures'])} launches do not compile for sm_90:\n\n{report}"


def test_every_kernel_has_a_case(monkeypatch):
    """Every @triton.jit kernel of the package is launched by a case (a new kernel needs one in CASES), and every
    case launches a kernel (a launcher that fell back to its reference would check nothing). Recorded here, under
    the interpreter, on the same CUDA branches as in the child."""
    launches = _record(CASES, monkeypatch.setattr)
    monkeypatch.undo()
    kernels = _entry_kernels()
    assert "wmbook.kernels.adaln._adaln_modulate_kernel" in kernels, kernels  # found; helpers are not kernels
    assert not {"wmbook.kernels.adaln._norm_modulate_rows", "wmbook.kernels.wave_linear.grouped_tile"} & set(kernels)
    missing = sorted(set(kernels) - {_name(k) for _, k, *_ in launches if k is not None})
    assert not missing, f"kernels no case in CASES launches: {missing}"
    empty = [case for case, k, *_ in launches if k is None]
    assert not empty, f"cases that launched no kernel: {empty}"
