"""Where a wma interaction iteration at few DDIM steps goes: stacks side by side in one process, each iteration split
into its phases by the pipeline's own device events (conditioning, the decision pass's sampling and decode, the
world-model pass's sampling and decode, the rest), the UNet forwards counted apart from the sampling around them.

    python tools/wma_iteration_account.py --steps 2 --rounds 5 --json account.json
    python tools/wma_iteration_account.py --stack "mine=tf32,bf16,...,vae-cuda-graphs" --stack "other=..."

Default stacks: notebook 06's best stack at wma with upstream's decode and conditioning (the fp32 SD VAE, a frame per
call; every observed frame encoded, the text encoded every iteration), with the SD VAE in bf16, with each pass's frames
decoded as one batch, with only the kept observed frame encoded, the text tokens computed once and only the decoder in
bf16, with the image tokens and the VAE encoder captured too, and 06's best (also: each upsampling and the convolution
after it folded into one transposed convolution, in the UNet and in the decoder; the decoder's GroupNorm + SiLU pairs
as our kernel; in both, a convolution's bias added by the norm kernel after it; the UNet's temporal transformers'
GroupNorm by the same kernels, read in place; the VAE encoder in bf16, it and the image tokens compiled before their
capture; the decoder's attention as two GEMMs and a softmax; the graphs' small memsets as kernel nodes); every
decoder compiled and captured.
Each stack is built from one fp32 reference pipeline on the same seeded inputs; `--warmup` iterations (compiles,
autotuning, graph captures) are not timed; then the stacks take turns, `--rounds` iterations each. The first stack is
the reference of the others: their world-model frames are compared with its frames (PSNR) and with the fp32 eager
pipeline's. Medians with p20-p80 over the rounds.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import re
import sys
from pathlib import Path

import torch

from wmbook import variants, workloads
from wmbook.atomic import atomic_open
from wmbook.bench import Samples
from wmbook.check import compare
from wmbook.kernels import group_norm_silu as gns
from wmbook.profiling.analysis import format_idle_gaps, idle_gaps, kernels
from wmbook.profiling.collect import TRACE_GZIP_LEVEL, profile_calls
from wmbook.variants.ladder import apply_stack

BASE = ("tf32,bf16,norm-input-dtype,channels-last,temporal-channels-last,cudnn-benchmark,triton-fused,head-conv-gemm,"
        "compile-whole,skip-unused-decode")
GRAPHED = "skip-unused-heads,cuda-graphs"
# notebook 06's denoiser base: notebook 05's later kernels too (the conv biases in the norms, the up path's fold, the
# temporal transformers' norms)
BEST_BASE = BASE.replace("triton-fused", "triton-fused,norm-conv-bias").replace(
    "compile-whole", "upsample-fold,frames-norm-triton,compile-whole")
DEFAULT_STACKS = (f"upstream's decode and conditioning={BASE},{GRAPHED},vae-compile,vae-cuda-graphs",
                  f"bf16 VAE, a frame per call={BASE},{GRAPHED},vae-bf16,vae-compile,vae-cuda-graphs",
                  f"bf16 VAE, a pass per call={BASE},{GRAPHED},vae-bf16,vae-batch-frames,vae-compile,vae-cuda-graphs",
                  f"+ skip-unused-encode, constant-conditioning; the encoder in fp32={BASE},"
                  f"skip-unused-encode,constant-conditioning,{GRAPHED},vae-decoder-bf16,vae-batch-frames,vae-compile,"
                  "vae-cuda-graphs",
                  f"+ the conditioning encoders captured={BASE},skip-unused-encode,constant-conditioning,"
                  f"{GRAPHED},conditioning-cuda-graphs,vae-decoder-bf16,vae-batch-frames,vae-compile,vae-cuda-graphs",
                  f"06's best={BEST_BASE},"
                  f"skip-unused-encode,constant-conditioning,{GRAPHED},vae-encoder-bf16,conditioning-compile,"
                  "conditioning-cuda-graphs,vae-decoder-bf16,vae-batch-frames,vae-upsample-fold,vae-triton-fused,"
                  "vae-norm-conv-bias,vae-attn-gemm,vae-compile,vae-cuda-graphs,graph-memset-kernels")
PHASES = ("conditioning", "decision sampling", "decision decode", "world sampling", "world decode", "rest")


parse_stack = variants.parse_labelled_stack  # LABEL=variants


@contextlib.contextmanager
def gn_rule(one_launch: bool):
    """The channels-last GroupNorm launcher's one-launch size rule on inside (one_launch; off by default), as it is
    otherwise. Calls captured in a CUDA graph keep the kernels they were captured with; the rest launch at each call,
    so a stack's runs, not only its build, sit inside. With the rule on, inductor's compile caches are off too: the
    launcher picks its kernels when torch.compile traces the op, and whether those caches tell the two choices apart
    is not checked (dynamo's in-memory cache does not: main builds such stacks first and clears it after them)."""
    saved = gns._CL_ONE_MAX
    with contextlib.ExitStack() as stack:
        if one_launch:
            import torch._functorch.config  # noqa: PLC0415
            import torch._inductor.config  # noqa: PLC0415

            stack.enter_context(torch._inductor.config.patch(fx_graph_cache=False))
            stack.enter_context(torch._functorch.config.patch(enable_autograd_cache=False))
            gns._CL_ONE_MAX = gns._CL_ONE_RULE_MAX
        try:
            yield
        finally:
            gns._CL_ONE_MAX = saved


def phases(out) -> dict[str, float]:
    """One iteration's phases in ms (device events of the pipeline), the UNet forwards apart."""
    d = {"conditioning": out.conditioning_ms, "decision sampling": out.decision.sampling_ms,
         "decision decode": out.decision.decode_ms, "world sampling": out.world.sampling_ms,
         "world decode": out.world.decode_ms}
    d["rest"] = out.iteration_ms - sum(v for v in d.values() if v == v)
    d["UNet forwards"] = sum(out.decision.forward_ms) + sum(out.world.forward_ms)
    d["iteration"] = out.iteration_ms
    return d


def psnr(frames: torch.Tensor, ref: torch.Tensor) -> float:
    """PSNR (dB) of decoded frames against reference frames, as notebook 06's rows measure it."""
    return float(compare(frames, ref, dtype="fp32", frames=True).psnr)


def kernel_account(pipe, inputs, kw: dict, dev: torch.device, top: int, trace_to: Path | None = None) -> dict | None:
    """GPU time of one (warm) iteration by kernel category and its `top` longest kernels, and where the GPU waits in
    it (idle_gaps: the timeline's gaps, the memsets by the kernel after them), printed and returned (None off CUDA);
    the trace itself gzipped to `trace_to` where given. CUPTI sees the kernels of captured graphs, so graph replays
    are counted like launches."""
    with torch.no_grad():
        tr = profile_calls(lambda: pipe.run_iteration(inputs, **kw), dev)
    if tr is None:
        return None
    if trace_to is not None:  # atomic: a cut run leaves no half-written trace under the final name
        with atomic_open(trace_to, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", filename="",
                                                                compresslevel=TRACE_GZIP_LEVEL) as gz:
            gz.write(json.dumps(tr).encode())
    acc = kernels.kernel_account(tr, top=top)
    print(kernels.format_account(acc))
    gaps = idle_gaps(tr, top=top)
    print(format_idle_gaps(gaps))
    acc["gaps"] = {k: (v.reset_index().to_dict("records") if hasattr(v, "to_dict") else v) for k, v in gaps.items()}
    return acc


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="wma")
    ap.add_argument("--steps", type=int, default=2, help="DDIM steps of each pass (default 2: the knee)")
    ap.add_argument("--stack", type=parse_stack, action="append", help="LABEL=variants (repeatable; the first is "
                    "the reference of the others); default: notebook 06's best and three stacks before it")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--profile", type=int, default=0, metavar="N",
                    help="after the rounds, profile one iteration of each stack and print its GPU time by kernel "
                         "category and its N longest kernels (GPU only; default 0: no profile)")
    ap.add_argument("--trace", type=Path, default=None, metavar="DIR",
                    help="with --profile: write each stack's profiled iteration to DIR/<label>.json.gz (chrome trace)")
    ap.add_argument("--gn-one-launch", action="append", default=[], metavar="LABEL",
                    help="build, warm up and run stack LABEL with the channels-last GroupNorm launcher's one-launch "
                         "size rule on (off by default), to compare it side by side (repeatable; such stacks are "
                         "built first, with inductor's compile caches off, and dynamo's caches are cleared after "
                         "them)")
    a = ap.parse_args(argv)
    for name in ("steps", "warmup", "rounds"):
        if getattr(a, name) < 1:
            ap.error(f"--{name}={getattr(a, name)} is not allowed; allowed values: an integer >= 1")
    if a.profile < 0:
        ap.error(f"--profile={a.profile} is not allowed; allowed values: an integer >= 0")
    if a.trace is not None and not a.profile:
        ap.error("--trace needs --profile N (N >= 1): the trace is the profiled iteration's")
    stacks = a.stack or [parse_stack(s) for s in DEFAULT_STACKS]
    labels = [label for label, _ in stacks]
    for label in a.gn_one_launch:
        if label not in labels:
            ap.error(f"--gn-one-launch={label!r} is not allowed; allowed values: the stacks' labels {labels}")
    flipped = set(a.gn_one_launch)
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    wl = workloads.get("wma")
    if dev.type == "cpu" and a.preset == "wma":
        a.preset = wl.tiny_preset
    kw = {"decision_steps": a.steps, "world_steps": a.steps, "progress": False}

    ref = wl.reference_pipeline(a.preset, dev, a.seed)
    inputs = ref.prepare(seed=a.seed)
    with torch.no_grad():
        fp32 = ref.run_iteration(inputs, **kw).world.frames.float().cpu()
    built = {}
    # The one-launch stacks first, then dynamo's caches cleared: dynamo keeps compiled code per code object with
    # guards that do not tell two instances of a model apart, so a stack built after another of the same variants
    # would run the other's compiled code, whatever the GroupNorm launcher would pick now. Their captured graphs
    # keep the kernels they were captured with.
    for label, names in sorted(stacks, key=lambda s: s[0] not in flipped):
        with gn_rule(label in flipped):
            pipe, _ = apply_stack(ref, wl, names, dev)
            for i in range(a.warmup):
                print(f"{label}: warm-up {i + 1}/{a.warmup}", file=sys.stderr, flush=True)
                with torch.no_grad():
                    pipe.run_iteration(inputs, **kw)
        built[label] = pipe
        if label in flipped and len(built) == len(flipped):
            torch._dynamo.reset()
    pipes = {label: built[label] for label in labels}  # the stacks' order: the first is the reference
    times = {label: [] for label in pipes}
    frames = {}
    for r in range(a.rounds):
        for label, pipe in pipes.items():
            with torch.no_grad(), gn_rule(label in flipped):
                out = pipe.run_iteration(inputs, **kw)
            times[label].append(phases(out))
            frames[label] = out.world.frames.float().cpu()
        print(f"round {r + 1}/{a.rounds}", file=sys.stderr, flush=True)

    first = next(iter(pipes))
    result = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "preset": a.preset,
              "steps": a.steps, "warmup": a.warmup, "rounds": a.rounds, "stacks": {}}
    for (label, names), rows in zip(stacks, times.values()):
        summary = {}
        for key in (*PHASES, "UNet forwards", "iteration"):
            s = Samples([row[key] for row in rows])
            summary[key] = {"median": s.median, "p20": s.p20, "p80": s.p80}
        result["stacks"][label] = {
            "variants": names, "ms": summary, "rounds_ms": rows,
            "psnr_vs_fp32_db": psnr(frames[label], fp32),
            "psnr_vs_first_db": None if label == first else psnr(frames[label], frames[first])}
        it = summary["iteration"]
        print(f"\n{label}\n  iteration {it['median']:.1f} ms ({it['p20']:.1f}-{it['p80']:.1f}); frames "
              f"{result['stacks'][label]['psnr_vs_fp32_db']:.1f} dB vs fp32"
              + ("" if label == first else f", {result['stacks'][label]['psnr_vs_first_db']:.1f} dB vs {first}"))
        for key in (*PHASES, "UNet forwards"):
            m = summary[key]
            print(f"  {key:18s} {m['median']:8.2f} ms ({m['p20']:.2f}-{m['p80']:.2f})")
        result["stacks"][label]["gn_one_launch"] = label in flipped
        if a.profile:
            with gn_rule(label in flipped):
                to = a.trace / f"{re.sub(r'[^A-Za-z0-9._-]+', '_', label).strip('_')}.json.gz" if a.trace else None
                result["stacks"][label]["kernels"] = kernel_account(pipes[label], inputs, kw, dev, a.profile, to)
    if a.json:
        a.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
