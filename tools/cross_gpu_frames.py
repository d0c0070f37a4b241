"""Do two GPUs of one kind give the same frames for the same stack and seed? Each stack is built on every visible GPU
in turn (one process; the process-wide switches restored before each build), runs one untimed iteration (wma) or
generation (mg2) and then one more on the same inputs; its output is compared with the first GPU's, and each GPU's
second run with its first (run-to-run on one GPU).

Why: notebook 08's data-parallel ranks found their frames not bit-equal to rank 0's with notebook 06's wma stack,
which picks convolution algorithms by timing them on each GPU (cudnn-benchmark). Run stacks with and without it,
one invocation each: PyTorch keeps the cuDNN algorithm it first picked for a convolution shape on a GPU for the rest
of the process, so a stack with the search after one without it on the same shapes would time nothing (refused):

    python3 tools/cross_gpu_frames.py --workload wma --stacks "tf32,bf16,norm-input-dtype,channels-last"
    python3 tools/cross_gpu_frames.py --workload wma --stacks "tf32,bf16,norm-input-dtype,channels-last,cudnn-benchmark"
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from wmbook import check, workloads  # noqa: E402
from wmbook.variants import GlobalFlags, mixed_cudnn_search  # noqa: E402
from wmbook.variants.ladder import apply_stack  # noqa: E402


def _output(wl, pipe, seed: int, steps: int):
    """The frames one run produces (wma: the world-model pass's; mg2: the decoded stream's)."""
    if wl.name == "wma":
        inputs = pipe.prepare(seed=seed, batch=1)
        return pipe.run_iteration(inputs, ddim_steps=steps, progress=False).world.frames.float().cpu()
    inputs = pipe.prepare(3, seed=seed)
    return pipe.generate(inputs, progress=False).frames.float().cpu()


def _compare(a: torch.Tensor, b: torch.Tensor) -> str:
    if torch.equal(a, b):
        return "bit-equal"
    g = check.compare(a, b, dtype="fp32", frames=True)
    return f"{g.psnr:.1f} dB (max abs diff {g.max_abs:.3g})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="wma", choices=["wma", "mg2"])
    ap.add_argument("--preset", default=None, help="default: the workload's real preset on a GPU")
    ap.add_argument("--stacks", required=True, help="comma-separated variants per stack; stacks separated by ';'")
    ap.add_argument("--steps", type=int, default=2, help="wma: DDIM steps per pass (notebook 08's default)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    stacks = [[n for n in s.split(",") if n] for s in a.stacks.split(";")]
    if why := mixed_cudnn_search(stacks):
        ap.error(f"--stacks: {why}")
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        ap.error(f"needs at least 2 GPUs; this host has {torch.cuda.device_count()}")
    wl = workloads.get(a.workload)
    preset_name = a.preset or ("wma" if a.workload == "wma" else "mg2-universal")
    if preset_name not in wl.presets:
        ap.error(f"--preset={preset_name!r} is not allowed; allowed values: {sorted(wl.presets)}")
    flags = GlobalFlags()
    for stack in stacks:
        first = None
        for i in range(torch.cuda.device_count()):
            flags.restore()
            dev = torch.device(f"cuda:{i}")
            torch.cuda.set_device(dev)
            t0 = time.perf_counter()
            ref = wl.reference_pipeline(wl.presets[preset_name], dev, a.seed)
            pipe, _ = apply_stack(ref, wl, stack, dev)
            del ref
            out1 = _output(wl, pipe, a.seed, a.steps)
            out2 = _output(wl, pipe, a.seed, a.steps)
            first = out1 if first is None else first
            print(f"{' + '.join(stack)} | GPU {i} ({torch.cuda.get_device_name(dev)}): against GPU 0 "
                  f"{_compare(out1, first)}; "
                  f"second run against its first {_compare(out2, out1)} ({time.perf_counter() - t0:.0f} s)",
                  flush=True)
            del pipe
            torch.cuda.empty_cache()
    flags.restore()
    return 0


if __name__ == "__main__":
    sys.exit(main())
