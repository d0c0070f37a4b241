"""Every Triton kernel of wmbook.kernels can be read by inductor's analysis of user-defined Triton kernels, and the
analysis finds that each kernel writes its outputs and nothing else.

torch.compile traces our triton_ops (wmbook.kernels.define_op) and works out which arguments each launch writes by
compiling the kernel to TTIR with every scalar argument made a constant (torch 2.11, the GPU hosts' version), then
following each store's address back to the kernel's pointer arguments. Two ways it went wrong on the H100, both
ending in a KeyError ('op282') in inductor's scheduler when the wma UNet was compiled whole with the fused kernels:
- at 5880f6e the GroupNorm finalize kernel did not compile with constant scalars (`(S * Cg).to(tl.float32)`: a
  Python int has no `.to`), and the analysis then assumes that every argument is written;
- at f07412f the GroupNorm kernels stored through offsets returned by a helper that also took x and add: the analysis
  counts a call's results as derived from all of its arguments, so x and add were "written" (and inductor copied x
  before every GroupNorm).

These tests run on the CPU: the first records the launches of each op at tiny shapes under the Triton interpreter and
compiles each launched kernel to TTIR for an sm_90 target with its scalars as constants, as that analysis does; the
second traces each op on fake CUDA tensors as torch.compile does and reads the writes the analysis found.
"""

import pytest
import torch

from wmbook import kernels
from wmbook.kernels import group_norm_silu as gns

triton = pytest.importorskip("triton")

pytestmark = pytest.mark.skipif(not kernels.interpreting(),
                                reason="records launches under the Triton interpreter (the CPU test run)")

_PTR = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.int64: "*i64",
        torch.int32: "*i32", torch.uint8: "*u8", torch.bool: "*i1"}


def _launches(monkeypatch) -> list[tuple]:
    """(python function, {arg name: value}) of every kernel launch the ops' tiny cases make."""
    from test_kernels_ops import _cases  # pytest puts tests/ on the path (no package)
    from triton.runtime.interpreter import InterpretedFunction

    seen, real = [], InterpretedFunction.run

    def run(self, *args, grid, warmup, **kwargs):
        names = self.arg_names
        seen.append((self.fn, {**dict(zip(names, args)), **{k: v for k, v in kwargs.items() if k in names}}))
        return real(self, *args, grid=grid, warmup=warmup, **kwargs)

    monkeypatch.setattr(InterpretedFunction, "run", run)
    for op, args in _cases(torch.device("cpu")).values():
        op(*args)
    # the channels-last GroupNorm's other path: the one-launch kernel (the tiny cases have too few programs for it)
    monkeypatch.setattr(gns, "_CL_ONE_MAX", gns._CL_ONE_RULE_MAX)
    monkeypatch.setattr(gns, "_CL_ONE_PROGRAMS", 1)
    for name, (op, args) in _cases(torch.device("cpu")).items():
        if "group_norm" in name:
            op(*args)
    monkeypatch.undo()
    return seen


def _ttir_with_constant_scalars(fn, values: dict):
    """TTIR of `fn` for an sm_90 target, its tensors as pointers and every other argument a constant."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource, make_backend
    from triton.runtime.jit import JITFunction

    jit = fn if isinstance(fn, JITFunction) else JITFunction(fn)
    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    options = backend.parse_options({})
    sig, consts = {}, {}
    for i, name in enumerate(jit.arg_names):
        v = values[name]
        if isinstance(v, str) and v.startswith("*"):  # a pointer type
            sig[name] = v
        else:  # a scalar or a constexpr: a constant, as the analysis makes it
            sig[name], consts[(i,)] = "constexpr", v
    ctx = triton._C.libtriton.ir.context()
    backend.load_dialects(ctx)
    src = ASTSource(jit, sig, consts)
    return src.make_ir(target, options, backend.get_codegen_implementation(options), backend.get_module_map(), ctx)


# run without the interpreter (it patches triton.language while it runs kernels, and makes @triton.jit give
# interpreted functions): import the kernel modules afresh and compile each recorded launch
_CHILD = """
import importlib, json, sys
from tests.test_kernels_inductor_analysis import _ttir_with_constant_scalars
for k in json.load(sys.stdin):
    fn = getattr(importlib.import_module(k["module"]), k["name"])
    try:
        _ttir_with_constant_scalars(fn, k["values"])
        print("ok", k["name"])
    except Exception as e:
        print("FAIL", k["name"], type(e).__name__, str(e).strip().splitlines()[-1][:200])
