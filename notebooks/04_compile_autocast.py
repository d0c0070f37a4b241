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
# # 04 · Compile and precision: dtype hygiene, autocast/bf16, TF32, attention backends, torch.compile
#
# **Question.** How much of the distance to the FLOP floor do precision, dtype hygiene, the attention backend,
# memory layout and `torch.compile` close, for each workload, and what does each step cost in accuracy?
#
# Every optimization is a named variant from `wmbook.variants`, applied to a fresh copy of the fp32 eager
# reference. **The gate:** a row's forward output is compared with the fp32 reference on the same seeded
# inputs. It must be within the relative-L2 budget of the loosest precision in effect (tf32 5e-3, fp16 1e-2,
# bf16 3e-2), and a row that does not change precision must be no less accurate than the eager model at that
# precision (at most 1.1x its error against fp32). The original project's criterion against the eager output at the
# same precision (bf16: max < 1e-2, mean < 1e-3 relative to the largest magnitude) is shown beside it: at 30 bf16
# layers two roundings of one computation already differ by about that much (see `wmbook.check.GateResult`).
# A row that fails shows its numbers but its time does not count. **The ladder** is cumulative: each row is the
# previous row plus one variant. Timing: warm-up excluded, CUDA events, median with p20-p80.
#
# **Targets** (the workbook's own, per workload in `Workload.goals`, checked in the interpretation): `mg2`: a DiT
# forward within 1.5x its FLOP floor after compile, the regional compile under 60 s cold and no recompiles across a
# steady run; `wma`: at least 2x per DDIM step over fp32 eager. [02 · bottleneck breakdown](02_bottleneck_breakdown.ipynb)
# explains which of these variants matter for each workload.

# %% tags=["parameters"]
workload = "mg2"       # mg2 (causal DiT + KV cache) | wma (video UNet + DDIM)
preset = "auto"        # auto: tiny/tiny-wma on CPU, mg2-universal/wma on GPU
device = "auto"        # auto | cpu | cuda
ladder = "auto"        # auto: the workload's default ladder; or comma-separated variant names
sections = "all"       # all, or a comma-separated subset of precision, vae, hygiene, attention, ladder, compile
compile_modes = "default"  # modes in the ladder and the compile table: default, max-autotune-no-cudagraphs (benchmarks every GEMM/conv: many minutes at real shapes), or both comma-separated
compile_backend = "auto"  # auto: inductor on GPU, aot_eager on CPU (inductor's CPU codegen takes minutes) | inductor | aot_eager | eager
compile_table = "auto"  # auto: the workload's (mg2: all; wma: hygiene, whole), no dynamic on a CPU; all; or a subset of reference, hygiene, dynamic, whole, max-autotune
warmup = 3             # untimed calls before timing
repeats = 10           # timed forwards per row
e2e_blocks = 0         # mg2 blocks per end-to-end ladder run (FPS, PSNR); 0 means 4 on a GPU, 3 on a CPU
recompile_blocks = 10  # mg2 blocks of the warm run whose recompiles the compile table counts
e2e_ddim_steps = 5     # wma DDIM steps per pass in the end-to-end run
e2e_repeats = 2        # timed end-to-end runs per row
output_dir = "auto"
results_path = "auto"  # auto: data/results/results.csv for real presets, reports/results/results-tiny.csv for tiny ones
seed = 0

# %%
import matplotlib.pyplot as plt
from IPython.display import Markdown, display

from wmbook import device as wdev
from wmbook import display as wd
from wmbook import results
from wmbook.studies import compile as study
from wmbook.studies.compile import StackTrial

wd.setup()
cfg = study.validate(workload=workload, preset=preset, device=device, ladder=ladder, sections=sections,
                     compile_modes=compile_modes, compile_backend=compile_backend, compile_table=compile_table,
                     warmup=warmup, repeats=repeats, e2e_blocks=e2e_blocks, recompile_blocks=recompile_blocks,
                     e2e_ddim_steps=e2e_ddim_steps, e2e_repeats=e2e_repeats, output_dir=output_dir,
                     results_path=results_path, seed=seed)
wd.table(cfg.table(), caption="Parameters of this run (validated)")
# the key columns of the wide tables (every column: the appendix at the end)
LADDER_KEY = ["variant", "gate", "rel_l2_vs_fp32", "allowed_rel_l2", "forward_ms", "speedup", "x_floor", "gpu_busy_ms",
              "launches", "e2e_value", "e2e_speedup", "psnr_db", "peak_memory_gib", "recompiles", "graph_breaks"]
ATTN_KEY = ["shape_id", "site", "backend", "status", "ms_median", "within_tol", "auto_kernel_name", "flop_share"]
COMPILE_KEY = ["config", "cold_s", "warm_s", "steady_forward_ms", "x_floor", "gpu_busy_ms", "busy_x_floor", "graphs",
               "graph_breaks", "warmup_run_recompiles", "steady_run_recompiles", "e2e_value"]

