"""The DiT's attention calls at a preset's real shapes, kernel by kernel (GPU): wmbook's Triton block attention
(`wmbook.kernels.block_attention`, its default tiles and a sweep of others) against every SDPA backend torch has
here (flash, cuDNN, memory-efficient, and SDPA's own choice) and, where the nvidia-cudnn-frontend wheel is installed,
cuDNN's fp8 attention (q, k, v per-tensor e4m3, output bf16, or e4m3 where cuDNN builds no bf16 output: Hopper),
on the same q/k/v.

    PYTHONPATH=$PWD python3 tools/attn_bench.py [--preset mg2-universal] [--repeats 50] [--json attn.json]

The calls: a block's self-attention over the window its KV cache holds (each length the stream produces: the first
block alone, then one more block each up to the window) and the cross-attention to its context (image tokens for
i2v, text for t2v). Each kernel: median (p20-p80) of `repeats` CUDA-event timings after warm-up, one call at a time,
and the same call inside a CUDA graph (GRAPH_CALLS of it captured, replayed back to back: its cost in a captured
forward, without the host's launch), TFLOP/s from 4 * B * H * Lq * Lk * D, and its error against fp32 SDPA (relative
L2; a kernel over its budget, bf16's or fp8's, is marked and its time does not count).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import math

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from wmbook.bench import dit_bench_args, time_fn, time_in_graph
from wmbook.check import TOLERANCES, compare
from wmbook.errors import command
from wmbook.kernels import block_attention as ba

# a bf16 attention's output against fp32: the inputs' rounding (2^-8 relative) carried through a softmax-weighted
# average, a few parts in a thousand; 2e-2 leaves room for long rows and fails a wrong kernel by orders of magnitude
BF16_BUDGET = 2e-2
# an fp8 (e4m3) attention's output: q, k, v and the softmax probabilities each rounded to 3 mantissa bits (unit
# roundoff 2^-4), the check module's fp8 bound
FP8_BUDGET = TOLERANCES["fp8"][0]
E4M3_MAX = 448.0  # the largest finite float8_e4m3fn
GRAPH_CALLS = 8  # calls of one kernel per captured graph (time_in_graph)
TILES = ((128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 32, 4, 4),
         (64, 128, 4, 3), (128, 64, 8, 4))
SDPA = (("sdpa (its choice)", None), ("sdpa flash", SDPBackend.FLASH_ATTENTION),
        ("sdpa cudnn", SDPBackend.CUDNN_ATTENTION), ("sdpa efficient", SDPBackend.EFFICIENT_ATTENTION))


def calls(preset) -> list[tuple[str, int, int]]:
    """(label, Lq, Lk) of the DiT's attention calls at a causal-Wan preset."""
    per_frame = (preset.height // 16) * (preset.width // 16)  # VAE stride 8, patch 2
    lq = per_frame * preset.num_frame_per_block
    window = preset.local_attn_size if preset.local_attn_size > 0 else preset.max_latent_frames
    out = []
    for frames in range(preset.num_frame_per_block, window + 1, preset.num_frame_per_block):
        out.append((f"self, {frames} frames cached", lq, per_frame * frames))
    # the cross-attention's context: CLIP image tokens for i2v (mg2), text for t2v
    out.append(("cross, context", lq, preset.clip_tokens if preset.model_type == "i2v" else preset.text_len))
    return out


def _to_fp8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-tensor e4m3 quantization: (x * scale in fp8, 1 / scale as a [1, 1, 1, 1] fp32 tensor), scale mapping the
    tensor's largest magnitude to the format's largest value."""
    scale = E4M3_MAX / x.detach().abs().amax().float().clamp_min(1e-12)
    return (x.float() * scale).to(torch.float8_e4m3fn), (1.0 / scale).reshape(1, 1, 1, 1)


def cudnn_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out_fp8: bool = False):
    """cuDNN's fp8 attention (nvidia-cudnn-frontend's graph API, `sdpa_fp8`) on [B, L, H, D] bf16 q/k/v: q, k and v
    quantized per tensor to e4m3, the probabilities scaled by 448 (cuDNN's bound for e4m3 without dropout), the output
    in bf16, or (out_fp8) in e4m3 in v's units: an output row is a convex combination of v's rows, so v's scale keeps
    it within 448, and the output's descale is v's (what a consumer in fp8, the output projection, would take; cuDNN
    builds bf16 outputs of fp8 attention on Blackwell only). Returns (run on fp8 inputs already quantized, run that
    quantizes q, k and v first, the output of either as a bf16 tensor); raises where the frontend, the cuDNN library or
    the GPU does not take it."""
    import cudnn  # noqa: PLC0415  optional: the nvidia-cudnn-frontend wheel

    b, lq, h, d = q.shape
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    graph = cudnn.pygraph(io_data_type=cudnn.data_type.FP8_E4M3, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    (q8, dq), (k8, dk), (v8, dv) = _to_fp8(q), _to_fp8(k), _to_fp8(v)
    # the graph takes [B, H, L, D] views of the [B, L, H, D] tensors (no copy: strides say the layout)
    tq, tk, tv = (graph.tensor_like(t.transpose(1, 2)) for t in (q8, k8, v8))
    scalars = {n: torch.full((1, 1, 1, 1), val, device=q.device, dtype=torch.float32)
               for n, val in (("descale_s", 1.0 / E4M3_MAX), ("scale_s", E4M3_MAX), ("scale_o", 1.0))}
    scalars |= {"descale_q": dq, "descale_k": dk, "descale_v": dv}
    if out_fp8:
        scalars["scale_o"] = 1.0 / dv
    ts = {n: graph.tensor_like(t) for n, t in scalars.items()}
    o, _, _, amax_o = graph.sdpa_fp8(q=tq, k=tk, v=tv, **ts, attn_scale=1.0 / math.sqrt(d), generate_stats=False)
    out = torch.empty(b, lq, h, d, device=q.device, dtype=torch.float8_e4m3fn if out_fp8 else torch.bfloat16)
    ov = out.transpose(1, 2)
    o.set_output(True).set_dim(list(ov.shape)).set_stride(list(ov.stride())).set_data_type(
        cudnn.data_type.FP8_E4M3 if out_fp8 else cudnn.data_type.BFLOAT16)
    amax = torch.empty(1, 1, 1, 1, device=q.device, dtype=torch.float32)
    amax_o.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(cudnn.data_type.FLOAT)
    graph.validate()
    graph.build_operation_graph()
    graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
    graph.check_support()
    graph.build_plans()
    workspace = torch.empty(graph.get_workspace_size(), device=q.device, dtype=torch.uint8)
    pack = {tq: q8.transpose(1, 2), tk: k8.transpose(1, 2), tv: v8.transpose(1, 2), o: ov, amax_o: amax}
    pack |= {ts[n]: scalars[n] for n in ts}

    def run():
        graph.execute(pack, workspace, handle=handle)
        return out

    def quantize_and_run():
        for name, src, dst in (("descale_q", q, q8), ("descale_k", k, k8), ("descale_v", v, v8)):
            x8, ds = _to_fp8(src)
            dst.copy_(x8)
            scalars[name].copy_(ds)
        return run()

    def as_bf16(o8: torch.Tensor) -> torch.Tensor:
        return (o8.float() * scalars["descale_v"].reshape(1, 1, 1, 1)).to(torch.bfloat16) if out_fp8 else o8

    return run, quantize_and_run, as_bf16


def _bench_call(label: str, lq: int, lk: int, heads: int, d: int, g, repeats: int, dev) -> list[dict]:
    q = torch.randn(1, lq, heads, d, device=dev, generator=g, dtype=torch.bfloat16)
    k = torch.randn(1, lk, heads, d, device=dev, generator=g, dtype=torch.bfloat16)
    v = torch.randn(1, lk, heads, d, device=dev, generator=g, dtype=torch.bfloat16)
    ref = ba.block_attention_ref(q.float(), k.float(), v.float())
    flops = ba.block_attention_flops(q, k)

    # each kernel timed inside its SDPA backend's context, entered once: entered around every call, its host time
    # would sit between the timed events of calls shorter than the host's work (the cross-attention's 0.05 ms)
    kernels = [(name, [backend] if backend is not None else None, lambda: ba.block_attention_ref(q, k, v))
               for name, backend in SDPA]
    kernels += [(f"triton {bm}x{bn} w{w} s{s}", None, lambda t=(bm, bn, w, s): ba.block_attention(q, k, v, *t))
                for bm, bn, w, s in TILES]
    rows = []
    budgets, views = {}, {}
    # bf16 output first; e4m3 output where that is refused (Hopper)
    has_cudnn_fp8 = dev.type == "cuda" and importlib.util.find_spec("cudnn") is not None
    for out_fp8, out_name in ((False, "bf16 out"), (True, "e4m3 out")) if has_cudnn_fp8 else ():
        try:
            run, quantize_and_run, as_bf16 = cudnn_fp8(q, k, v, out_fp8=out_fp8)
        except Exception as e:  # noqa: BLE001 - where cuDNN's fp8 attention cannot run, the table says why
            rows.append({"call": label, "lq": lq, "lk": lk, "kernel": f"cudnn fp8, {out_name}",
                         "error": f"{type(e).__name__}: {str(e).splitlines()[0][:160] if str(e) else ''}"})
            continue
        kernels += [(f"cudnn fp8, {out_name} (q, k, v already e4m3)", None, run),
                    (f"cudnn fp8, {out_name} + per-tensor quantize of q, k, v", None, quantize_and_run)]
        budgets |= {name: FP8_BUDGET for name, _, _ in kernels[-2:]}
        views |= {name: as_bf16 for name, _, _ in kernels[-2:]}
        break
    for name, backends, fn in kernels:
        try:
            with sdpa_kernel(backends) if backends else contextlib.nullcontext():
                err = compare(views.get(name, lambda o: o)(fn()), ref).rel_l2
                t = time_fn(fn, warmup=5, repeats=repeats, device=dev)
                # the same call captured GRAPH_CALLS times in one CUDA graph and replayed: its cost inside a captured
                # forward (how the stack runs it), free of the host's launch, which can sit inside the
                # one-call-at-a-time timing of a short call with a Python launcher (Triton's) on a busy host
                # (cuDNN's fp8 graph runs on its handle's stream, not the capturing one: it keeps its one-call time)
                tg = None
                if name not in views:
                    try:
                        tg = time_in_graph(fn, GRAPH_CALLS, rounds=max(3, repeats // 5), device=dev)
                    except RuntimeError as e:  # a call that cannot be captured keeps its one-call timing
                        print(f"  {label} {name}: not captured ({str(e).splitlines()[0][:100]})", flush=True)
        except (RuntimeError, ValueError) as e:  # a backend that does not take this shape says so
            rows.append({"call": label, "lq": lq, "lk": lk, "kernel": name, "error": str(e).splitlines()[0][:120]})
            continue
        ok = err <= budgets.get(name, BF16_BUDGET)
        row = {"call": label, "lq": lq, "lk": lk, "kernel": name, "median_ms": t.median, "p20": t.p20,
               "p80": t.p80, "tflops": flops / (t.median * 1e-3) / 1e12 if ok else math.nan,
               "rel_l2_vs_fp32": err, "gate": "pass" if ok else "FAIL"}
        if tg is not None:
            row |= {"graph_ms": tg.median, "graph_p20": tg.p20, "graph_p80": tg.p80,
                    "graph_tflops": flops / (tg.median * 1e-3) / 1e12 if ok else math.nan}
        rows.append(row)
    return rows


@command("attn_bench.py")
def main(argv=None) -> int:
    a, p, dev = dit_bench_args(__doc__, argv)
    heads, d = p.num_heads, p.dim // p.num_heads
    g = torch.Generator(device=dev).manual_seed(0)
    rows = []
    for label, lq, lk in calls(p):
        rows += _bench_call(label, lq, lk, heads, d, g, a.repeats, dev)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, preset {a.preset}: B=1, H={heads}, D={d}, bf16")
    for r in rows:
        if "error" in r:
            print(f"{r['call']:26s} {r['kernel']:24s} not run: {r['error']}")
        else:
            graph = (f" | in a graph {r['graph_ms']:.4f} ms ({r['graph_p20']:.4f}-{r['graph_p80']:.4f})"
                     f" {r['graph_tflops']:6.1f} TFLOP/s" if "graph_ms" in r else " | not captured")
            print(f"{r['call']:26s} {r['kernel']:24s} {r['median_ms']:8.4f} ms ({r['p20']:.4f}-{r['p80']:.4f})"
                  f" {r['tflops']:7.1f} TFLOP/s{graph}  rel {r['rel_l2_vs_fp32']:.2e} {r['gate']}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "preset": a.preset,
                       "heads": heads, "head_dim": d, "repeats": a.repeats, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