"""


def test_every_kernel_compiles_to_ttir_with_constant_scalars(monkeypatch, run_uninterpreted):
    import json

    pytest.importorskip("triton.backends.nvidia")
    specs = {}
    for fn, values in _launches(monkeypatch):
        vals = {n: (_PTR[v.dtype] if isinstance(v, torch.Tensor) else v) for n, v in values.items()}
        specs.setdefault(fn.__qualname__, {"module": fn.__module__, "name": fn.__name__, "values": vals})
    out = run_uninterpreted(_CHILD, json.dumps(list(specs.values())))
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert not [x for x in lines if not x.startswith("ok ")], lines
    done = {x.split()[1] for x in lines}
    # every kernel the ops launch at these shapes was checked: both GroupNorm layouts (channels-first stats +
    # normalize, channels-last stats + finalize + apply) and the others
    assert {"_gn_cl_finalize_kernel", "_gn_cl_stats_shifted_kernel", "_gn_cl_apply_kernel", "_gn_cl_one_kernel",
            "_group_norm_silu_stats_kernel", "_group_norm_silu_kernel"} <= done, sorted(done)
    assert len(done) == len(specs) >= 9, sorted(done)


def test_the_check_catches_a_scalar_only_cast():
    """The form that failed on the H100: a cast of an expression of scalar arguments alone."""
    import triton.language as tl
    from triton.compiler.errors import CompilationError

    def bad(out_ptr, S, Cg):
        tl.store(out_ptr, (S * Cg).to(tl.float32))

    def good(out_ptr, S, Cg):
        tl.store(out_ptr, S * Cg * 1.0)

    pytest.importorskip("triton.backends.nvidia")
    _ttir_with_constant_scalars(good, dict(out_ptr="*fp32", S=7, Cg=3))
    with pytest.raises(CompilationError, match="has no attribute 'to'"):
        _ttir_with_constant_scalars(bad, dict(out_ptr="*fp32", S=7, Cg=3))


# a process without the interpreter, where the ops are triton_ops: each op traced on fake CUDA tensors with
# functionalization, as torch.compile traces it, and the arguments each kernel launch is found to write (the
# functional launch's tensors_to_clone). Inductor's analysis compiles for the active driver's target: an H100's here.
_WRITES_CHILD = """
import json
import torch
import triton.runtime
from triton.backends.compiler import GPUTarget


class _Sm90:
    def get_current_target(self):
        return GPUTarget("cuda", 90, 32)


triton.runtime.driver.set_active(_Sm90())
from torch._higher_order_ops.triton_kernel_wrap import kernel_side_table
from torch._subclasses.fake_tensor import FakeTensorMode
from torch._subclasses.functional_tensor import dispatch_functionalize
from torch.fx.experimental.proxy_tensor import make_fx

from tests.test_kernels_ops import _cases

cases = _cases(torch.device("cpu"))
for name in ("group_norm_silu", "group_norm_silu channels-last"):  # with the time-embedding add too
    op, (x, w, b, g, eps, _) = cases[name]
    cases[name + " + add"] = (op, (x, w, b, g, eps, torch.randn(x.shape[0], x.shape[1]).to(x.dtype)))
from wmbook.kernels import group_norm_silu as gns

# the channels-last GroupNorm by its one-launch kernel too (the tiny cases have too few programs for it)
cases |= {name + ", one launch": case for name, case in cases.items() if "group_norm" in name}
rule = gns._CL_ONE_PROGRAMS, gns._CL_ONE_MAX
out = {}
with FakeTensorMode():
    for name, (op, args) in cases.items():
        one = name.endswith(", one launch")
        gns._CL_ONE_PROGRAMS, gns._CL_ONE_MAX = (1, gns._CL_ONE_RULE_MAX) if one else rule
        args = [torch.empty_strided(a.shape, a.stride(), dtype=a.dtype, device="cuda") if isinstance(a, torch.Tensor)
                else a for a in args]
        gm = make_fx(dispatch_functionalize(lambda *a: op(*a)))(*args)
        for n in gm.graph.nodes:
            if n.op == "call_function" and "triton_kernel_wrapper_functional" in str(n.target):
                k = kernel_side_table.get_kernel(n.kwargs["kernel_idx"])
                out.setdefault(name, []).append([k.fn.__name__, sorted(n.kwargs["tensors_to_clone"])])
print(json.dumps(out))
"""

# what each kernel stores to (its tl.store targets)
_WRITES = {
    "_adaln_modulate_kernel": ["out_ptr"], "_gated_residual_adaln_kernel": ["h_out_ptr", "x_out_ptr"],
    "_qk_norm_rope_kernel": ["out_ptr"], "_rms_norm_silu_kernel": ["out_ptr"],
    "_group_norm_silu_stats_kernel": ["part_ptr"], "_group_norm_silu_kernel": ["out_ptr"],
    "_gn_cl_stats_shifted_kernel": ["part_ptr"], "_gn_cl_finalize_kernel": ["mean_ptr", "scale_ptr"],
    "_gn_cl_apply_kernel": ["out_ptr"], "_gn_cl_one_kernel": ["out_ptr"], "_short_attention_kernel": ["o_ptr"],
    "_geglu_linear_kernel": ["y_ptr"],
}  # not _block_attention_kernel: its op is opaque to torch.compile (no traced launch; wmbook.kernels.block_attention)


def test_inductor_finds_each_kernel_writes_its_outputs_only(run_uninterpreted):
    """An input the analysis takes for written is copied before every launch, and x of the GroupNorm kernels taken
    for written broke inductor's scheduler on the wma UNet (H100, f07412f). This fails on the kernels as they were
    there (x_ptr and add_ptr among the writes of the normalizing and apply kernels, add_ptr of the stats kernel)."""
    import json

    pytest.importorskip("triton.backends.nvidia")
    out = run_uninterpreted(_WRITES_CHILD)
    assert out.returncode == 0, out.stderr[-3000:]
    found = json.loads(out.stdout.strip().splitlines()[-1])
    launched = {k for launches in found.values() for k, _ in launches}
    assert launched == set(_WRITES), launched  # every kernel was traced (both GroupNorm layouts)
    wrong = {op: [(k, w) for k, w in launches if w != _WRITES[k]] for op, launches in found.items()}
    assert not any(wrong.values()), wrong
