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
#
# Start from [01 · baseline profiling](01_baseline_profiling.ipynb), which measures how fast the eager reference is;
# this notebook explains where that time goes.

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
from IPython.display import Markdown, display

from wmbook import device as wdev
from wmbook import display as wd
from wmbook import results
from wmbook.studies import breakdown as study

wd.setup()
cfg = study.validate(workload=workload, preset=preset, device=device, dtype=dtype, vae_dtype=vae_dtype,
                     num_blocks=num_blocks, ddim_steps=ddim_steps, guidance_scale=guidance_scale, warmup=warmup,
                     trace=trace, region=region, detail=detail, profiling_config=profiling_config,
                     measure_overhead=measure_overhead, overhead_pairs=overhead_pairs, output_dir=output_dir,
                     results_path=results_path, seed=seed)
wd.table(cfg.table(), caption="Parameters of this run (validated)")

# %% [markdown]
# ## Device ceilings (measured here, cached per device): GEMM, copy bandwidth, SDPA
# What to look for: the roofline below places every category against these three numbers.

# %%
ceilings = wdev.measure_ceilings(cfg.device, quick=cfg.tiny, extended=True)
wd.series(ceilings, caption="Measured ceilings")

# %% [markdown]
# ## The trace
# What to look for: busy time against the region's span (the rest is GPU idle) and the kernels per forward.

# %%
pipe, inputs = cfg.workload.build(cfg)
if cfg.options.trace is None:
    trace_path = study.record_trace(cfg.workload.run_callable(pipe, inputs, cfg), cfg)
    display(wd.link(trace_path, note=f"({trace_path.stat().st_size / 2**20:.1f} MiB; open it in https://ui.perfetto.dev)"))
else:
    trace_path = cfg.options.trace
    print("analysing the given trace", trace_path)
bd = study.breakdown(trace_path, cfg, ceilings)
wd.series({k: v for k, v in bd.summary().items() if not isinstance(v, list)}, caption="Summary of the region")

# %% [markdown]
# ## GPU time by operator category
# Shares of the region's busy time, kernel counts and mean kernel time. Kernels whose names and aten ops
# match no category are listed below the table, never dropped. What to look for: the two or three categories that
# hold most of the time; many short kernels (a small mean) point at launch overhead rather than slow kernels.

# %%
display(wd.table(bd.categories, caption="GPU time by operator category"))
print("categories add up to", f"{bd.categories['ms'].sum():.3f} ms; busy time of the region",
      f"{bd.stats['busy_ms']:.3f} ms (union of kernel intervals {bd.stats['busy_union_ms']:.3f} ms)")
display(wd.table(bd.unclassified.head(20), caption="Unclassified kernels") if len(bd.unclassified)
        else Markdown("_Every kernel was classified._"))

# %% [markdown]
# ### The same categories split between the denoiser and the decoder
# The denoiser's forwards and the VAE decode are optimized by different variants (notebooks 04-06): each category's
# time by the part it was launched in (ms; the columns add up to the table above). What to look for: whether the
# decoder's share is large enough to be worth its own optimizations (notebook 06's decoder rows).

# %%
wd.table(bd.part_categories, caption="ms by category and part", units={c: "ms" for c in bd.part_categories.columns})

# %% [markdown]
# ## GPU time by label (self and total), following the label hierarchy
# What to look for: labels whose self time is large (time not explained by a child label).

# %%
tree = bd.label_tree
display(wd.table(tree[tree["depth"] <= 2].head(30), caption="Labels to depth 2 (the 30 with the most time)"))
wd.appendix(tree, "the whole label tree")
bd.plot_label_tree(max_depth=3)
plt.show()

# %% [markdown]
# ## Inside one forward: measured split by fine labels, and its categories
# What to look for: the fine label with the largest share; attention and FFN should dominate a healthy forward,
# norms, modulation and RoPE should not.

# %%
display(wd.table(bd.forward_split, caption="One forward by fine label"))
display(wd.table(bd.forward_categories, caption="One forward: ms by fine label and category",
                 units={c: "ms" for c in bd.forward_categories.columns if bd.forward_categories[c].dtype.kind == "f"}))

