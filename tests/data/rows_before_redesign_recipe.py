"""Rows of notebooks 01, 02 and 04 on the tiny presets with the pre-redesign API: the recipe that wrote
rows_tiny_before_redesign.csv (run from a checkout of commit 17fce5b:
`PYTHONPATH=<checkout> python THIS OUT.csv TMPDIR`)."""
import sys
from pathlib import Path

import pandas as pd
import torch

torch.set_num_threads(1)
OUT = Path(sys.argv[1])
tmp = Path(sys.argv[2])
CEIL = {"gemm_tflops": 1.0, "copy_gbps": 10.0, "sdpa_tflops": 0.5, "device_name": "cpu"}
rows = []

from wmbook import workloads

for wl, extra in (("mg2", {}), ("wma", {})):
    cfg = workloads.validate(wl, device="cpu", warmup=0, repeats=2, profile=True, output_dir=str(tmp / f"01-{wl}"),
                             results_path=str(tmp / "r.csv"), seed=0)
    bl = workloads.module(wl)
    pipe, inputs = bl.build(cfg)
    res = bl.run_benchmark(pipe, inputs, cfg, CEIL)
    stages, _, _ = bl.profile_stages(pipe, inputs, cfg)
    rows += bl.result_rows(cfg, res, stages)

from wmbook import bottleneck as bn

cfg = bn.validate(workload="mg2", device="cpu", trace="tests/data/trace_tiny_h100.json.gz", measure_overhead=False,
                  output_dir=str(tmp / "02"), results_path=str(tmp / "r.csv"))
bd = bn.breakdown(cfg.trace, cfg, {"gemm_tflops": 802.0, "sdpa_tflops": 691.0, "copy_gbps": 3000.0})
rows += bn.result_rows(cfg, bd)

from wmbook import compile_autocast as ca

for wl, steps in (("mg2", ["bf16", "hygiene", "action-attn-fused"]), ("wma", ["bf16", "hygiene", "channels-last"])):
    cfg = ca.validate(workload=wl, device="cpu", sections="ladder", warmup=0, repeats=2, e2e_repeats=1,
                      output_dir=str(tmp / f"04-{wl}"), results_path=str(tmp / "r.csv"))
    ref = ca.reference(cfg)
    lad = ca.run_ladder(ref, cfg, steps, CEIL)
    rows += ca.result_rows(cfg, ladder=lad)

df = pd.DataFrame(rows)
keep = ["notebook", "workload", "preset", "variant", "metric", "unit", "value", "gate", "rel_l2_vs_fp32"]
df[[c for c in keep if c in df]].to_csv(OUT, index=False)
print(df[["notebook", "workload", "variant", "metric", "value"]].to_string())
