"""Quick real-shape check of the WMA pipeline on a GPU: 2-step iterations in bf16 and fp32, timings and memory.

    PYTHONPATH=$PWD python3 tools/smoke_wma.py
"""
import time

import torch

from wmbook.models.wma.flops import unet_forward_flops
from wmbook.pipelines.ddim import WMAInteractionPipeline
from wmbook.presets import get_preset

p = get_preset("wma")
print(f"UNet forward {unet_forward_flops(p)['total'] / 1e12:.2f} TFLOP")
for dtype in ("bf16", "fp32"):
    t0 = time.perf_counter()
    pipe = WMAInteractionPipeline("wma", device="cuda", dtype=dtype, vae_dtype="fp32", seed=0)
    inputs = pipe.prepare(seed=0)
    print(f"[{dtype}] build + prepare {time.perf_counter() - t0:.1f} s")
    for i in range(2):
        out = pipe.run_iteration(inputs, ddim_steps=2, progress=False)
        fw = out.decision.forward_ms + out.world.forward_ms
        print(f"[{dtype}] iteration {i}: {out.iteration_ms:.0f} ms; forwards {[round(x, 1) for x in fw]} ms; "
              f"decode {out.decision.decode_ms:.0f}+{out.world.decode_ms:.0f} ms; cond {out.conditioning_ms:.0f} ms; "
              f"peak {out.peak_memory_bytes / 2**30:.1f} GiB")
    del pipe, inputs, out
    torch.cuda.empty_cache()
