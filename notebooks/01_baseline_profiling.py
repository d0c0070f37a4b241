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
dtype = "auto"         # auto: on GPU upstream's eager precision (mg2 bf16, wma fp32), fp32 on CPU | fp32 | bf16 | fp16
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
from IPython.display import Markdown, display

from wmbook import device as wdev
from wmbook import display as wd
from wmbook import results
from wmbook.studies import baseline as study

wd.setup()
cfg = study.validate(workload=workload, preset=preset, device=device, dtype=dtype, vae_dtype=vae_dtype,
                     num_blocks=num_blocks, ddim_steps=ddim_steps, guidance_scale=guidance_scale, warmup=warmup,
                     repeats=repeats, profile=profile, output_dir=output_dir, results_path=results_path, seed=seed)
wd.table(cfg.table(), caption="Parameters of this run (validated)")

# %% [markdown]
# ## Device ceilings (measured here, cached per device)
# What to look for: the bf16 GEMM TFLOP/s. Every "x floor" number below divides by it, so a low ceiling (a CPU, a
# throttled GPU) makes every floor look closer than it is.

# %%
ceilings = wdev.measure_ceilings(cfg.device, quick=cfg.tiny)
wd.series(ceilings, caption="Measured ceilings")

# %% [markdown]
# ## The reference pipeline at this preset
# What to look for: the sizes that set the cost of a forward (tokens, layers, width) and how many forwards make one
# block or one iteration.

# %%
pipe, inputs = study.build(cfg)
wd.table(study.model_table(pipe, inputs, cfg), caption="Model and shapes")

# %% [markdown]
# ## Eager baseline: warm-up excluded, device-event timing, median and spread over repeats
# What to look for: the headline metric (FPS, or seconds per iteration) with its p20-p80 spread; a wide spread
# means the repeats disagree and one number should not be quoted alone.

# %%
res = study.run_benchmark(pipe, inputs, cfg, ceilings)
wd.table(study.summary_table(res), caption="Summary: median (p20-p80) over the timed runs")

# %%
wd.table(res.run_table(), caption="Each timed run")

# %%
for title, t in res.detail_tables().items():
    display(wd.table(t, caption=title))

# %% [markdown]
# ### One forward against its FLOP floor (analytic FLOPs by part, floor at the measured GEMM ceiling)
# What to look for: which part holds the FLOPs; the measured forward divided by the total floor is how far eager
# PyTorch is from the hardware.

# %%
wd.table(study.floor_table(cfg, ceilings), caption="FLOPs and floor of one steady forward, by part")

# %%
study.plot_overview(cfg, res)
plt.show()

# %% [markdown]
# ## Profiled run: top-level stages and their shares
# What to look for: the stage that holds most of the labelled time; notebook 02 breaks it down by operator and
# label. While the profiled run goes, the GPU/CPU monitor is shown live (a snapshot in the HTML report).

# %%
stages = None
if cfg.options.profile:
    from wmbook.profiling.monitor import ResourceMonitor

    with ResourceMonitor(cfg.device, name="profiled run") as monitor, wd.monitor_view(monitor):
        stages, trace_path, labels = study.profile_stages(pipe, inputs, cfg)
    display(wd.link(trace_path, note="(Chrome trace: open it in https://ui.perfetto.dev or chrome://tracing)"))
    display(wd.table(stages, caption="Top-level stages (profiled run)"))
    study.plot_stage_shares(stages)
    plt.show()
else:
    print("profile=False: no profiled run")

# %%
if cfg.options.profile:
    sort_col = "cpu_total_ms" if "cpu_total_ms" in labels.columns else "total_ms"
    display(wd.table(labels.sort_values(sort_col, ascending=False).head(15), caption="The 15 labels with the most time"))
    wd.appendix(labels, "every label of the profiled run")

# %%
gifs = sorted(cfg.output_dir.rglob("*.gif"))
if gifs:
    display(wd.show_video(gifs[0], caption=f"The generated video ({gifs[0].name}, random weights: noise-like frames)"))

# %% [markdown]
# ## Results rows
# Each summary metric becomes one row of the results table, with its spread and the environment that measured it.

# %%
rows = study.result_rows(cfg, res, stages)
path = results.append(rows, cfg.results_path)
print(f"appended {len(rows)} rows to {path}")
wd.rows(cfg.results_path, rows[0]["run_id"])

# %% [markdown]
# ## Interpretation

# %%
Markdown(study.interpret(cfg, res, stages))

# %% [markdown]
# **Next:** [02 · bottleneck breakdown](02_bottleneck_breakdown.ipynb) splits this time by operator category, by
# label and inside one forward, and names the notebook that addresses each finding.
#
# ## Appendix: raw tables

# %%
wd.show_appendix()
