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
# # 05 · Fused Triton kernels and fp8 GEMMs: the glue and the GEMMs that compile leaves on the table
#
# **Question.** After notebook 04's best stack, normalization, copies and elementwise ops still take a large share of
# the GPU time (notebook 02's category table: about 29% of the DiT forward, and the UNet's GroupNorm + SiLU). Can one
# fused kernel per pattern move only the bytes the op must move, faster than what `torch.compile` generates for the
# same op sequence, and how much do fp8 GEMMs take off the rest?
#
# **How.** Each kernel in `wmbook/kernels/` is a Triton kernel with its launcher, an fp32 reference and a
# `torch.library` op (`wmbook::<name>`): a `triton_op` on a GPU, so torch.compile traces into it and launches the
# kernel from its own code (as opaque custom ops each call would cost a Python launch inside the graph), a `custom_op`
# under the CPU interpreter; a CUDA graph captures it either way. Inference only. First each kernel at the workload's
# real call sites (`Workload.kernel_cases`): the
# model's own unfused op sequence (eager), `torch.compile` of that sequence, and the kernel, each captured in a CUDA
# graph and timed by replaying it with the L2 cache flushed before every replay (median, p20-p80): the GPU time of the
# kernels, not of their Python launch path (a few-microsecond kernel can take longer to launch than to run; launch
# overhead is notebook 06's subject). In GB/s of the fewest bytes the op must move, against the measured copy
# bandwidth. Then ladder rows on top of notebook 04's best stack, each gated
# against the fp32 reference before its time counts. On a CPU the kernels run in Triton's interpreter on the tiny
# shapes: correctness only.

# %% tags=["parameters"]
workload = "mg2"       # mg2 (causal DiT + KV cache) | wma (video UNet + DDIM)
preset = "auto"        # auto: tiny/tiny-wma on CPU, mg2-universal/wma on GPU
device = "auto"        # auto | cpu | cuda
kernel_table = True    # each kernel at the workload's call sites: eager vs torch.compile vs Triton
rep_ms = 200           # milliseconds of repeated calls per kernel timing
ladder = "auto"        # the ladder rows on top of notebook 04's best stack; auto: on a GPU only
base = "auto"          # auto: notebook 04's best stack (its ladder + compile); or comma-separated variant names
steps = "auto"         # rows added to the base; auto: triton-fused, norm-conv-bias + head-conv-gemm + upsample-fold + frames-norm-triton (wma), ffn-gelu-epilogue + action-norm-rope + fused-qkv (mg2), vae-triton-fused, vae-norm-conv-bias (wma), attn-sage, fp8-static (where the device has FP8), attn-triton (mg2)
compile_backend = "auto"  # auto: inductor on GPU, aot_eager on CPU | inductor | aot_eager | eager
warmup = 3             # untimed forwards before timing
repeats = 10           # timed forwards per row
e2e_blocks = 0         # mg2 blocks per end-to-end run; 0 means 4 on a GPU, 3 on a CPU
e2e_ddim_steps = 0     # wma DDIM steps per pass in the end-to-end run; 0: the preset's default
e2e_repeats = 0        # timed end-to-end runs per row (median, p20-p80); 0: 3 on a GPU, 2 on a CPU
compile_ahead = "auto"  # processes compiling the ladder's compiled stacks side by side first; auto: wma on a GPU; 0: none
output_dir = "auto"
results_path = "auto"  # auto: data/results/results.csv for real presets, reports/results/results-tiny.csv for tiny ones
seed = 0

# %%
import os

if device == "cpu" or (device == "auto" and not __import__("torch").cuda.is_available()):
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported: the kernels run on the CPU

import matplotlib.pyplot as plt
from IPython.display import Markdown, display

from wmbook import device as wdev
from wmbook import display as wd
from wmbook import results
from wmbook.studies import compile as study04
from wmbook.studies import kernels as study

wd.setup()
cfg = study.validate(workload=workload, preset=preset, device=device, kernel_table=kernel_table, rep_ms=rep_ms,
                     ladder=ladder, base=base, steps=steps, compile_backend=compile_backend, warmup=warmup,
                     repeats=repeats, e2e_blocks=e2e_blocks, e2e_ddim_steps=e2e_ddim_steps, e2e_repeats=e2e_repeats,
                     compile_ahead=compile_ahead, output_dir=output_dir, results_path=results_path, seed=seed)
print("base stack:", " -> ".join(map(str, study.base_stack(cfg))), "| kernel rows:",
      " -> ".join(map(str, study.kernel_steps(cfg))))
print(study.fp8_note(cfg))
# the key columns, narrow enough for a 1400 px page (the full stacks and every other column: the appendix)
LADDER_KEY = ["variant", "gate", "rel_l2_vs_fp32", "forward_ms", "speedup", "x_floor", "gpu_busy_ms", "launches",
              "e2e_value", "e2e_first_frame_ms", "psnr_db", "peak_memory_gib"]
