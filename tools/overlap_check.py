"""Does decoding on a second stream (decode-overlap) change any latent or frame? The same stack with and without it,
end to end at a preset's shape, three runs each (graphs are captured during the first ones), compared bit for bit.

    PYTHONPATH=$PWD python3 tools/overlap_check.py --preset mg2-universal
"""

from __future__ import annotations

import argparse
import sys

import torch

from wmbook import workloads
from wmbook.errors import command
from wmbook.variants import GlobalFlags
from wmbook.variants.ladder import apply_stack

DECODER = ["vae-bf16", "vae-stream-buffers", "vae-channels-last"]


@command("overlap_check.py")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="mg2-universal")
    ap.add_argument("--blocks", type=int, default=4)
    a = ap.parse_args(argv)
    wl = workloads.get("mg2")
    dev = torch.device("cuda")
    base = [*wl.default_ladder(dev, None), "compile-regional", "static-caches", "ring-kv-cache", "cuda-graphs"]
    ref = wl.reference_pipeline(wl.presets[a.preset], dev)
    size = workloads.E2ESize(blocks=a.blocks)
    flags = GlobalFlags()
    for name, dec in (("eager decoder step", DECODER + ["vae-cuda-graphs"]),
                      ("compiled decoder step", DECODER + ["vae-compile", "vae-cuda-graphs"])):
        outs = {}
        for overlap in (False, True):
            flags.restore()
            pipe, _ = apply_stack(ref, wl, base + dec + (["decode-overlap"] if overlap else []), dev)
            outs[overlap] = [wl.end_to_end(pipe, 0, size) for _ in range(3)]
            del pipe
        for i, (x, y) in enumerate(zip(outs[False], outs[True])):
            lat = float((x.latents.float() - y.latents.float()).abs().max())
            fr = (x.frames.float() - y.frames.float()).abs()
            per_block = [float(fr[:, :, s:e].max()) for s, e in ((0, 9), (9, 21), (21, 33), (33, fr.shape[2]))]
            print(f"{name}, run {i}: latents max diff {lat:.3g}; frames max diff per block {per_block}; "
                  f"FPS {x.value:.1f} -> {y.value:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
