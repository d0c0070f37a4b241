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
# # 07 · Motion-data loading: the per-step reference-motion fetch of thousands of robots
#
# **Question.** A motion-tracking RL environment fetches, every step and for every one of its 4096 simulated robots
# (Unitree G1: 29 joints, 30 bodies), the state of the robot's reference clip at its current time. In the original
# project's task (a motion-tracking environment) that fetch showed up as a bottleneck. Where does its time go, how close can it get to the bytes it has to
# move, and how does its cost grow with more robots?
#
# **The workload** (`wmbook.motion`, workload `motion`). A procedural, deterministic motion library (clips of different
# lengths and frame rates: root position and rotation, joint positions and velocities, body positions and rotations;
# quaternions `(x, y, z, w)`, a quarter of them stored negated as captured data often has them). The eager reference
# follows the original code's structure: `AnimationTerm._fetch_motion_data` (prepare_query, get_motion_state_call,
# store_buffers) around `get_motion_state` (calc_frame_blend, indexing_data, interpolation, coordinate_transform), each
# stage labelled.
#
# **How.** The original project's profiler recipe first (a schedule with warm-up and active steps, the trace exported, the
# `key_averages` table sorted by device time), then the ladder: one named variant at a time, each gated against a
# float64 reference (relative L2 per field within the fp32 budget; quaternions compared up to sign), timed with CUDA
# events (median, p20-p80, warm-up excluded) and set against the bytes floor: the bytes a step must move at the copy
# bandwidth measured on this device. Each row is timed twice: one fetch at a time (`fetch`: the GPU waits for the
# host between calls, so a launch-bound fetch pays its host time and its GPU time one after the other), and issued
# back to back in rounds of 50 (`in a loop`: what a training loop that fetches once per step pays, the larger of the
# two). Then the rows that pass, at more robots.
#
# **Targets** (the workbook's own, at `g1-4096` on the reference device, an H200, `Workload.goals`): the fetch at
# least 10x faster than the eager reference, and within 2x of its bytes floor. This notebook stands alone (workload
# `motion`); its methods are those of [04](04_compile_autocast.ipynb) (compile), [05](05_triton_kernels.ipynb) (a
# Triton kernel) and [06](06_cuda_graphs.ipynb) (CUDA graphs).

# %% tags=["parameters"]
workload = "motion"     # motion (the only workload with this notebook)
preset = "auto"         # auto: tiny-motion on CPU, g1-4096 (4096 robots) on GPU
device = "auto"         # auto | cpu | cuda
num_envs = 0            # robots fetching each step; 0: the preset's
frames_per_env = 0      # states fetched per robot per step (now, then future steps); 0: the preset's
steps = "auto"          # ladder after the eager reference; auto: every motion variant that runs here
scaling_envs = "auto"   # robot counts of the scaling figure; auto: the preset's (4096,16384,65536 on GPU)
compile_backend = "auto"  # auto: inductor on GPU, aot_eager on CPU | inductor | aot_eager | eager
profile_warmup = 5      # profiler schedule: untraced warm-up steps (the seed's --warmup)
profile_active = 10     # profiler schedule: traced steps (the seed's --active)
warmup = 5              # untimed steps before timing each row
repeats = 50            # timed steps per row
output_dir = "auto"
results_path = "auto"   # auto: data/results/results.csv (real presets), reports/results/results-tiny.csv (tiny ones)
seed = 0

# %%
import os

import torch

if not torch.cuda.is_available():  # the Triton row then runs in Triton's CPU interpreter: set before triton is used
    os.environ.setdefault("TRITON_INTERPRET", "1")

import matplotlib.pyplot as plt
from IPython.display import Markdown, display

from wmbook import device as wdev
from wmbook import display as wd
from wmbook import results
from wmbook.studies import motion as study
from wmbook.studies import motion_report as report

wd.setup()
cfg = study.validate(workload=workload, preset=preset, device=device, num_envs=num_envs, frames_per_env=frames_per_env,
                     steps=steps, scaling_envs=scaling_envs, compile_backend=compile_backend,
                     profile_warmup=profile_warmup, profile_active=profile_active, warmup=warmup, repeats=repeats,
                     output_dir=output_dir, results_path=results_path, seed=seed)
print("ladder:", " -> ".join(["eager", *map(str, study.ladder_steps(cfg))]), "| scaling:", list(cfg.options.scaling_envs))
wd.table(cfg.table(), caption="Parameters of this run (validated)")

# %% [markdown]
# ## The library and one step's work
# The library is generated from the seed (the same on every machine). A step reads, per query, the two frames around its
# time and writes one state: that is the least a fetch can move.

# %%
ceilings = wdev.measure_ceilings(cfg.device, quick=cfg.tiny)
setup = study.setup(cfg, ceilings)
wd.table(study.library_table(setup), caption="The motion library and one step's work")

