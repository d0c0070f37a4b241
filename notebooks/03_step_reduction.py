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
# # 03 · Step-count reduction: fewer denoiser forwards, at what quality?
#
# **Question.** Every denoising step is one denoiser forward (two with classifier-free guidance), so the step count is
# the largest single speed lever: the UNet world model runs 100 UNet forwards per interaction iteration at 50 DDIM steps
# per pass, the causal DiT 4 forwards per block (3 steps and the cache refresh). How few steps, and which solver, keep
# the output within a stated quality budget, and how much faster is that?
#
# **How.** One pipeline, one set of seeded inputs, a sweep over the sampler (`wmbook.pipelines.solvers`):
# - `wma`: the reference DDIM (v-prediction, zero-terminal-SNR betas, trailing timesteps, eta 1, DynamiCrafter's
#   dynamic rescale) at 50/30/20/16/10/5 steps per pass (and a trained preset's shipped count, its `sample_steps`),
#   against diffusers' DPM-Solver++ (2M) and UniPC configured like
#   it (same betas, prediction type, trailing timesteps; they are ODE solvers: no eta, no dynamic rescale), and each
#   pass alone (the decision pass at fewer steps with the world-model pass at full steps, and the other way round).
# - `mg2`: the nominal step lists of a block (8 evenly spaced steps, [1000,750,500,250] (Self-Forcing's),
#   [1000,666,333] (Matrix-Game-2's), [1000,500], [1000]; the full-step run is the preset's own list) under the
#   reference re-noising sampler (Self-Forcing), the deterministic flow-matching Euler ODE and UniPC's flow variant
#   (diffusers), and other warps of the schedule (shift).
#
# Per point: the time (s per interaction iteration, or FPS; device events, warm-up excluded, median with p20-p80 over
# round-robin repeats), how far its decoded frames (and the decision pass's actions) move from the model's own
# full-step output (PSNR, rel-L2; `wmbook.check.compare`), and, for a trained world preset, its quality against ground
# truth on held-out episodes (`wmbook.world.eval`: PSNR, SSIM, the agent's position error). The **knee** of a curve is
# its point with the fewest forwards within the budget: a PSNR loss against the truth of at most `quality_budget_db`
# and an agent-position error at most `agent_budget_px` above the full-step run's (fewer steps blur the small agent
# away while PSNR rises) with ground truth; without it (random weights), frames at least `deviation_budget_db` PSNR from the full-step run's.
# With random weights, the deviation is **solver error, not image quality**. The trained world presets (`world-mg2`,
# `world-wma`: small models of the same code trained on `wmbook.world`, README) predict x0 directly (`world-wma`: x0
# minus the last observed frame, the change the actions cause), and `world-wma` samples without the dynamic rescale (it would cost even a perfect model 6-11 dB at 10-5 steps, which this notebook
# would then blame on the step count). They run on their shipped weights; `weights` points a run at another weights
# file of the preset (a model just trained, before it ships), and the results rows record that file and its SHA-256.

# %% tags=["parameters"]
workload = "mg2"       # mg2 (causal DiT + KV cache) | wma (video UNet + DDIM)
preset = "auto"        # auto: tiny/tiny-wma on CPU, mg2-universal/wma on GPU; a trained world preset adds ground truth
weights = "auto"       # trained world presets: auto (the shipped weights) | the path of another weights .pt of it
device = "auto"        # auto | cpu | cuda
dtype = "auto"         # auto: bf16 on GPU, fp32 on CPU (base none; a base stack sets its own)
vae_dtype = "auto"     # auto: the workload's rule
solvers = "auto"       # auto: every solver (wma: ddim,dpmsolver++,unipc; mg2: renoise,euler,unipc) | a subset
sampling_steps = "auto"  # wma: counts per pass "50,30,20"; mg2: step lists "1000,500;1000"; auto: the workload's grid
shifts = "auto"        # mg2: extra shifts for the reference solver (auto: 3,8 | none | "2,4"); wma: auto
split_passes = True    # wma: also each pass alone (DDIM, the other pass at full steps)
eta = "auto"           # wma: DDIM eta of the DDIM points (auto: the preset's, 1); mg2: auto
blocks = 0             # mg2 blocks per generation; 0: the preset's default
quality_budget_db = 0.2    # knee with ground truth: PSNR loss against the full-step run allowed
agent_budget_px = 2.0  # knee with ground truth: also agent error at most this many px above the full-step run (0: off)
deviation_budget_db = 30.0  # knee without ground truth: PSNR of frames vs the full-step run's frames, at least
quality_cases = 2      # held-out episodes per point (trained world presets)
base = "none"          # none: the eager pipeline at dtype; or a variant stack, e.g. notebook 06's best
compile_backend = "auto"  # for a base stack with compile: auto (inductor on GPU, aot_eager on CPU) | inductor | ...
warmup = 1             # untimed runs of the full-step reference before the sweep (then, with CUDA graphs, of the
                       # shortest point until the graphs an iteration calls once are captured)
