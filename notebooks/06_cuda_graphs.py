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
# # 06 · Static caches and CUDA graphs: make the streaming loop as fast as its kernels
#
# **Question.** Notebook 04's best stack keeps the GPU busy for only part of each forward: the host launches
# thousands of kernels one by one and the GPU waits for it (notebook 02: the GPU idles most of a block). How much of
# that wall time do static state and CUDA-graph capture remove, at what cost in memory and accuracy?
#
# **How.** A CUDA graph records a forward's kernels once and replays them with one launch. A replay runs the same
# kernels on the same addresses, so three things must hold (`wmbook.graphs`): tensor inputs are copied into static
# buffers before each replay; state the forward reads or writes (the KV caches, the cross-attention K/V) keeps its
# addresses, which is what the `static-caches` variant does (allocated once, reset and refilled in place); nothing
# inside synchronizes with the host (the hygiene variants of notebook 04 removed the `.item()` reads and the Python
# ints). Each signature (input shapes, cache write slots) runs eagerly twice (compile and Triton autotuning finish
# there), is captured on the third call and replayed from then on. A capture that fails runs eagerly and the table
# says which op synchronized. On a GPU the row after the decoder's, `graph-memset-kernels`, captures every graph
# again with its small memsets (the counters cuBLAS's and cuDNN's kernels zero before they run) as kernel nodes,
# around which the GPU waits less.
#
# **The rows** build on notebook 04's best stack (its ladder plus compile), with, on a GPU,
# [05 · Triton kernels](05_triton_kernels.ipynb)' fused kernels for the denoiser (`triton-fused`; mg2:
# `ffn-gelu-epilogue`, `action-norm-rope`; wma: `norm-conv-bias`, `head-conv-gemm`, `upsample-fold`) compiled into it, one variant at a time, each gated against the fp32
# reference (a graph replays the same kernels, so its error equals the base row's). Notebook 04's best stack alone is measured as a comparison row: the goal's
# baseline. torch.compile's own CUDA graphs (`mode="reduce-overhead"`) are measured as a comparison row where the
# workload compiles regionally (mg2; at wma the row is a cold compile of the whole UNet, minutes, for a forward that
# equalled the `cuda-graphs` row's on the H200, with a slower iteration: `-p reduce_overhead True` measures it), with its pitfall handled (each forward starts a new graph step and hands out copies of its outputs, which the next replay
# would overwrite). Timing: warm-up excluded, CUDA events, median with p20-p80. Once a forward replays at its GPU
# busy time, the GPU time the kernels save is wall time saved.
#
# **Target** (the workbook's own, for `mg2` at the real shape in bf16, full Wan decoder counted, on the reference
# device, an H200): 60 FPS, i.e. a steady block of 12 pixel frames in 200 ms; a replayed forward within 1.10x of its
# GPU busy time. Start from [04 · compile and precision](04_compile_autocast.ipynb) (the base stack) and
# [05 · Triton kernels](05_triton_kernels.ipynb) (fused kernels on top of it).

# %% tags=["parameters"]
workload = "mg2"       # mg2 (causal DiT + KV cache) | wma (video UNet + DDIM)
preset = "auto"        # auto: tiny/tiny-wma on CPU, mg2-universal/wma on GPU
device = "auto"        # auto | cpu | cuda
base = "auto"          # auto: notebook 04's best stack (+ notebook 05's denoiser kernels on a GPU); or variant names
                       # (on a GPU notebook 04's best stack alone is measured beside any base that differs from it)
steps = "auto"         # rows added to the base, in order; auto: caches, graphs, decoder rows, graph-memset-kernels (GPU),
                       # decode-first, stream-frames
reduce_overhead = "auto"  # also measure the base compiled with mode reduce-overhead (GPU only); auto: mg2 yes, wma no (a
                        # cold compile of the whole UNet for the row)
decoder_table = True   # the decoder rows: the same latents through each decoder stack
compile_backend = "auto"  # auto: inductor on GPU, aot_eager on CPU | inductor | aot_eager | eager
warmup = 3             # untimed calls before timing
repeats = 10           # timed forwards per row
e2e_blocks = 0         # mg2 blocks per end-to-end run; 0 means 4 on a GPU, 3 on a CPU
e2e_ddim_steps = 0     # wma DDIM steps per pass in the end-to-end run; 0: the preset's default (50 at real shape)
e2e_repeats = 0        # timed end-to-end runs per row (median, p20-p80); 0: 3 on a GPU, 2 on a CPU
compile_ahead = "auto"  # processes compiling the ladder's compiled stacks side by side first; auto: wma on a GPU; 0: none
output_dir = "auto"
results_path = "auto"  # auto: data/results/results.csv for real presets, reports/results/results-tiny.csv for tiny ones
seed = 0