# %% [markdown]
# ## GPU idle time, kernel launches, host-device syncs, CPU-side hotspots
# What to look for: a large idle share with many short kernels means the host cannot launch fast enough (notebook
# 06, CUDA graphs); host syncs inside a forward stall the stream (notebook 04's hygiene variants).

# %%
display(wd.table(bd.launch_stats, caption="Launches and idle time"))
display(wd.table(bd.syncs, caption="Host-device synchronizations"))
display(wd.table(bd.casts, caption="Casts and copies"))
wd.table(bd.cpu_hotspots.head(15), caption="CPU hotspots (the 15 largest)")

# %% [markdown]
# ## Roofline: achieved throughput against the measured ceilings
# What to look for: GEMMs and attention close to the flat compute roof; categories far below the slanted memory
# roof are launch- or latency-bound rather than bandwidth-bound.

# %%
display(wd.table(bd.roofline, caption="Achieved throughput by category"))
if bd.roofline.attrs.get("note"):
    print(bd.roofline.attrs["note"])
study.plot_dashboard(bd)
plt.show()

# %% [markdown]
# ## Ranked suggestions (each names the notebook that addresses it)
# Notebooks: [04 · compile and precision](04_compile_autocast.ipynb), [05 · Triton kernels](05_triton_kernels.ipynb),
# [06 · CUDA graphs](06_cuda_graphs.ipynb), and [03 · step reduction](03_step_reduction.ipynb) for fewer denoising steps.

# %%
wd.table(bd.suggestions, caption="Suggestions, largest estimated saving first")

# %% [markdown]
# ## Session report: monitors, stage table, summary
# The pipeline runs once more inside a profiling session (tracing off): GPU/CPU monitors sample in the
# background (shown live below while it runs; a snapshot in the HTML report), every label is timed with device
# events, and the report (JSON + self-contained HTML) holds the summary, stage table, monitor timelines, this
# breakdown and its suggestions.
#
# The session's FPS uses notebook 01's definition and code (`stream_metrics`: steady blocks from the second on, every
# forward and the VAE decode counted) but comes from **one** generation, where notebook 01 reports the median of
# its timed runs. Run back to back on a quiet machine they agree; on a shared CPU two runs minutes apart can differ
# several-fold with the machine's load, so compare 01's spread before reading a difference into them.

# %%
session, report_paths, overhead = study.session_report(pipe, inputs, cfg, bd, ceilings, show_monitor=True)
display(wd.table(session.stages().head(25), caption="Session stages (the first 25)"))
for kind, path in report_paths.items():
    display(wd.link(path, text=f"session report ({kind})"))
ssum = session.summary()
wd.series({"session FPS (one generation)": ssum.get("fps"), "session first frame (ms)": ssum.get("first_frame_ms"),
           "pipeline's own FPS, same generation": session.metrics.get("pipeline_fps")},
          caption="The session's stream metrics")

# %%
(wd.series(overhead, caption="Profiling overhead (monitors on, tracing off)") if overhead
 else Markdown("_overhead not measured_"))

# %% [markdown]
# ## Results rows

# %%
rows = study.result_rows(cfg, bd, overhead)
path = results.append(rows, cfg.results_path)
print(f"appended {len(rows)} rows to {path}")
wd.rows(cfg.results_path, rows[0]["run_id"], columns=("preset", "metric", "value", "unit"))

# %% [markdown]
# ## Interpretation

# %%
Markdown(study.interpret(cfg, bd, overhead))

# %% [markdown]
# **Next:** the suggestions above name the notebook for each finding: [04](04_compile_autocast.ipynb) for precision,
# dtype hygiene and `torch.compile`, [05](05_triton_kernels.ipynb) for fused Triton kernels,
# [06](06_cuda_graphs.ipynb) for launch overhead (CUDA graphs) and the decoder.
#
# ## Appendix: raw tables

# %%
wd.show_appendix()