repeats = 3            # timed rounds over all points
output_dir = "auto"
results_path = "auto"  # auto: data/results/results.csv for real presets, reports/results/results-tiny.csv for tiny ones
seed = 0

# %%
import matplotlib.pyplot as plt
from IPython.display import Markdown, display

from wmbook import display as wd
from wmbook import results
from wmbook.studies import steps as study

wd.setup()

cfg = study.validate(workload=workload, preset=preset, weights=weights, device=device, dtype=dtype, vae_dtype=vae_dtype,
                     solvers=solvers, sampling_steps=sampling_steps, shifts=shifts, split_passes=split_passes,
                     eta=eta, blocks=blocks, quality_budget_db=quality_budget_db, agent_budget_px=agent_budget_px,
                     deviation_budget_db=deviation_budget_db, quality_cases=quality_cases, base=base,
                     compile_backend=compile_backend, warmup=warmup, repeats=repeats, output_dir=output_dir,
                     results_path=results_path, seed=seed)
wd.table(cfg.table(), caption="Parameters of this run (validated)")

# %% [markdown]
# ## The points
# The full-step run first (the reference sampler at the preset's settings); `sampling kwargs` are exactly what the
# pipeline call takes for that point (`run_iteration` / `generate`), and what a later notebook passes to stack on it.
# What to look for: the forwards column, since time scales with it.

# %%
wd.table(study.points_table(cfg), caption="The points of the sweep")

# %% [markdown]
# ## The sweep: time and deviation from the full-step run
# `speedup` is the full-step run's time over the point's (FPS: the point's over the full-step run's). `psnr vs full`
# compares decoded frames with the full-step run's (inf: identical); `psnr vs curve's finest` with the same curve's
# point of most forwards (for a deterministic solver: its own convergence). On a trained world preset, `PSNR change vs
# full steps` is positive where a point is closer to the truth than the full-step run.
# What to look for: points whose speedup is well above 1 while their frames stay close; with random weights the
# deviation is solver error (and the stochastic samplers draw new noise at each step count), not image quality.

# %%
pipe, inputs = study.build(cfg)
sweep = study.run_sweep(cfg, pipe, inputs)
print(study.quality(cfg, pipe, sweep))
tab = study.table(sweep)
wd.appendix(tab, "the sweep, every column")
wd.table(tab, caption="Time and deviation from the full-step run, per point")

# %% [markdown]
# ## The knee of each curve
# What to look for: the knee's speedup and its quality next to the full-step run's; a knee at the full-step run means
# no fewer steps met the budget.

# %%
wd.table(study.knee_table(sweep), caption="The knee of each curve: fewest forwards within the budget")

# %% [markdown]
# ## The speed-quality frontier
# What to look for: the curve that reaches the highest speed before its quality drops; crossing curves mean one solver
# wins at few steps and another at many.

# %%
study.plot_frontier(sweep)
plt.show()

# %% [markdown]
# ## Frames: the truth, full steps and the chosen point
# On a trained world preset: one held-out episode's true frames, the full-step run's and the knee's, each frame's PSNR
# against the truth under it, then a slider over every frame (in JupyterLab; a static figure in a report).
# What to look for: whether the magenta agent stays where the truth has it; PSNR alone rewards a blur.

# %%
from wmbook.studies import step_frames

print(step_frames.show_frames(cfg, pipe, sweep))

# %% [markdown]
# ## Results rows
# One set per point (the time with its spread, speedup, forwards, deviation, quality) and one per knee (`knee:<curve>`);
# each row's `params` hold the point's `sampling` keyword arguments and the `base` stack it ran on. To stack on a knee
# elsewhere: `study.stored_knee(workload, preset)["sampling"]` is what `run_iteration` / `generate` take.

# %%
rows = study.result_rows(sweep)
path = results.append(rows, cfg.results_path)
print(f"appended {len(rows)} rows to {path}")
wd.rows(cfg.results_path, rows[0]["run_id"])

# %% [markdown]
# ## Interpretation

# %%
display(Markdown(study.interpret(sweep)))

# %% [markdown]
# **Next:** [04 · compile and precision](04_compile_autocast.ipynb) makes each forward faster; this notebook's knee
# stacks on the fastest pipeline with `base=` (notebook 06's best stack).
#
# ## Appendix: raw tables

# %%
wd.show_appendix()
