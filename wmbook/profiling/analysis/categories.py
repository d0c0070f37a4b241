"""The one category rule: which operator category a device activity (or, on a CPU-only trace, an aten op) is.

Rule, in order, for a device activity:
1. memcpy and memset activities are `memcpy/memset`;
2. a kernel launched inside an SDPA/attention or convolution op (the launching op or any op enclosing it) is
   `attention` / `convolution`: the math SDPA backend launches bmm/softmax kernels and a convolution may
   launch layout transforms, and those kernels belong to the enclosing op (the enclosing-op rule);
3. else the launching op's name decides (`_OP_CATEGORY`: aten ops, and wmbook's fused ops: the normalizations
   with their epilogues, the attentions, the GEGLU GEMM), else the kernel's name: an inductor kernel
   (`triton_{poi,red,per,tem}_fused_<ops>_<n>`) by its kind and the ops it fused (`inductor_category`: a pointwise
   kernel named after the convolution whose bias it adds is elementwise work, not convolution), any other by
   `_KERNEL_CATEGORY` (compiled code often has no launching aten op);
4. else `other`.
On a trace without device activity the same rule runs on aten ops: the enclosing-op rule, then the op name.

`activity_categories(trace)` and `op_categories(trace)` are what every table uses (analyze, kernel_summary);
`wmbook.profiling.analysis.time_by_category` sums a region's time by them.
"""

from __future__ import annotations

import re

import numpy as np

from ..trace import Trace, topo_order

CATEGORIES = (
    "GEMM/linear", "attention", "convolution", "normalization", "elementwise/activation",
    "copy/cast", "reduction", "memcpy/memset", "other",
)  # fmt: skip

_OP_CATEGORY = [
    ("attention", re.compile(r"^aten::(_scaled_dot_product|scaled_dot_product|_flash_attention|_efficient_attention"
                             r"|_cudnn_attention|flash_attn|_fused_sdp)|flex_attention|flash_attn|"
                             r"^wmbook::(short_attention|block_attention)$")),
    ("convolution", re.compile(r"^aten::(convolution|_convolution|cudnn_convolution|conv\d|conv_|"
                               r"miopen_convolution|mkldnn_convolution|_?slow_conv|thnn_conv|_nnpack)")),
    ("GEMM/linear", re.compile(r"^aten::(mm|addmm|bmm|baddbmm|matmul|linear|addbmm|_addmm_activation|"
                               r"_scaled_mm|addmv|mv|dot|einsum)$|^wmbook::geglu_linear$")),
    ("normalization", re.compile(r"^aten::(native_layer_norm|layer_norm|group_norm|native_group_norm|rms_norm|"
                                 r"_fused_rms_norm|batch_norm|native_batch_norm|_batch_norm|instance_norm|"
                                 r"cudnn_batch_norm)|^wmbook::(group_norm_silu|group_norm|rms_norm_silu|adaln_modulate|"
                                 r"gated_residual_adaln|qk_norm_rope|head_norm_rope)$")),
    ("copy/cast", re.compile(r"^aten::(copy_|to|_to_copy|clone|contiguous|cat|stack|_unsafe_view|index_copy_?|"
                             r"slice_scatter|roll|repeat|repeat_interleave|index|index_select|gather|"
                             r"index_put_?|_index_put_impl_|narrow_copy|pad|constant_pad_nd|flip|"
                             r"masked_scatter|scatter_?|expand_copy|permute_copy|as_strided_copy)$")),
    ("reduction", re.compile(r"^aten::(sum|mean|amax|amin|max|min|var|std|var_mean|norm|linalg_vector_norm|"
                             r"softmax|_softmax|log_softmax|_log_softmax|cumsum|argmax|argmin|prod|any|all|"
                             r"topk|sort|logsumexp)$")),
    ("elementwise/activation", re.compile(r"^aten::(add|add_|sub|sub_|mul|mul_|div|div_|neg|pow|rsqrt|sqrt|"
                                          r"exp|log|sin|cos|tanh|sigmoid|silu|silu_|gelu|relu|relu_|"
                                          r"addcmul|addcdiv|lerp|where|clamp|clamp_|clip|fill_|zero_|zeros|"
                                          r"ones|full|arange|reciprocal|abs|sign|floor|ceil|round|"
                                          r"bitwise_\w+|eq|ne|lt|le|gt|ge|logical_\w+|masked_fill_?|"
                                          r"rand|randn|normal_|uniform_|randn_like|rand_like|empty|"
                                          r"maximum|minimum|square|exp2|erf|expm1|log1p|triu|tril|"
                                          r"polar|complex|view_as_real|view_as_complex|outer|"
                                          r"_foreach_\w+|upsample_\w+|_upsample_\w+|nonzero|clamp_min|"
                                          r"clamp_max|hardtanh|softplus|mish|gelu_|sigmoid_|tanh_|exp_)$")),
]

