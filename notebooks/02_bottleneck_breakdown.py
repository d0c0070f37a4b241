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
# # 02 · Bottleneck breakdown: where the device time of one generation goes
#
# **Question.** Inside the labelled inference region, which operator categories take the GPU time, which
# labels (blocks, steps, forwards, cache refresh, VAE decode) hold it, how does one denoiser forward
# split (attention, RoPE, norms and modulation, FFN, KV-cache update, embeddings, ...), how long is the
# GPU idle, how many kernels does each forward launch, how close do GEMMs and attention come to the
# measured ceilings, and therefore which notebook should come next?
#
# Method: one warm, labelled `torch.profiler` trace (fine labels inside the forward on, input shapes
# recorded) is broken down by `wmbook.profiling.breakdown.analyze`. A kernel belongs to the label that was
# innermost on the host thread when it was launched, and to the category of the aten op that launched it
# (or of its kernel name); every kernel lands in exactly one category, so the categories add up to the
# GPU busy time of the region. Then the same pipeline runs once more inside a profiling session (GPU/CPU
# monitors on, tracing off) to produce the session report, and the overhead of that monitoring is measured.

# %% tags=["parameters"]
workload = "mg2"       # mg2 (causal DiT + KV cache) | wma (video UNet + DDIM)
preset = "auto"        # auto: tiny/tiny-wma on CPU, mg2-universal/wma on GPU | tiny | tiny-sf | mg2-universal | self-forcing | tiny-wma | wma
device = "auto"        # auto | cpu | cuda
dtype = "auto"         # auto: bf16 on GPU, fp32 on CPU | fp32 | bf16 | fp16
vae_dtype = "auto"     # auto: same as dtype | fp32 | bf16 | fp16
num_blocks = 0         # mg2 only: blocks to generate; 0 means the preset default
ddim_steps = 0         # wma only: DDIM steps per pass; 0 means the preset default (fewer keeps the trace small)
guidance_scale = 1.0   # wma only: classifier-free guidance scale; above 1 doubles the UNet forwards
warmup = 1             # untraced runs before the traced one
trace = ""             # empty: record a trace afresh; or the path of a .json/.json.gz trace to analyse
region = "auto"        # label whose device time is broken down; auto: the workload's inference region
detail = True          # fine labels inside the forward while tracing (attention, FFN, norms, ...)
profiling_config = "development"  # development | production | path to a YAML file (monitors, report format)
measure_overhead = True  # time the pipeline with and without the session's monitors
overhead_pairs = 8      # paired runs without / inside a session for the overhead (ABBA order)
output_dir = "auto"    # trace, session report; auto: reports/artifacts/02_bottleneck_breakdown/PRESET-DEVICE
results_path = "auto"  # auto: data/results/results.csv for real presets, reports/results/results-tiny.csv for tiny ones
seed = 0

# %%
import matplotlib.pyplot as plt
import pandas as pd
from IPython.display import Markdown, display

from wmbook import device as wdev
from wmbook import results
from wmbook.studies import breakdown as study

cfg = study.validate(workload=workload, preset=preset, device=device, dtype=dtype, vae_dtype=vae_dtype,
                     num_blocks=num_blocks, ddim_steps=ddim_steps, guidance_scale=guidance_scale, warmup=warmup,
                     trace=trace, region=region, detail=detail, profiling_config=profiling_config,
                     measure_overhead=measure_overhead, overhead_pairs=overhead_pairs, output_dir=output_dir,
                     results_path=results_path, seed=seed)
cfg.table()

# %% [markdown]
# ## Device ceilings (measured here, cached per device): GEMM, copy bandwidth, SDPA

# %%
ceilings = wdev.measure_ceilings(cfg.device, quick=cfg.tiny, extended=True)
pd.Series(ceilings, name="value").to_frame()

# %% [markdown]
# ## The trace

# %%
pipe, inputs = cfg.workload.build(cfg)
if cfg.options.trace is None:
    trace_path = study.record_trace(cfg.workload.run_callable(pipe, inputs, cfg), cfg)
    print("recorded", trace_path, f"({trace_path.stat().st_size / 2**20:.1f} MiB; open in https://ui.perfetto.dev)")
else:
    trace_path = cfg.options.trace
    print("analysing the given trace", trace_path)
bd = study.breakdown(trace_path, cfg, ceilings)
pd.DataFrame({"value": {k: v for k, v in bd.summary().items() if not isinstance(v, list)}})

# %% [markdown]
# ## GPU time by operator category
# Shares of the region's busy time, kernel counts and mean kernel time. Kernels whose names and aten ops
# match no category are listed below the table, never dropped.

# %%
display(bd.categories)
print("categories add up to", f"{bd.categories['ms'].sum():.3f} ms; busy time of the region",
      f"{bd.stats['busy_ms']:.3f} ms (union of kernel intervals {bd.stats['busy_union_ms']:.3f} ms)")
display(bd.unclassified.head(20) if len(bd.unclassified) else Markdown("_Every kernel was classified._"))

# %% [markdown]
# ### The same categories split between the denoiser and the decoder
# The denoiser's forwards and the VAE decode are optimized by different variants (notebooks 04-06): each category's
# time by the part it was launched in (ms; the columns add up to the table above).

# %%
display(bd.part_categories.round(3))

# %% [markdown]
# ## GPU time by label (self and total), following the label hierarchy

# %%
tree = bd.label_tree
display(tree[tree["depth"] <= 2].head(30))
bd.plot_label_tree(max_depth=3)
plt.show()

# %% [markdown]
# ## Inside one forward: measured split by fine labels, and its categories

# %%
display(bd.forward_split)
display(bd.forward_categories.round(3))

# %% [markdown]
# ## GPU idle time, kernel launches, host-device syncs, CPU-side hotspots

# %%
display(bd.launch_stats)
display(bd.syncs)
display(bd.casts)
bd.cpu_hotspots.head(15)

# %% [markdown]
# ## Roofline: achieved throughput against the measured ceilings

# %%
display(bd.roofline)
if bd.roofline.attrs.get("note"):
    print(bd.roofline.attrs["note"])
study.plot_dashboard(bd)
plt.show()

# %% [markdown]
# ## Ranked suggestions (each names the notebook that addresses it)

# %%
bd.suggestions

# %% [markdown]
# ## Session report: monitors, stage table, summary
# The pipeline runs once more inside a profiling session (tracing off): GPU/CPU monitors sample in the
# background, every label is timed with device events, and the report (JSON + self-contained HTML) holds
# the summary, stage table, monitor timelines, this breakdown and its suggestions.

# %%
session, report_paths, overhead = study.session_report(pipe, inputs, cfg, bd, ceilings)
display(session.stages().head(25))
for kind, path in report_paths.items():
    print(kind, path)
session.monitor.plot()
plt.show()
pd.DataFrame({"value": overhead}) if overhead else print("overhead not measured")

# %% [markdown]
# ## Results rows

# %%
rows = study.result_rows(cfg, bd, overhead)
path = results.append(rows, cfg.results_path)
print(f"appended {len(rows)} rows to {path}")
results.read(cfg.results_path, run_id=rows[0]["run_id"])[["preset", "metric", "value", "unit"]]

# %% [markdown]
# ## Interpretation

# %%
Markdown(study.interpret(cfg, bd, overhead))
