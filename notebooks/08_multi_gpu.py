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
# # 08 · Beyond one GPU: the stream over several processes
#
# **Question.** On one GPU the streaming loop of notebook 06's best stack is the sum of its stages: every DiT forward
# of a block, then its decode. How much faster does it run when the stages run on different GPUs at once, and how
# does the throughput of independent interaction loops scale with GPUs and with the episodes per forward?
#
# **How.** `wmbook.distributed` starts one process per GPU with `torchrun` (NCCL between GPUs, gloo between CPU
# ranks; NVLink multicast off in every rank) and every rank builds the same pipeline with the same stack: the
# single-GPU stack, which each rank also runs whole on its own GPU first, so the comparison is measured in the same
# job. Layouts:
# - `stage-split` (streaming workloads): rank 0 runs every DiT forward of block k (its denoising steps and the cache
#   refresh) and sends block k's clean latents to rank 1 (`isend`: NCCL moves them on its own stream), which decodes
#   them while rank 0 denoises block k+1: the next block needs block k's refreshed KV caches, not its pixels. The
#   steady block period becomes the slower stage, not the sum.
# - `dit-pipeline` (streaming workloads, `-p layout dit-pipeline`): the DiT's transformer blocks split into contiguous
#   ranges over ranks, chosen from per-layer times measured on rank 0; a forward's hidden state goes from stage to stage,
#   each step's next input from the last stage back to the first, and each stage's forward is captured on its own.
#   From 3 ranks on the last rank decodes; with 2 the second stage also decodes.
# - `decoder-split` (streaming workloads, `-p layout decoder-split`, 3 ranks or more): rank 0 denoises as in the stage
#   split and sends each block's latents to every other rank; those decode horizontal strips of the frame, each
#   sending its edge rows to the strips above and below before every spatial convolution (the causal caches' rows
#   included) and gathering the whole frame for the middle block's attention. The first frame waits for one strip's
#   decode instead of the whole frame's.
# - `pipeline-split` (streaming workloads, `-p layout pipeline-split`, 4 ranks or more): the DiT pipeline over all
#   ranks but the last two, which decode the frame's top and bottom halves as the decoder split does.
# - `data-parallel` (interaction loops): one independent loop per rank, its own episodes, nothing exchanged; each rank
#   sweeps the episodes per forward (batch), with its own CUDA graphs per batch.
#
# A rank that raises, dies or hangs ends the job in bounded time with that rank named; a failed job's rows are stored
# as a cut run. Timing: warm-up excluded, device events, medians with p20-p80, from a common start (a barrier).
#
# **Target** (mg2 at the real shape on two H200s, full Wan decoder): at least 120 FPS end to end, the first frame no
# worse than 1.15x the single-GPU first frame of the same job. Start from
# [06 · CUDA graphs](06_cuda_graphs.ipynb) (the single-GPU stack every rank runs).

# %% tags=["parameters"]
workload = "mg2"      # mg2 (streaming: stage-split) | wma (interaction loops: data-parallel)
preset = "auto"       # auto: tiny/tiny-wma on CPU, mg2-universal/wma on GPU
device = "auto"       # auto | cpu (gloo ranks) | cuda (one GPU per rank, NCCL)
layout = "auto"       # auto: stage-split for mg2, data-parallel for wma | dit-pipeline | decoder-split | pipeline-split (mg2)
nproc = 0             # ranks; 0: 2 for stage-split, every GPU otherwise (on a CPU the layout's fewest: 2, 3 or 4)
base = "auto"         # the single-GPU stack on every rank; auto: notebook 06's best
blocks = 0            # blocks per streaming run; 0: 8 on a GPU, 3 on a CPU
ddim_steps = 2        # DDIM steps per pass of an interaction loop (notebook 03's knee at wma)
batches = "auto"      # episodes per forward (data-parallel); auto: 1, 2, 4, 8 on a GPU, 1, 2 on a CPU
timeout_s = 900       # a rank waiting longer than this on another ends the job
warmup = 1            # untimed runs before timing
repeats = 3           # timed runs
output_dir = "auto"
results_path = "auto"  # auto: data/results/results.csv for real presets, reports/results/results-tiny.csv for tiny ones
seed = 0