# %%
import matplotlib.pyplot as plt
from IPython.display import Markdown, display

from wmbook import device as wdev
from wmbook import display as wd
from wmbook import results
from wmbook.studies import compile as study04
from wmbook.studies import graphs as study

wd.setup()
cfg = study.validate(workload=workload, preset=preset, device=device, base=base, steps=steps,
                     reduce_overhead=reduce_overhead, decoder_table=decoder_table, compile_backend=compile_backend, warmup=warmup, repeats=repeats, e2e_blocks=e2e_blocks,
                     e2e_ddim_steps=e2e_ddim_steps, e2e_repeats=e2e_repeats, compile_ahead=compile_ahead,
                     output_dir=output_dir, results_path=results_path, seed=seed)
print("base stack:", " -> ".join(map(str, study.base_stack(cfg))),
      "| graph rows:", " -> ".join(map(str, study.graph_steps(cfg))) or "-")
# the key columns, narrow enough for a 1400 px page (the full stacks and every other column: the appendix)
LADDER_KEY = ["variant", "gate", "rel_l2_vs_fp32", "forward_ms", "speedup", "x_floor", "gpu_busy_ms", "launches",
              "e2e_value", "e2e_first_frame_ms", "psnr_db", "peak_memory_gib"]
wd.table(cfg.table(), caption="Parameters of this run (validated)")

# %% [markdown]
# ## Static and ring caches equal fresh caches
# Two generations through one pipeline with static caches (allocated once, reset and refilled in place), ring KV caches
# (the window as a ring written through a device index: no eviction copy, one shape for every full block), or both,
# against fresh dynamic caches, over more blocks than the KV window holds (the reference evicts, the ring wraps). Static
# caches must give the same latents bit for bit and keep their addresses; a ring reads its keys in slot order rather
# than time order, so it may differ by fp32 rounding.

# %%
checks = study.static_cache_check(cfg)
(wd.table(checks, caption="Static and ring caches against fresh caches") if len(checks)
 else print("this workload carries no state across forwards: nothing to make static"))

# %% [markdown]
# ## The rows: base, static caches, CUDA graphs (and torch.compile's reduce-overhead)
# What to look for: launches per forward dropping to a handful with `cuda-graphs`, and the forward's wall time
# approaching its GPU busy time. With `compile_ahead` (wma on a GPU) the rows' compiled stacks are compiled side by
# side first, so a row's first call reads its compile from the cache (`compiled_ahead_s`: its cold first call there).

# %%
ceilings = wdev.measure_ceilings(cfg.device, quick=cfg.tiny)
ref = study04.reference(cfg)
lad = study.run_ladder(ref, cfg, ceilings)
if lad.compile_ahead is not None:  # the compiled rows' stacks, compiled side by side first
    print(lad.compile_ahead.summary())
t = lad.table()
display(wd.table(t, columns=LADDER_KEY, strict=False, caption="The rows (each adds one variant to the row above)",
                 rename={"e2e_value": f"end to end ({cfg.workload.metric.unit})"}))
wd.appendix(t, "the rows, every column")

# %% [markdown]
# ### Per forward: wall time against the GPU busy time of its kernels
# `wall / busy` near 1 means the GPU never waits for the host; the idle share is the rest of the forward.

# %%
wd.table(study.forward_table(lad), caption="Per forward: wall time vs GPU busy time")

# %% [markdown]
# ### Where the GPU time goes
# Kernel time per forward by operator category, from one profiled forward per row (on a GPU). Once a forward replays
# at its GPU busy time, these are what is left to shrink: notebook 05's kernels take from normalization and
# elementwise, low precision from GEMM and convolution.

# %%
wd.categories(lad)

# %% [markdown]
# ### End to end
# FPS counts every forward of a block and the VAE decode (README: definitions); for the UNet, `run s` is one
# interaction iteration (two DDIM passes and their decodes).

# %%
wd.table(study.e2e_table(lad), caption="End to end")

# %% [markdown]
# ### Frames: the reference against the optimized stack
# The fp32 reference's decoded frames next to the last judged row's, with their difference amplified and each frame's
# PSNR (a slider in JupyterLab, first, middle and last frame in a report).
# What to look for: a PSNR well above 40 dB on every frame; a drop on later frames is error that accumulates.

# %%
print(wd.ladder_frames(lad))

# %% [markdown]
# ### Whole generations before and after: GPU idle time and streams
# One warm end-to-end run of the first and last rows, profiled as the first is measured and once the rows are, before
# the comparison row (a profiler started after torch.compile's reduce-overhead graphs have run can take the kernel
# down): the GPU busy time (the union of every stream's kernels) against the run's span from first to last kernel.
# With the decode on a second stream, its kernels (second lane) run beside the DiT's. For a streaming workload the table also gives the idle share inside the steady blocks (the first
# block, with its other shapes, left out; each block's window runs from its first kernel to the next block's), which
# is what the goal of under 5% is about. A UNet workload's profiled run has at most 10 DDIM steps per pass
# (`study.TRACE_DDIM_STEPS`): every step repeats the same kernels, and a full 50-step trace is too large to keep.

