"""Host vs device time of one steady mg2-universal DiT forward, with and without the action modules (GPU only).

Run on a GPU host from the repo root: PYTHONPATH=$PWD python3 tools/diag_forward.py
"""
import time

import torch

from wmbook.bench import time_fn
from wmbook.models.causal_wan import CausalWanModel
from wmbook.presets import get_preset

dev = torch.device("cuda")
for name, kw in [("mg2 full", {}), ("mg2 no action", {"action": None})]:
    p = get_preset("mg2-universal").with_(**kw)
    torch.manual_seed(0)
    with torch.device(dev):
        m = CausalWanModel(p).eval().requires_grad_(False)
    m.to(torch.bfloat16)
    h, w = p.latent_hw
    F = 3
    ctx = torch.randn(1, 257, 1280, device=dev, dtype=torch.bfloat16)
    cond = torch.randn(1, 20, 6, h, w, device=dev, dtype=torch.bfloat16)
    acts = {"mouse": torch.randn(1, 1 + 4 * 5, 2, device=dev, dtype=torch.bfloat16),
            "keyboard": torch.randn(1, 1 + 4 * 5, 4, device=dev, dtype=torch.bfloat16)}
    x = torch.randn(1, 16, F, h, w, device=dev, dtype=torch.bfloat16)
    t = torch.full((1, F), 900.0, device=dev)
    cache = m.init_cache(1, dev, torch.bfloat16)
    with torch.no_grad():
        m(x, t, ctx, cond_concat=cond[:, :, :3], actions=acts, cache=cache, start_frame=0)
        f = lambda: m(x, t, ctx, cond_concat=cond[:, :, 3:], actions=acts, cache=cache, start_frame=3)
        tm = time_fn(f, warmup=3, repeats=20)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        f()
        t1 = time.perf_counter()  # host launch time
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                                torch.profiler.ProfilerActivity.CPU]) as prof:
            f()
            torch.cuda.synchronize()
    ka = prof.key_averages()
    top = sorted(ka, key=lambda e: -e.self_device_time_total)[:8]
    print(f"{name}: forward {tm}; host enqueue {1e3*(t1-t0):.1f} ms, drain {1e3*(t2-t1):.1f} ms")
    for e in top:
        print(f"   {e.key[:60]:60s} {e.self_device_time_total/1e3:8.2f} ms  x{e.count}")