wd.table(cfg.table(), caption="Parameters of this run (validated)")

# %% [markdown]
# ## Each kernel at its call sites: eager, torch.compile, Triton
# `MB` is what the op must move at least (each input read once, each output written once); GB/s divides it by the
# time, so 100% of copy would be a kernel that only streams its bytes. `rel_l2` is the error against the fp32
# reference: the kernel passes when it is no further from fp32 than the eager op sequence (or within the dtype's
# tolerance). What to look for: the fused kernel's GB/s against the copy bandwidth, and whether it beats
# `torch.compile`'s own fusion of the same ops (if not, the kernel is not worth its maintenance).

# %%
ceilings = wdev.measure_ceilings(cfg.device, quick=cfg.tiny)
tab = study.kernel_table(cfg, ceilings) if cfg.options.kernel_table else None
if tab is not None:
    kernel_rows = study.kernel_rows(cfg, tab)
    if kernel_rows:  # stored now: a later cell cut by a time limit keeps them
        results.append(kernel_rows, cfg.results_path)
    display(wd.table(study.kernel_summary(tab), caption="Each kernel at its call sites"))
    wd.appendix(tab, "the kernel measurements, every column")
else:
    print("kernel_table=False")

# %%
fig = study.plot_kernels(tab, f"{cfg.workload.name} / {cfg.preset.name}") if tab is not None else None
if fig is not None:
    plt.show()
else:
    print("no timings on a CPU: the Triton interpreter checks correctness only")

# %% [markdown]
# ## Ladder: notebook 04's best stack, then the kernels, then quantized attention and fp8
# Each row adds one variant and is gated against the fp32 reference; a row that fails the gate is shown but its time
# does not count. `attn-sage` (SageAttention: Q and K in int8, P.V in fp16) is a comparison row for the attention
# share of the forward; masked calls, head dims it does not take and key lengths that are not whole 64-key blocks keep
# SDPA (the table under the ladder counts them: at mg2-universal's 880 tokens a frame, every call). `fp8-static` runs
# the large linears as fp8 GEMMs with scales fixed beforehand (weights per output channel; each input per tensor, from
# a short calibration generation), so no scale reduction runs before each GEMM as in torchao's dynamic path (`fp8`,
# which `steps` can add). `GPU busy ms` is the kernels' time per forward: what the fused kernels and fp8 act on. Wall time
# includes the host's launches (notebook 06 removes those with CUDA graphs). The base is the best stack of
# [04 · compile and precision](04_compile_autocast.ipynb). What to look for: GPU busy time going down row by row.
# With `compile_ahead` (wma on a GPU) the stacks the rows compile are compiled side by side first, one process each, so
# a row's first call reads its compile from the cache; `compiled_ahead_s` (appendix) is its cold first call there.

# %%
if cfg.options.ladder:
    ref = study04.reference(cfg)
    lad = study.run_ladder(ref, cfg, ceilings)
    if lad.compile_ahead is not None:  # the compiled rows' stacks, compiled side by side first
        print(lad.compile_ahead.summary())
    t = lad.table()
    display(wd.table(t, columns=LADDER_KEY, strict=False, caption="Ladder rows",
                     rename={"e2e_value": f"end to end ({cfg.workload.metric.unit})"}))
    wd.appendix(t, "the ladder, every column")
    if "attn-sage" in map(str, study.kernel_steps(cfg)):
        st = study.sage_table()
        if len(st):
            display(wd.table(st, percent=["share"], caption="attn-sage: attention() calls outside compiled regions, by "
                             "kernel (SageAttention, or SDPA and why)"))
        print(study.SAGE_ROUTES)
else:
    lad = None
    print("ladder rows left out (ladder=False; its default on a CPU, where the kernels run in Triton's interpreter at "
          "seconds per forward: the tests check the triton-fused variants against the fp32 reference on the tiny "
          "presets there)")

# %% [markdown]
# ### GPU time per forward by operator category
# What to look for: the normalization and elementwise categories shrinking where the fused kernels replace them.

# %%
wd.categories(lad)

# %% [markdown]
# ## Results rows

# %%
# stored as they were measured: the kernel rows after the kernel table, each ladder row as soon as it finished
stored = results.read(cfg.results_path, run_id=results.RUN_ID)
print(f"{len(stored)} rows of this run in {cfg.results_path}")
if len(stored):
    wd.rows(cfg.results_path, results.RUN_ID)

# %% [markdown]
# ## Interpretation

# %%
Markdown(study.interpret(cfg, tab, lad))

# %% [markdown]
# **Next:** [06 · CUDA graphs](06_cuda_graphs.ipynb) removes the host's launch overhead that the wall-time vs
# GPU-busy columns show, and speeds up the decoder.
#
# ## Appendix: raw tables

# %%
wd.show_appendix()