# %%
if cfg.device.type == "cuda":
    gen = lad.generation_traces  # taken by run_ladder: the first row's as it was measured, the last one's after
    idle = study.generation_idle(gen, cfg.workload.labels)
    display(wd.table(idle, caption="GPU idle share of a whole generation, and inside its steady blocks"))
    study.plot_generation_timelines(gen)
    plt.show()
else:
    gen, idle = {}, None
    print("no device timeline on a CPU")

# %% [markdown]
# ### What was captured, and what the graphs cost in memory
# What to look for: one graph per signature and replays far outnumbering captures; a fallback names the op that
# synchronized with the host.

# %%
cap = study.capture_table(lad)
wd.table(cap, caption="Captured graphs") if len(cap) else print("no CUDA graphs on this device: capture needs a GPU")

# %% [markdown]
# ### One forward before and after, as a timeline
# Host launch calls (top lane) and GPU kernels (bottom lane) of one profiled forward per row, on one time axis.
# What to look for: the GPU lane filling up as the host lane empties.

# %%
if cfg.device.type == "cuda":
    study.plot_timelines(lad)
    plt.show()
else:
    print("no device timeline on a CPU")

# %% [markdown]
# ## The decoder: the other half of every block
# Decoder variants change nothing upstream of the decoder, so they are measured on the decoder alone: the reference's
# latents, decoded block by block by each decoder stack, the time per steady block (mg2: 12 pixel frames at the real
# shape; wma: one frame, since its SD VAE decodes frame by frame and keeps no state across frames)
# against the decoder's own FLOP floor (counted with `torch.utils.flop_counter` on meta tensors) and the PSNR of its
# frames against the fp32 decoder (gate: 40 dB); on a GPU also the share of the convolutions' own FLOP floor that
# its convolution kernels reach (one profiled block). The first pass includes compilation and capture. PyTorch keeps
# the cuDNN algorithm it first picked for a convolution shape for the rest of the process, so every reduced-precision
# row has cuDNN's algorithm search (`cudnn-benchmark`) on, as the ladder above turned it on before its bf16 decoder
# first ran; the rows here reuse the ladder's picks for the shapes it ran. On a GPU the
# `vae-window-kernels` row replaces the compiled step with kernels of our own on the same causal windows (each norm +
# SiLU written straight into the next convolution's window, the head's 3-channel convolution in Triton): compare its
# kernel categories with the compiled step's to see what inductor's fusions are worth. The tiny decoder (TAEHV) has
# random weights here: its speed is real, its frames cannot be judged.

# %%
from wmbook.studies import decoder as dstudy

dtab, drows = study.decoder_study(cfg, ref, ceilings)
if drows:  # stored now (the ladder rows were stored as each finished)
    results.append(dstudy.result_rows(cfg, drows), cfg.results_path)
if len(dtab):
    display(wd.table(dtab, columns=dstudy.DECODER_KEY, strict=False, caption="The decoder by stack"))
    wd.appendix(dtab, "the decoder table, every column")
    dstudy.plot_decoder(dtab)
    plt.show()
    display(Markdown(dstudy.interpret(dtab)))
    dcats = dstudy.categories(drows)  # one profiled steady block per row (a GPU run's)
    if len(dcats):
        display(wd.table(dcats, caption="The decoder's GPU kernel ms of one steady block by category",
                         units={c: "ms" for c in dcats.columns}))
        display(Markdown(dstudy.category_account(drows, dtab.attrs.get("conv_floor_ms", float("nan")))))
else:
    print("this workload has no decoder table (or decoder_table=False)")

# %% [markdown]
# ## Results rows

# %%
# stored as they were measured: each ladder row as soon as it finished, the decoder rows after the decoder table
stored = results.read(cfg.results_path, run_id=results.RUN_ID)
print(f"{len(stored)} rows of this run in {cfg.results_path}")
if len(stored):
    wd.rows(cfg.results_path, results.RUN_ID)

# %% [markdown]
# ## Interpretation

# %%
Markdown(study.interpret(cfg, lad, checks, idle, ceilings))

# %% [markdown]
# **Next:** [03 · step reduction](03_step_reduction.ipynb) takes fewer denoiser forwards on top of this stack (`base=`
# this notebook's best rows); [07 · motion-data loading](07_motion_data_loading.ipynb) applies the same recipe
# (fused kernel, CUDA graph) to a robot fleet's per-step data fetch.
#
# ## Appendix: raw tables

# %%
wd.show_appendix()
