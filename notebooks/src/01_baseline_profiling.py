CELLS = [
("md", """
# 01 · Baseline profiling of the world model

**Question.** How fast does the eager reference pipeline generate, where does the time go, and how far is
one denoiser forward from its FLOP floor on this device? Two workloads:

- `mg2`: the Matrix-Game-2 style block-causal Wan DiT with KV caches and a streaming Wan VAE decode;
- `wma`: the UnifoLM-WMA style video UNet world model with its action head, sampled with DDIM twice per
  interaction iteration (decision pass, world-model pass), decoded with the SD VAE.

Definitions (as in the README): *forward* = one denoiser call on one block (causal DiT) or one sample step
(UNet); *FPS* = decoded pixel frames per second in steady state (blocks after the first), counting every
forward of a block (denoising steps and the cache-refresh pass) and the VAE decode, warm-up excluded;
*first-frame latency* = generation start to the first decoded frame, warm; *BPS* = blocks per second, same
accounting; *forward floor* = the forward's FLOPs over the measured bf16 GEMM ceiling of this device. For
`wma` the unit is the interaction iteration: seconds per iteration, ms per DDIM step, ms per UNet forward.
"""),
("params", """
workload = "mg2"       # mg2 (causal DiT + KV cache) | wma (video UNet + DDIM)
preset = "auto"        # auto: tiny/tiny-wma on CPU, mg2-universal/wma on GPU | tiny | tiny-sf | mg2-universal | self-forcing | tiny-wma | wma
device = "auto"        # auto | cpu | cuda
dtype = "auto"         # auto: bf16 on GPU, fp32 on CPU | fp32 | bf16 | fp16
vae_dtype = "auto"     # auto: mg2 follows dtype, wma decodes in fp32 as upstream | fp32 | bf16 | fp16
num_blocks = 0         # mg2 only: blocks to generate; 0 means the preset default
ddim_steps = 0         # wma only: DDIM steps per pass; 0 means the preset default (50)
guidance_scale = 1.0   # wma only: classifier-free guidance scale; above 1 doubles the UNet forwards
warmup = 1             # untimed runs before timing
repeats = 3            # timed runs
profile = True         # stage table from a profiled run (and its torch.profiler trace)
output_dir = "auto"    # trace, video, saved results; auto: reports/artifacts/01_baseline_profiling/PRESET-DEVICE
results_path = "auto"  # auto: data/results/results.csv for real presets, reports/results/results-tiny.csv for tiny ones
seed = 0
"""),
("code", """
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Image, Markdown, display

from wmbook import device as wdev
from wmbook import results, workloads

cfg = workloads.validate(workload, preset=preset, device=device, dtype=dtype, vae_dtype=vae_dtype,
                         num_blocks=num_blocks, ddim_steps=ddim_steps, guidance_scale=guidance_scale,
                         warmup=warmup, repeats=repeats, profile=profile, output_dir=output_dir,
                         results_path=results_path, seed=seed)
bl = workloads.module(workload)
cfg.table()
"""),
("md", "## Device ceilings (measured here, cached per device)"),
("code", """
ceilings = wdev.measure_ceilings(cfg.device, quick=cfg.tiny)
pd.Series(ceilings, name="value").to_frame()
"""),
("md", "## The reference pipeline at this preset"),
("code", """
pipe, inputs = bl.build(cfg)
bl.model_table(pipe, inputs, cfg)
"""),
("md", "## Eager baseline: warm-up excluded, device-event timing, median and spread over repeats"),
("code", """
res = bl.run_benchmark(pipe, inputs, cfg, ceilings)
res.summary_table()
"""),
("code", "res.run_table()"),
("code", """
for title, table in res.detail_tables().items():
    display(Markdown(f"### {title}"))
    display(table)
"""),
("md", "### One forward against its FLOP floor (analytic FLOPs by part, floor at the measured GEMM ceiling)"),
("code", "bl.floor_table(pipe, cfg, ceilings)"),
("code", """
bl.plot_overview(res)
plt.show()
"""),
("md", "## Profiled run: top-level stages and their shares"),
("code", """
stages = None
if cfg.profile:
    stages, trace_path, labels = bl.profile_stages(pipe, inputs, cfg)
    print("Chrome trace (open in https://ui.perfetto.dev or chrome://tracing):", trace_path)
    display(stages)
    fig, ax = plt.subplots(figsize=(6, 2.4))
    ax.barh(stages.index[::-1], stages["share"][::-1] * 100, color="#228833")
    ax.set_xlabel("% of labelled time")
    ax.set_title("Top-level stages (profiled run)")
    plt.show()
else:
    print("profile=False: no profiled run")
"""),
("code", """
if cfg.profile:
    sort_col = "cpu_total_ms" if "cpu_total_ms" in labels.columns else "total_ms"
    display(labels.sort_values(sort_col, ascending=False).head(15))
"""),
("code", """
gifs = sorted(cfg.output_dir.rglob("*.gif"))
if gifs:
    display(Image(filename=str(gifs[0])))
"""),
("md", "## Results rows"),
("code", """
rows = bl.result_rows(cfg, res, stages)
path = results.append(rows, cfg.results_path)
print(f"appended {len(rows)} rows to {path}")
results.read(cfg.results_path, run_id=rows[0]["run_id"])[["preset", "variant", "metric", "value", "unit", "p20", "p80"]]
"""),
("md", "## Interpretation"),
("code", "Markdown(bl.interpret(cfg, res, stages))"),
]