_KERNEL_CATEGORY = [
    ("attention", re.compile(r"flash|fmha|attention|sdpa|_attn|mha_|flash_fwd|flex", re.I)),
    ("convolution", re.compile(r"conv|implicit_gemm|fprop|dgrad|wgrad|winograd|nchwToNhwc|nhwcToNchw", re.I)),
    ("GEMM/linear", re.compile(r"gemm|nvjet|cutlass|cublas|sm\d+_xmma|ampere_|hopper_|volta_|turing_|"
                               r"splitKreduce|triton_tem_|_mm_|matmul|"
                               r"_geglu_linear_|_wave_linear_", re.I)),  # the last two: wmbook's GEMMs
    ("normalization", re.compile(r"layer_norm|group_norm|rms_norm|batch_norm|RowwiseMoments|"
                                 r"ComputeFusedParams|GroupNorm|LayerNorm|"
                                 r"_gn_cl_|adaln|qk_norm|head_norm", re.I)),  # the last four: wmbook's kernels
    ("copy/cast", re.compile(r"copy|CatArray|gather|scatter|index|_to_copy|convert|transpose|permute|"
                             r"flip|roll", re.I)),
    ("reduction", re.compile(r"reduce|softmax|triton_red_|triton_per_|Reduce|cumsum|scan|sort", re.I)),
    ("elementwise/activation", re.compile(r"elementwise|Functor|triton_poi_|fill|arange|silu|gelu|"
                                          r"sigmoid|tanh|exp|_kernel_cuda|distribution|philox|where", re.I)),
]
_CONTEXT_CATEGORIES = ("attention", "convolution")  # an enclosing op of these kinds owns all its kernels

_INDUCTOR = re.compile(r"^triton_(poi|red|per|tem)_fused_(.*?)(?:_\d+)?$")
_FUSED_NORM = re.compile(r"group_norm|layer_norm|rms_norm|batch_norm|var_mean")
# copies and views, and the underscores between op names: what is left of a copies-only name is empty
_FUSED_COPY = re.compile(r"_unsafe_view|_to_copy|clone|copy|cat|stack|permute|transpose|view|expand|slice|select|"
                         r"unsqueeze|squeeze|index|constant_pad_nd|repeat|roll|flip|as_strided|_")


def inductor_category(kernel_name: str) -> str | None:
    """The category of an inductor-generated Triton kernel from its name, None for any other kernel. Inductor names a
    kernel by its kind (poi: pointwise, red/per: reduction, tem: a GEMM or convolution template) and the aten ops it
    fused, so `triton_poi_fused_convolution_3` is the bias add after an extern (cuDNN) convolution and
    `triton_red_fused_convolution_native_group_norm_0` the GroupNorm statistics of a convolution's output: neither
    is convolution work. Rules: a template is convolution when it fused one, else GEMM; a kernel that fused a
    normalization is normalization; any other reduction (a softmax included) is reduction; a pointwise kernel that
    fused only copies and views is copy/cast, else elementwise."""
    m = _INDUCTOR.match(kernel_name or "")
    if m is None:
        return None
    kind, ops = m.groups()
    if kind == "tem":
        return "convolution" if "convolution" in ops else "GEMM/linear"
    if _FUSED_NORM.search(ops):
        return "normalization"
    if kind in ("red", "per"):
        return "reduction"
    return "copy/cast" if ops and not _FUSED_COPY.sub("", ops) else "elementwise/activation"


def classify(kernel_name: str, op_name: str | None = None, cat: str = "kernel") -> str:
    """Category of one device activity from its trace category, launching aten op and kernel name (rules 1, 3
    and 4 of the module docstring; rule 2 needs the op tree: `activity_categories`)."""
    if cat in ("gpu_memcpy", "gpu_memset"):
        return "memcpy/memset"
    if isinstance(op_name, str) and op_name:
        for name, rx in _OP_CATEGORY:
            if rx.search(op_name):
                return name
    by_inductor = inductor_category(kernel_name)
    if by_inductor is not None:
        return by_inductor
    for name, rx in _KERNEL_CATEGORY:
        if rx.search(kernel_name or ""):
            return name
    return "other"


def classify_cpu_op(op_name: str) -> str:
    """Category of an aten op from its name alone."""
    for name, rx in _OP_CATEGORY:
        if rx.search(op_name):
            return name
    return "other"


def context_categories(names: list[str], parent: np.ndarray) -> np.ndarray:
    """Per op: 'attention'/'convolution' when it or an enclosing op is SDPA/conv, else '' (rule 2)."""
    rx = [(c, dict(_OP_CATEGORY)[c]) for c in _CONTEXT_CATEGORIES]
    own = np.array([next((c for c, r in rx if r.search(n)), "") for n in names], dtype=object)
    out = own.copy()
    for i in topo_order(parent):  # parents first
        if not out[i] and parent[i] >= 0:
            out[i] = out[parent[i]]
    return out


def _op_context(trace: Trace) -> np.ndarray:
    O = trace.ops
    return trace.memo("op_context", lambda: context_categories(O["name"].tolist(), O["parent"].to_numpy(np.int64))
                      if len(O) else np.zeros(0, dtype=object))


def activity_op_names(trace: Trace) -> list:
    """Name of the launching aten op of each device activity (None when unknown)."""
    def compute():
        names = trace.ops["name"].tolist()
        return [names[i] if i >= 0 else None for i in trace.device_activities["op"].to_numpy(np.int64)]

    return trace.memo("activity_op_names", compute)


def activity_categories(trace: Trace) -> np.ndarray:
    """The category of every device activity of the trace (aligned with trace.device_activities)."""
    def compute():
        K = trace.device_activities
        ctx = _op_context(trace)
        oidx = K["op"].to_numpy(np.int64)
        return np.array([ctx[i] if i >= 0 and ctx[i] and c == "kernel" else classify(n, o, c)
                         for n, o, c, i in zip(K["name"], activity_op_names(trace), K["kind"], oidx)], dtype=object)

    return trace.memo("activity_categories", compute)


def op_categories(trace: Trace) -> np.ndarray:
    """The category of every op of the trace under the CPU-only rule (aligned with trace.ops)."""
    def compute():
        ctx = _op_context(trace)
        return np.array([ctx[i] or classify_cpu_op(n) for i, n in enumerate(trace.ops["name"])], dtype=object)

    return trace.memo("op_categories", compute)