# %% [markdown]
# ## The variants this workload can use
# The group `hygiene` stands for the hygiene variants that apply to the workload (listed below the table); the
# ladder adds them one at a time, so each row shows what one change bought.

# %%
vt = study.variants_table(cfg)
display(wd.table(vt, caption="Variants"))
print("groups:", vt.attrs["groups"])

# %% [markdown]
# ## Device ceilings and the fp32 eager reference
# What to look for: the GEMM TFLOP/s at each precision; the FLOP floor below uses the bf16 one.

# %%
ceilings = wdev.measure_ceilings(cfg.device, quick=cfg.tiny, extended=True)
ref = study.reference(cfg)
wd.series({k: ceilings.get(k) for k in ("device_name", "gemm_tflops", "gemm_tflops_tf32", "gemm_tflops_fp32",
                                        "sdpa_tflops", "copy_gbps")}, caption="Measured ceilings")

# %% [markdown]
# ## Precision, one variant at a time (gated against fp32)
# What to look for: the speedup each precision gives alone, and its relative-L2 error against the allowed budget.

# %%
prec = study.precision_table(ref, cfg, ceilings) if "precision" in cfg.options.sections else None
if prec is not None:
    display(wd.table(prec, columns=LADDER_KEY, strict=False, caption="Each precision alone"))
    wd.appendix(prec, "precision table, every column")

# %% [markdown]
# ## The VAE decoder in fp32 / bf16 / fp16 (and channels-last on a GPU)
# The reference's latents decoded in each precision, PSNR against the fp32 decode: a bf16 VAE once cost a
# competition team 12 dB. What to look for: PSNR under about 40 dB is visible damage.

# %%
vae = study.vae_table(ref, cfg) if "vae" in cfg.options.sections else None
wd.table(vae, caption="The decoder by precision") if vae is not None else None

# %% [markdown]
# ## Dtype and host-sync hygiene: casts, copies and host reads per forward, one variant at a time
# Each row adds one hygiene variant to the bf16 eager model (cumulative), so the table shows what each removes.
# What to look for: host reads (`aten::_local_scalar_dense`) going to zero; each one stalls the GPU stream.

# %%
hyg = study.hygiene_table(ref, cfg) if "hygiene" in cfg.options.sections else None
wd.table(hyg, caption="Casts, copies and host reads per forward") if hyg is not None else None

# %% [markdown]
# ## Attention backends on the shapes one forward runs
# Each recorded call shape timed with each backend (error against the fp32 math reference), the kernel that
# PyTorch's own choice (`auto`) runs, and for the DiT the block-causal full-sequence attention with a dense
# mask versus FlexAttention's block mask. What to look for: whether `auto` already picks the fastest backend that is
# within tolerance at the shapes holding most of the FLOPs.

# %%
best = None
if "attention" in cfg.options.sections:
    shapes, attn_table, best, flex = study.attention_section(ref, cfg)
    display(wd.table(shapes, columns=["site", "mask_kind", "batch", "heads", "q_len", "kv_len", "head_dim", "calls",
                                      "calls_per_forward", "gflop_per_call", "flop_share"], strict=False,
                     caption="Attention call shapes of one forward"))
    display(wd.table(attn_table, columns=ATTN_KEY, strict=False, caption="Backends on those shapes"))
    wd.appendix(shapes, "attention call shapes, every column")
    wd.appendix(attn_table, "attention backends, every column")
    if flex is not None:
        display(wd.table(flex, columns=["method", "status", "ms_median", "dense_tflop_s", "useful_tflop_s",
                                        "mask_density", "block_density", "mask_build_ms", "kernel"], strict=False,
                         caption="Block-causal attention: dense mask vs FlexAttention"))
        wd.appendix(flex, "block-causal attention, every column")
    print("best backend (FLOP-share weighted, within tolerance):", best)

# %% [markdown]
# ## The ladder
# Each row adds one variant to the row above. For mg2 it includes `action-attn-fused`: the action modules' tiny
# attentions (3 query frames against at most 6 key frames, per spatial location and head) written as a
# multiply-reduce that `torch.compile` fuses. The SDPA kernel it replaces pads each of the 880 x 16 small
# problems to a full tile. It is written for the compiled row that follows it: eager, it materializes its products.
# What to look for: the speedup column next to the gate; a row whose gate says FAIL is shown but does not count.

# %%
lad = None
if "ladder" in cfg.options.sections:
    steps = cfg.options.ladder or study.default_ladder(cfg, best)
    print("ladder:", " -> ".join(["fp32 eager", *map(str, steps)]))
    lad = study.run_ladder(ref, cfg, steps, ceilings)
    t = lad.table()
    e2e_name = next((m for m in t["e2e_metric"] if isinstance(m, str) and m), "end to end")
    display(wd.table(t, columns=LADDER_KEY, strict=False, caption="The ladder (cumulative)",
                     rename={"e2e_value": f"{e2e_name} ({cfg.workload.metric.unit})"}))
    wd.appendix(t, "the ladder, every column")

