"""Exploration for notebook 04 (GPU only): eager vs regional torch.compile of the mg2 DiT, cold compile
time, steady forward time and recompiles over a 4-block streaming run with KV caches.

    PYTHONPATH=$PWD python3 tools/explore_compile.py
"""
import time

import torch
import torch._dynamo
from torch._dynamo.utils import counters

from wmbook.bench import time_fn
from wmbook.models.causal_wan import CausalWanModel
from wmbook.presets import get_preset

dev = torch.device("cuda")
p = get_preset("mg2-universal")
torch.manual_seed(0)
with torch.device(dev):
    m = CausalWanModel(p).eval().requires_grad_(False)
m.to(torch.bfloat16)
h, w = p.latent_hw
nb = 4
F = 3 * nb
ctx = torch.randn(1, 257, 1280, device=dev, dtype=torch.bfloat16)
cond = torch.randn(1, 20, F, h, w, device=dev, dtype=torch.bfloat16)
npix = 1 + 4 * (F - 1)
acts = {"mouse": torch.randn(1, npix, 2, device=dev, dtype=torch.bfloat16),
        "keyboard": torch.randn(1, npix, 4, device=dev, dtype=torch.bfloat16)}
x = torch.randn(1, 16, 3, h, w, device=dev, dtype=torch.bfloat16)


def stream(model, blocks=nb):
    cache = model.init_cache(1, dev, torch.bfloat16)
    for b in range(blocks):
        s = 3 * b
        for t in (1000.0, 908.8, 714.0, 0.0):
            tt = torch.full((1, 3), t, device=dev)
            model(x, tt, ctx, cond_concat=cond[:, :, s:s + 3], actions=acts, cache=cache, start_frame=s)
    return cache


with torch.no_grad():
    eager = time_fn(lambda: stream(m), warmup=1, repeats=3)
    print(f"eager 4-block stream (16 forwards): {eager}")
    torch._dynamo.reset()
    counters.clear()
    for blk in m.blocks:
        blk.compile()
    t0 = time.perf_counter()
    stream(m, 1)
    torch.cuda.synchronize()
    print(f"regional compile: first block (cold, incl. compile) {time.perf_counter() - t0:.1f} s")
    t0 = time.perf_counter()
    stream(m, nb)
    torch.cuda.synchronize()
    print(f"regional: full 4-block stream after first block {time.perf_counter() - t0:.1f} s")
    print("dynamo stats:", dict(counters["stats"]))
    print("recompile reasons:", dict(counters.get("recompiles", {})) if "recompiles" in counters else "n/a")
    comp = time_fn(lambda: stream(m), warmup=1, repeats=3)
    print(f"regional compiled 4-block stream: {comp}  (eager {eager.median:.0f} ms)")
    print("frames:", {k: v for k, v in counters["frames"].items()})
