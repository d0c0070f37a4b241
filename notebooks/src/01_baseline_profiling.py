CELLS = [
("md", """
# 01 · Baseline profiling of the causal world model

**Question.** How fast does the eager reference pipeline (Matrix-Game-2 style block-causal Wan DiT with
KV caches + streaming Wan VAE decode) generate frames, where does the time go, and how far is one DiT
forward from its FLOP floor on this device?

Definitions (as in the README): *forward* = one DiT call on one block; *FPS* = decoded pixel frames per
second in steady state (blocks after the first), counting every forward of a block (denoising steps and
the cache-refresh pass) and the VAE decode, warm-up excluded; *first-frame latency* = generation start to
the first decoded frame, warm; *BPS* = blocks per second, same accounting; *DiT forward floor* = the
forward's FLOPs over the measured bf16 GEMM ceiling of this device.
"""),
("params", """
preset = "auto"        # auto: tiny on CPU, mg2-universal on GPU | tiny | tiny-sf | mg2-universal | self-forcing
device = "auto"        # auto | cpu | cuda
dtype = "auto"         # auto: bf16 on GPU, fp32 on CPU | fp32 | bf16 | fp16
vae_dtype = "auto"     # auto: same as dtype | fp32 | bf16 | fp16
num_blocks = 0         # blocks to generate; 0 means the preset default
warmup = 1             # untimed generations before timing
repeats = 3            # timed generations
profile = True         # record one torch.profiler trace of the whole labelled pipeline
output_dir = "auto"    # trace and GIF; auto: reports/artifacts/01_baseline_profiling/PRESET-DEVICE
results_path = "auto"  # auto: data/results/results.csv for real presets, reports/results/results-tiny.csv for tiny ones
seed = 0
"""),
("code", """
import matplotlib.pyplot as plt
from IPython.display import Image, Markdown, display

import wmbook.baseline as bl
from wmbook import device as wdev
from wmbook import results
from wmbook.profiling import block_table, profile as torch_profile, stage_table

cfg = bl.validate(preset=preset, device=device, dtype=dtype, vae_dtype=vae_dtype, num_blocks=num_blocks,
                  warmup=warmup, repeats=repeats, profile=profile, output_dir=output_dir,
                  results_path=results_path, seed=seed)
cfg.table()
"""),
("md", "## Device ceilings (measured here, cached per device)"),
("code", """
ceilings = wdev.measure_ceilings(cfg.device, quick=cfg.tiny)
pd_ceil = __import__("pandas").Series(ceilings, name="value").to_frame()
pd_ceil
"""),
("md", "## The reference pipeline at this preset"),
("code", """
pipe, inputs = bl.build(cfg)
bl.model_table(pipe, inputs)
"""),
("md", "## Eager baseline: warm-up excluded, device-event timing, median and spread over repeats"),
("code", """
res = bl.benchmark(pipe, inputs, warmup=cfg.warmup, repeats=cfg.repeats, ceilings=ceilings)
res.summary_table()
"""),
("code", "res.run_table()"),
("md", "### Per block and per forward (median over runs; forward 0 of block 0 also embeds the context)"),
("code", "res.block_table()"),
("code", "res.step_table().pivot(index='block', columns='forward', values='ms')"),
("md", "### DiT forward against its FLOP floor"),
("code", """
from wmbook.models.flops import dit_forward_flops
parts = dit_forward_flops(pipe.preset, block_idx=1)
floor = __import__("pandas").DataFrame({"GFLOP": {k: v / 1e9 for k, v in parts.items()}})
floor["floor_ms"] = [wdev.floor_ms(v, ceilings) for v in parts.values()]
floor
"""),
("code", """
fig, axes = plt.subplots(1, 2, figsize=(12, 3.4), gridspec_kw={"width_ratios": [1, 1.6]})
bl.plot_time_split(res, ax=axes[0])
bl.plot_timeline(res, ax=axes[1])
fig.tight_layout()
"""),
("md", "## Profiled run: the four top-level stages and the label tree"),
("code", """
stages = None
if cfg.profile:
    prof = torch_profile(lambda: pipe.run(cfg.num_blocks, seed=cfg.seed, export_path=cfg.output_dir / "video.gif",
                                          progress=False),
                         wait=0, warmup=1, active=1, out_dir=cfg.output_dir, name="01_baseline_trace")
    labels = prof.label_table()
    stages = stage_table(labels).set_index("label")
    print("Chrome trace (open in https://ui.perfetto.dev or chrome://tracing):", prof.trace_path)
    display(stages)
    bl.plot_stage_shares(stages)
else:
    print("profile=False: no trace recorded")
"""),
("code", """
if cfg.profile:
    display(block_table(labels).head(20))
    display(labels.sort_values("cpu_total_ms", ascending=False).head(15))
"""),
("code", """
gif = cfg.output_dir / "video.gif"
if gif.exists():
    display(Image(filename=str(gif)))
"""),
("md", "## Results rows"),
("code", """
rows = bl.result_rows(cfg, res, stages)
path = results.append(rows, cfg.results_path)
print(f"appended {len(rows)} rows to {path}")
results.read(cfg.results_path, run_id=rows[0]["run_id"])[["preset", "variant", "metric", "value", "unit", "p20", "p80"]]
"""),
("md", "## Interpretation"),
("code", "Markdown(bl.interpret(cfg, res, stages))"),
]
