"""Rows of notebooks 03, 05, 06, 07 and 08 on the tiny presets with the API of commit bd4f4cb: the recipe that wrote
rows_tiny_before_house.csv (run from a checkout of that commit: `PYTHONPATH=<checkout> python THIS OUT.csv TMPDIR`).
One thread, seed 0, fixed ceilings, the cheapest settings that still reach each notebook's row code (warmup 0, one
or two repeats, short runs, small grids); what runs is what the notebook calls on a CPU:

- 03 (step reduction): validate, build, run_sweep, quality (skipped: the trained world presets need a GPU) and
  result_rows, at mg2 (two solvers, two step lists and one extra shift, 2 blocks) and wma (two solvers, counts 3
  and 1, each pass alone). deviation_budget_db 20 (not 30) so that a curve other than the reference's has a knee
  too; the deviations sit far from it (mg2: 14-15 dB, and 27 dB for the knee), so no knee hangs on rounding.
- 05 (Triton kernels): its ladder on top of a cheap base (bf16) with the one kernel row that runs without Triton's
  interpreter (wma: head-conv-gemm), 1 DDIM step end to end, stored row by row as the notebook stores them. Left
  out: the kernel table (on a CPU it checks the interpreted kernels and writes no rows: `kernel_rows` needs GPU
  timings) and the triton-fused rows (about 100 s a row in the interpreter at the tiny shapes).
- 06 (CUDA graphs): its ladder at mg2 on a bf16 base (not notebook 04's compiled best: seconds of compile a row)
  with its CPU rows (static caches, ring KV cache, the decoder's stream buffers and channels-last, the stand-in
  tiny decoder's comparison row), 1 block end to end, and the decoder table's rows without its compiled stacks
  (compile time is all they add on a CPU); the CUDA-graph rows need a GPU. compile_backend eager: the stand-in's
  compiled tiny decoder without aot_eager's cost.
- 07 (motion data loading): the whole notebook (profile, ladder with every CPU variant, scaling over 32 and 64
  robots, stage table) with warmup 0 and 2 repeats.
- 08 (multi GPU): its stage-split job at mg2 (2 gloo ranks, 2 blocks, a bf16 stack, warmup 0, 1 repeat): about
  25 s on 2 cores (torchrun and two ranks that each import torch and build the pipeline), within the 40 s it may
  take. Left out: the data-parallel layout (wma), a second job.

About 75 s on 2 cores in all (one thread; 08's ranks one thread each).

Written columns: the row's key, unit, value, gate, the error columns (rel_l2_vs_fp32, rel_l2_vs_fp64), num_envs and
source (07), and params as JSON (sorted keys): everything a row says that a later run can be compared with; timings
are written too (the test checks only that they are there and finite).
"""
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported (07's triton row, 05's imports)

import pandas as pd  # noqa: E402
import torch  # noqa: E402

torch.set_num_threads(1)
CEIL = {"gemm_tflops": 1.0, "copy_gbps": 10.0, "sdpa_tflops": 0.5, "device_name": "cpu"}
KEEP = ["notebook", "workload", "preset", "variant", "metric", "unit", "value", "gate", "rel_l2_vs_fp32",
        "rel_l2_vs_fp64", "num_envs", "source", "params"]


def stored(path) -> pd.DataFrame:
    """The rows a notebook stored row by row (05, 06, 08) in its results file."""
    from wmbook import results

    return results.read(path)


def nb03(tmp: Path) -> list:
    from wmbook.studies import steps

    rows = []
    for wl, kw in (("mg2", dict(solvers="renoise,unipc", sampling_steps="1000,666,333;1000,500", shifts="8", blocks=2)),
                   ("wma", dict(solvers="ddim,unipc", sampling_steps="3,1", split_passes=True))):
        cfg = steps.validate(workload=wl, device="cpu", warmup=0, repeats=1, deviation_budget_db=20.0, seed=0,
                             output_dir=str(tmp / f"03-{wl}"), results_path=str(tmp / f"03-{wl}.csv"), **kw)
        pipe, inputs = steps.build(cfg)
        sweep = steps.run_sweep(cfg, pipe, inputs, progress=False)
        steps.quality(cfg, pipe, sweep, progress=False)
        rows.append(pd.DataFrame(steps.result_rows(sweep)))
    return rows