# %%
if lad is not None:
    fig, axes = plt.subplots(1, 2, figsize=(15, 0.45 * len(lad.rows) + 1.5))
    lad.plot(ax=axes[0])
    study.plot_forward_vs_floor(lad, ax=axes[1])
    fig.tight_layout()
    plt.show()

# %% [markdown]
# ### Frames: the reference against the last row
# The fp32 reference's decoded frames next to those of the ladder's last judged row, their difference amplified, each
# frame's PSNR (a slider in JupyterLab; first, middle and last frame in a report).
# What to look for: every frame well above 40 dB PSNR (the decoder gate); a drop on later frames is error that
# accumulates block by block.

# %%
print(wd.ladder_frames(lad) if lad is not None else "no ladder in this run (sections)")

# %% [markdown]
# ### Where each row's GPU time goes
# Kernel time per forward by category, from one profiled forward per row (on a GPU). Against the FLOP floor it
# shows what is left to remove: the floor only counts GEMM and attention FLOPs at the measured GEMM ceiling.

# %%
wd.categories(lad)

# %% [markdown]
# ### Try a stack yourself
# Pick any variants (applied in the ladder's order), press the button (it stays disabled while the stack runs): the
# stack is applied to a copy of the reference, gated against fp32, its forward timed as the ladder times it (`warmup`
# calls, then `repeats`: median and p20-p80), and one end-to-end run decodes frames, shown next to the reference's with
# their difference and a frame slider. A trial: it adds no results rows. In a report (no frontend attached) it shows the
# stack of the ladder's last row that passed its gate: run as a trial on a CPU, on a GPU as the ladder's own row (not
# measured twice).

# %%
if lad is not None:
    t = lad.table()
    last_ok = int(t[t["gate"].isin(["pass", "reference"])].index.max())
    trial = StackTrial(ref, cfg, ceilings)
    names = [v.name for v in steps]  # the picker offers names; the trial resolves the picked ones
    wd.stack_picker(names, trial, default=names[:last_ok], static=None if cfg.tiny else (
        lambda: display(wd.table(t.loc[[last_ok]], columns=StackTrial.KEY, strict=False,
                                 caption="The ladder's row of that stack"))))

# %% [markdown]
# ## torch.compile: regional vs whole, dynamic, cold vs warm, recompiles
# Cold = empty on-disk cache; warm = the same compile again after `torch._dynamo.reset()` with the cache the
# cold run filled (inductor only: the CPU smoke run's aot_eager keeps no cache, so it measures cold alone). Recompiles are counted over a warm end-to-end run after a first one (which may compile
# each new shape once). The first row compiles the reference code, the others the code after the fix: the
# `hygiene` variants (the group of the table above). For the causal DiT they write the KV caches at the slots
# prepared once per forward before the compiled region (`kv-slot-write`), window the action inputs once per
# forward without a host read (`action-hoist`) and fill the cross-attention K/V before the first block
# (`cross-kv-prefill`): the blocks then get no Python ints, trace without graph breaks and do not recompile per
# block. What to look for: graph breaks and steady-run recompiles at zero after the fix, and the cold compile time.

# %%
comp = breaks = reasons = None
if "compile" in cfg.options.sections:
    comp, breaks, reasons = study.compile_section(ref, cfg, ceilings=ceilings)
    e2e_name = next((m for m in comp.get("e2e_metric", []) if isinstance(m, str) and m), "end to end")
    display(wd.table(comp, columns=COMPILE_KEY, strict=False, caption="Compile configurations",
                     rename={"e2e_value": f"{e2e_name} ({cfg.workload.metric.unit})"}))
    wd.appendix(comp, "compile table, every column")
    if breaks is not None and len(breaks):
        display(Markdown("### Graph breaks of the reference code"))
        display(wd.table(breaks, caption="Graph breaks (torch._dynamo explain)"))
    if reasons is not None and len(reasons):
        display(Markdown("### Why the reference code recompiled (the guard that failed)"))
        display(wd.table(study.guard_groups(reasons), caption="Failed guards, grouped (numbers and names in them "
                                                               "folded; every recompile: the appendix)"))
        wd.appendix(reasons, "every recompile and its guard")
    study.plot_compile_times(comp, cfg.workload.goals.get("regional_cold_s"))
    plt.show()

# %% [markdown]
# ## Results rows

# %%
rows = study.result_rows(cfg, lad, comp, best)
if rows:
    path = results.append(rows, cfg.results_path)
    print(f"appended {len(rows)} rows to {path}")
    wd.rows(cfg.results_path, rows[0]["run_id"])

# %% [markdown]
# ## Interpretation

# %%
Markdown(study.interpret(cfg, lad, comp, vae, hyg))

# %% [markdown]
# **Next:** [05 · Triton kernels](05_triton_kernels.ipynb) fuses the glue that `torch.compile` leaves (norms,
# modulation, RoPE) on top of this notebook's best stack; [06 · CUDA graphs](06_cuda_graphs.ipynb) removes the
# launch overhead that the "GPU busy" column shows (wall time above busy time is the host launching kernels).
#
# ## Appendix: raw tables

# %%
wd.show_appendix()
