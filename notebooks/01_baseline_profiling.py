# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 01 · Baseline profiling of the world model
#
# **Question.** How fast does the eager reference pipeline generate, where does the time go, and how far is
# one denoiser forward from its FLOP floor on this device? Two workloads:
#
# - `mg2`: the Matrix-Game-2 style block-causal Wan DiT with KV caches and a streaming Wan VAE decode;
# - `wma`: the UnifoLM-WMA style video UNet world model with its action head, sampled with DDIM twice per
#   interaction iteration (decision pass, world-model pass), decoded with the SD VAE.
#
# Definitions (as in the README): *forward* = one denoiser call on one block (causal DiT) or one sample step
# (UNet); *FPS* = decoded pixel frames per second in steady state (blocks after the first), counting every
# forward of a block (denoising steps and the cache-refresh pass) and the VAE decode, warm-up excluded;
# *first-frame latency* = generation start to the first decoded frame, warm; *BPS* = blocks per second, same
# accounting; *forward floor* = the forward's FLOPs over the measured bf16 GEMM ceiling of this device. For
# `wma` the unit is the interaction iteration: seconds per iteration, ms per DDIM step, ms per UNet forward.

# %% tags=["parameters"]
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

# %%
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Image, Markdown, display

from wmbook import device as wdev
from wmbook import results
from wmbook.studies import baseline as study

cfg = study.validate(workload=workload, preset=preset, device=device, dtype=dtype, vae_dtype=vae_dtype,
                     num_blocks=num_blocks, ddim_steps=ddim_steps, guidance_scale=guidance_scale, warmup=warmup,
                     repeats=repeats, profile=profile, output_dir=output_dir, results_path=results_path, seed=seed)
cfg.table()

# %% [markdown]
# ## Device ceilings (measured here, cached per device)

# %%
ceilings = wdev.measure_ceilings(cfg.device, quick=cfg.tiny)
pd.Series(ceilings, name="value").to_frame()

# %% [markdown]
# ## The reference pipeline at this preset

# %%
pipe, inputs = study.build(cfg)
study.model_table(pipe, inputs, cfg)

# %% [markdown]
# ## Eager baseline: warm-up excluded, device-event timing, median and spread over repeats

# %%
res = study.run_benchmark(pipe, inputs, cfg, ceilings)
study.summary_table(res)

# %%
res.run_table()

# %%
for title, table in res.detail_tables().items():
    display(Markdown(f"### {title}"))
    display(table)

# %% [markdown]
# ### One forward against its FLOP floor (analytic FLOPs by part, floor at the measured GEMM ceiling)

# %%
study.floor_table(cfg, ceilings)

# %%
study.plot_overview(cfg, res)
plt.show()

# %% [markdown]
# ## Profiled run: top-level stages and their shares

# %%
stages = None
if cfg.options.profile:
    stages, trace_path, labels = study.profile_stages(pipe, inputs, cfg)
    print("Chrome trace (open in https://ui.perfetto.dev or chrome://tracing):", trace_path)
    display(stages)
    study.plot_stage_shares(stages)
    plt.show()
else:
    print("profile=False: no profiled run")

# %%
if cfg.options.profile:
    sort_col = "cpu_total_ms" if "cpu_total_ms" in labels.columns else "total_ms"
    display(labels.sort_values(sort_col, ascending=False).head(15))

# %%
gifs = sorted(cfg.output_dir.rglob("*.gif"))
if gifs:
    display(Image(filename=str(gifs[0])))

# %% [markdown]
# ## Results rows

# %%
rows = study.result_rows(cfg, res, stages)
path = results.append(rows, cfg.results_path)
print(f"appended {len(rows)} rows to {path}")
results.read(cfg.results_path, run_id=rows[0]["run_id"])[["preset", "variant", "metric", "value", "unit", "p20", "p80"]]

# %% [markdown]
# ## Interpretation

# %%
Markdown(study.interpret(cfg, res, stages))