def nb05(tmp: Path) -> list:
    from wmbook.studies import compile as study04
    from wmbook.studies import kernels

    path = tmp / "05-wma.csv"
    cfg = kernels.validate(workload="wma", device="cpu", kernel_table=False, ladder=True, base="bf16",
                           steps="head-conv-gemm", warmup=0, repeats=1, e2e_ddim_steps=1, e2e_repeats=1, seed=0,
                           output_dir=str(tmp / "05-wma"), results_path=str(path))
    kernels.run_ladder(study04.reference(cfg), cfg, CEIL)
    return [stored(path)]


def nb06(tmp: Path) -> list:
    from wmbook.studies import compile as study04
    from wmbook.studies import decoder as dstudy
    from wmbook.studies import graphs

    path = tmp / "06-mg2.csv"
    cfg = graphs.validate(workload="mg2", device="cpu", base="bf16", compile_backend="eager", warmup=0, repeats=1,
                          e2e_blocks=1, e2e_repeats=1, seed=0, output_dir=str(tmp / "06-mg2"), results_path=str(path))
    ref = study04.reference(cfg)
    graphs.run_ladder(ref, cfg, CEIL)
    # graphs.decoder_study without its compiled stacks (compile time is all they add on a CPU)
    stacks = {k: v for k, v in dstudy.decoder_stacks(cfg.workload, cfg.device).items() if "vae-compile" not in v}
    lat = cfg.workload.decoder_latents(ref, cfg.seed, graphs.e2e_size(cfg))
    drows = dstudy.run_decoder_table(ref, cfg.workload, lat, stacks, warmup=1, repeats=max(2, cfg.repeats // 3),
                                     compile_backend=cfg.options.compile_backend)
    return [stored(path), pd.DataFrame(dstudy.result_rows(cfg, drows))]


def nb07(tmp: Path) -> list:
    from wmbook.studies import motion

    cfg = motion.validate(device="cpu", scaling_envs="32,64", warmup=0, repeats=2, profile_warmup=0, profile_active=1,
                          seed=0, output_dir=str(tmp / "07"), results_path=str(tmp / "07.csv"))
    s = motion.setup(cfg, CEIL)
    stages = motion.stage_table(motion.profile_fetch(s), cfg)
    lad = motion.run_ladder(s)
    scaling = motion.run_scaling(s, lad)
    return [pd.DataFrame(motion.result_rows(cfg, s, lad, scaling, stages))]


def nb08(tmp: Path) -> list:
    from wmbook.studies import multi_gpu

    path = tmp / "08-mg2.csv"
    cfg = multi_gpu.validate(workload="mg2", device="cpu", base="bf16", blocks=2, warmup=0, repeats=1, seed=0,
                             output_dir=str(tmp / "08-mg2"), results_path=str(path))
    multi_gpu.run(cfg, progress=False)
    return [stored(path)]


def frame(parts: list) -> pd.DataFrame:
    df = pd.concat([p for p in parts if len(p)], ignore_index=True)
    df["params"] = [json.dumps(json.loads(p) if isinstance(p, str) else p, sort_keys=True) for p in df["params"]]
    return df.reindex(columns=KEEP)


if __name__ == "__main__":
    out, tmp = Path(sys.argv[1]), Path(sys.argv[2])
    tmp.mkdir(parents=True, exist_ok=True)
    parts = []
    for nb in (nb03, nb05, nb06, nb07, nb08):
        t0, c0 = time.perf_counter(), sum(os.times()[:4])
        parts += nb(tmp)
        cpu = sum(os.times()[:4]) - c0  # this process's and its ranks' (08) CPU seconds
        print(f"{nb.__name__}: {time.perf_counter() - t0:.1f} s, {cpu:.1f} s CPU", file=sys.stderr)
    df = frame(parts)
    df.to_csv(out, index=False)
    print(df[["notebook", "workload", "variant", "metric", "value"]].to_string())