# %% [markdown]
# ## The original project's profiler recipe
# `torch.profiler` with `schedule(wait=0, warmup=profile_warmup, active=profile_active)` over the eager fetch, shapes
# recorded; the trace goes to `output_dir` (gzip Chrome trace: Perfetto, or TensorBoard's profiler plugin). The table is
# the profiler's `key_averages`, sorted by device time as in the original recipe (by self CPU time on a CPU, which has
# no device time), per step. What to look for: which labelled stage and which operators hold the device time.

# %%
prof = study.profile_fetch(setup)
display(wd.link(prof.trace_path, note="(Chrome trace: Perfetto or TensorBoard's profiler plugin)"))
wd.table(study.top_operations(prof, cfg), caption="key_averages per step")

# %% [markdown]
# ### The stage breakdown
# Each labelled stage per step: host time, device time (README: a label's device time; none on a CPU) and its share of
# the whole fetch's host and device time. An eager fetch of small kernels is host-bound on a GPU: the host shares say
# where its wall time goes, the device shares where its kernels' time goes.

# %%
stages = study.stage_table(prof, cfg)
display(wd.table(stages, caption="The labelled stages, per step"))
study.plot_stages(stages)
plt.show()

# %% [markdown]
# ## The ladder
# Each row is the previous row plus one variant (`wmbook.motion.variants`): `packed-gather` (both frames of every query
# in one gather from a packed table), `contiguous-layout` (rows grouped by the math applied: one lerp, one slerp,
# results written in place), `fused-quat` (one rotation matrix per query for every vector, one quaternion product for every
# body), `compile` (torch.compile of the whole fetch), `triton` (the whole fetch as one kernel: it replaces the last two
# rows' math) and `cuda-graph` (the step's fetch captured and replayed). A row's time counts only when every field
# passes the gate.

# %%
lad = study.run_ladder(setup)
lt = study.ladder_table(lad)
display(wd.table(lt, caption="The ladder (each row adds one variant)"))
wd.appendix(lt, "the ladder, every column")
sk = study.skipped(cfg)
if len(sk):
    display(wd.table(sk, caption="Rows left out here"))
cap = study.capture_table(lad)
display(wd.table(cap, caption="Captured graphs")) if len(cap) else print("no CUDA graphs captured here: capture needs a GPU")

# %% [markdown]
# ### The gate, field by field
# Relative L2 error of every output field against the float64 reference (the eager reference's math in float64 at the
# same query times); allowed: 1e-5 (the fp32 budget), and no worse than 1.1x the eager fp32 reference's own error.

# %%
wd.table(study.gate_table(lad), caption="Relative L2 per field against float64")

# %% [markdown]
# ### Against the bytes floor
# The bytes floor is what one step must move at the measured copy bandwidth. On a GPU the table adds a second floor:
# what replaying a CUDA graph that holds a single one-element kernel costs on this machine, back to back and in host
# time. A fetch captured as one graph a step cannot cost less in a loop, so the best row is also set against the
# larger of the two. It also captures 16 of the best row's fetches in one graph: what a fetch costs when one graph
# launch serves a whole captured program (an environment step captured whole), so the loop's time splits into the
# fetch and the launch. What to look for: the best row's loop near the larger floor (nothing left to take out of the
# fetch itself) or well above it (the kernel or the replay path still has work in it).

# %%
display(wd.table(study.floor_table(setup, lad), caption="Each row against the bytes floor"))
study.plot_ladder(lad)
plt.show()

# %% [markdown]
# ## Scaling to more robots
# Every row whose time counts, at each robot count (gated again there). Where the time stays flat the fetch is
# launch-bound; where it grows like the bytes floor it is bandwidth-bound.

# %%
scaling = study.run_scaling(setup, lad)
display(wd.table(scaling, caption="Fetch time by number of robots"))
display(wd.table(study.scaling_slopes(scaling), caption="Cost per extra robot"))
study.plot_scaling(scaling)
plt.show()

# %% [markdown]
# ## Results rows

# %%
rows = report.result_rows(cfg, setup, lad, scaling, stages)
path = results.append(rows, cfg.results_path)
print(f"appended {len(rows)} rows to {path}")
wd.rows(cfg.results_path, rows[0]["run_id"])

# %% [markdown]
# ## Interpretation

# %%
Markdown(report.interpret(cfg, setup, lad, scaling, stages))

# %% [markdown]
# **Next:** the world-model notebooks apply the same steps to a denoiser: [04 · compile and
# precision](04_compile_autocast.ipynb), [05 · Triton kernels](05_triton_kernels.ipynb) and [06 · CUDA
# graphs](06_cuda_graphs.ipynb); [01 · baseline profiling](01_baseline_profiling.ipynb) starts their path.
#
# ## Appendix: raw tables

# %%
wd.show_appendix()
