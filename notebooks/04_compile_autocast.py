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
# precision (at most 1.1x its error against fp32). The seed's criterion against the eager output at the same
# precision (bf16: max < 1e-2, mean < 1e-3 relative to the largest magnitude) is shown beside it: at 30 bf16
# layers two roundings of one computation already differ by about that much (see `wmbook.check.GateResult`).
# A row that fails shows its numbers but its time does not count. **The ladder** is cumulative: each row is the
# previous row plus one variant. Timing: warm-up excluded, CUDA events, median with p20-p80.

# %% tags=["parameters"]
workload = "mg2"       # mg2 (causal DiT + KV cache) | wma (video UNet + DDIM)
preset = "auto"        # auto: tiny/tiny-wma on CPU, mg2-universal/wma on GPU
device = "auto"        # auto | cpu | cuda
ladder = "auto"        # auto: the workload's default ladder; or comma-separated variant names
sections = "all"       # all, or a comma-separated subset of precision, vae, hygiene, attention, ladder, compile
compile_modes = "default"  # modes in the ladder and the compile table: default, max-autotune-no-cudagraphs (benchmarks every GEMM/conv: many minutes at real shapes), or both comma-separated
compile_backend = "auto"  # auto: inductor on GPU, aot_eager on CPU (inductor's CPU codegen takes minutes) | inductor | aot_eager | eager
compile_table = "auto"  # auto: all on a GPU, all but dynamic on a CPU; all; or a comma-separated subset of reference, hygiene, dynamic, whole, max-autotune
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
import pandas as pd
from IPython.display import Markdown, display

from wmbook import device as wdev
from wmbook import results
from wmbook.studies import compile as study

cfg = study.validate(workload=workload, preset=preset, device=device, ladder=ladder, sections=sections,
                     compile_modes=compile_modes, compile_backend=compile_backend, compile_table=compile_table,
                     warmup=warmup, repeats=repeats, e2e_blocks=e2e_blocks, recompile_blocks=recompile_blocks,
                     e2e_ddim_steps=e2e_ddim_steps, e2e_repeats=e2e_repeats, output_dir=output_dir,
                     results_path=results_path, seed=seed)
cfg.table()

# %% [markdown]
# ## The variants this workload can use
# The group `hygiene` stands for the hygiene variants that apply to the workload (listed below the table); the
# ladder adds them one at a time, so each row shows what one change bought.

# %%
vt = study.variants_table(cfg)
display(vt)
print("groups:", vt.attrs["groups"])

# %% [markdown]
# ## Device ceilings and the fp32 eager reference

# %%
ceilings = wdev.measure_ceilings(cfg.device, quick=cfg.tiny, extended=True)
ref = study.reference(cfg)
pd.Series({k: ceilings.get(k) for k in ("device_name", "gemm_tflops", "gemm_tflops_tf32", "gemm_tflops_fp32",
                                          "sdpa_tflops", "copy_gbps")}, name="value").to_frame()

# %% [markdown]
# ## Precision, one variant at a time (gated against fp32)

# %%
prec = study.precision_table(ref, cfg, ceilings) if "precision" in cfg.options.sections else None
prec

# %% [markdown]
# ## The VAE decoder in fp32 / bf16 / fp16 (and channels-last on a GPU)
# The reference's latents decoded in each precision, PSNR against the fp32 decode: a bf16 VAE once cost a
# competition team 12 dB.

# %%
vae = study.vae_table(ref, cfg) if "vae" in cfg.options.sections else None
vae

# %% [markdown]
# ## Dtype and host-sync hygiene: casts, copies and host reads per forward, one variant at a time
# Each row adds one hygiene variant to the bf16 eager model (cumulative), so the table shows what each removes.

# %%
hyg = study.hygiene_table(ref, cfg) if "hygiene" in cfg.options.sections else None
hyg

# %% [markdown]
# ## Attention backends on the shapes one forward runs
# Each recorded call shape timed with each backend (error against the fp32 math reference), the kernel that
# PyTorch's own choice (`auto`) runs, and for the DiT the block-causal full-sequence attention with a dense
# mask versus FlexAttention's block mask.

# %%
best = None
if "attention" in cfg.options.sections:
    shapes, attn_table, best, flex = study.attention_section(ref, cfg)
    display(shapes)
    display(attn_table)
    if flex is not None:
        display(flex)
    print("best backend (FLOP-share weighted, within tolerance):", best)

# %% [markdown]
# ## The ladder
# Each row adds one variant to the row above. For mg2 it includes `action-attn-fused`: the action modules' tiny
# attentions (3 query frames against at most 6 key frames, per spatial location and head) written as a
# multiply-reduce that `torch.compile` fuses. The SDPA kernel it replaces pads each of the 880 x 16 small
# problems to a full tile. It is written for the compiled row that follows it: eager, it materializes its products.

# %%
lad = None
if "ladder" in cfg.options.sections:
    steps = cfg.options.ladder or study.default_ladder(cfg, best)
    print("ladder:", " -> ".join(["fp32 eager", *steps]))
    lad = study.run_ladder(ref, cfg, steps, ceilings)
    display(lad.table())

# %%
if lad is not None:
    fig, axes = plt.subplots(1, 2, figsize=(15, 0.45 * len(lad.rows) + 1.5))
    lad.plot(ax=axes[0])
    study.plot_forward_vs_floor(lad, ax=axes[1])
    fig.tight_layout()
    plt.show()

# %% [markdown]
# ### Where each row's GPU time goes
# Kernel time per forward by category, from one profiled forward per row (on a GPU). Against the FLOP floor it
# shows what is left to remove: the floor only counts GEMM and attention FLOPs at the measured GEMM ceiling.

# %%
if lad is not None and not lad.categories().empty:
    display(lad.categories().round(2))
    lad.plot_categories()
    plt.show()

# %% [markdown]
# ## torch.compile: regional vs whole, dynamic, cold vs warm, recompiles
# Cold = empty on-disk cache; warm = the same compile again after `torch._dynamo.reset()` with the cache the
# cold run filled (inductor only: the CPU smoke run's aot_eager keeps no cache, so it measures cold alone). Recompiles are counted over a warm end-to-end run after a first one (which may compile
# each new shape once). The first row compiles the reference code, the others the code after the fix: the
# `hygiene` variants (the group of the table above). For the causal DiT they write the KV caches at the slots
# prepared once per forward before the compiled region (`kv-slot-write`), window the action inputs once per
# forward without a host read (`action-hoist`) and fill the cross-attention K/V before the first block
# (`cross-kv-prefill`): the blocks then get no Python ints, trace without graph breaks and do not recompile per
# block.

# %%
comp = breaks = reasons = None
if "compile" in cfg.options.sections:
    comp, breaks, reasons = study.compile_section(ref, cfg, ceilings=ceilings)
    display(comp)
    if breaks is not None and len(breaks):
        display(Markdown("### Graph breaks of the reference code"))
        display(breaks)
    if reasons is not None and len(reasons):
        display(Markdown("### Why the reference code recompiled (the guard that failed)"))
        display(reasons[["function", "guard"]].value_counts().rename("count").to_frame())
    study.plot_compile_times(comp, cfg.workload.goals.get("regional_cold_s"))
    plt.show()

# %% [markdown]
# ## Results rows

# %%
rows = study.result_rows(cfg, lad, comp, best)
if rows:
    path = results.append(rows, cfg.results_path)
    print(f"appended {len(rows)} rows to {path}")

# %% [markdown]
# ## Interpretation

# %%
Markdown(study.interpret(cfg, lad, comp, vae, hyg))