# %%
import matplotlib.pyplot as plt
from IPython.display import Markdown, display

from wmbook import display as wd
from wmbook import results
from wmbook.studies import multi_gpu as study

wd.setup()
cfg = study.validate(workload=workload, preset=preset, device=device, layout=layout, nproc=nproc, base=base,
                     blocks=blocks, ddim_steps=ddim_steps, batches=batches, timeout_s=timeout_s, warmup=warmup,
                     repeats=repeats, output_dir=output_dir, results_path=results_path, seed=seed)
spec = study.job(cfg)
print(f"{spec.layout} over {spec.nproc} ranks ({spec.device}); every rank's stack:", " -> ".join(spec.stack))
wd.table(cfg.table(), caption="Parameters of this run (validated)")

# %% [markdown]
# ## The job
# One process per rank; the bar shows each rank's stage. Each rank's log, result and session report are in the job's
# folder under `output_dir/jobs/`.

# %%
res = study.run(cfg)
print(f"job {res.job_dir.name}: {res.wall_s:.0f} s")

# %% [markdown]
# ## Against one GPU
# What to look for: the split's FPS against the single-GPU run of the same job and against the bound its slower stage
# sets; the first frame, which still waits for both stages; the gate (the split changes no arithmetic). Then what
# more GPUs could give at best: the DiT's layers split over several ranks as a pipeline, the decoder over several
# spatial parts, bounded from the same stage times (`study.layout_bounds` says why a layer pipeline gains little here).

# %%
if spec.layout in study.STREAM_LAYOUTS:
    t = study.stream_table(res)
    display(wd.table(t, caption=f"{spec.layout} against one GPU (bound from the single-GPU stage times: "
                                f"{t.attrs['bound_fps']:.0f} FPS)"))
    if spec.layout in study.PIPELINE_LAYOUTS:
        display(wd.table(study.layer_table(res), caption="The DiT's layers per rank (chosen from measured layer times)"))
    display(wd.table(study.gate_table(res), caption="Gate: the layout's output against the single-GPU run's"))
    display(wd.table(study.stage_bounds(res), caption="Upper bounds of other layouts from the same single-GPU stage "
                                                       "times (ideal parts, communication free)"))
else:
    t = study.rollout_table(res)
    display(wd.table(t, caption="Episodes per second: one GPU alone and every rank at once, by batch"))
    study.plot_batches(t)
    plt.show()

# %% [markdown]
# ## Where each rank's time goes
# Busy is the rank's own work in one run (denoising, decoding or its loop); idle is waiting for another rank. The wire:
# one block's latents from rank 0 to rank 1 (half the round trip).

# %%
display(wd.table(study.rank_table(res), caption="Per rank: busy and idle time of one run, the wire"))
if spec.layout in study.STREAM_LAYOUTS:
    study.plot_timeline(res)
    plt.show()

# %% [markdown]
# ## The ranks' session reports, merged
# What `wmbook aggregate` prints for the job's `sessions/` folder: each rank's stages (the decoder's wait for latents
# is its communication time) and the slowest rank.

# %%
agg = study.sessions(res)
per_rank = sorted(c for c in agg.stages.columns if c.startswith("rank_"))
display(wd.table(agg.stages.set_index("path")[per_rank].head(8), caption="Stage device ms per rank"))
print("slowest rank:", agg.slowest)

# %% [markdown]
# ## Results rows

# %%
stored = results.read(cfg.results_path, run_id=results.RUN_ID)
print(f"{len(stored)} rows of this run in {cfg.results_path}")
if len(stored):
    wd.rows(cfg.results_path, results.RUN_ID)

# %% [markdown]
# ## Interpretation

# %%
Markdown("\n\n".join(study.interpretation(cfg, res)))

# %% [markdown]
# **Next:** fewer denoising steps shorten both stages alike: [03 · step reduction](03_step_reduction.ipynb) on the same
# stack; the stages themselves get faster in [05 · Triton kernels](05_triton_kernels.ipynb) and
# [06 · CUDA graphs](06_cuda_graphs.ipynb).

# %% [markdown]
# ## Appendix: raw tables

# %%
wd.show_appendix()
