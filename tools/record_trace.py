"""Record one labelled torch.profiler trace of the streaming pipeline (fine DiT labels on, shapes recorded).

    PYTHONPATH=$PWD python3 tools/record_trace.py OUT_DIR PRESET [--blocks N] [--analyze] [--no-export]

One warm generation first (untraced), then one traced `pipe.run`. Used to make the committed
tests/data trace fixtures (tiny presets on a GPU) and to inspect real-shape traces; --analyze also
writes the breakdown of `2_Pipeline_Inference` as JSON next to the trace and prints its summary.
"""
import argparse
import json
import time
from pathlib import Path

import torch

from wmbook.pipelines.causal import CausalStreamingPipeline
from wmbook.profiling import profile, set_labels

ap = argparse.ArgumentParser()
ap.add_argument("out", type=Path)
ap.add_argument("preset")
ap.add_argument("--blocks", type=int, default=2)
ap.add_argument("--analyze", action="store_true")
ap.add_argument("--no-export", action="store_true", help="skip the GIF export stage")
a = ap.parse_args()

dev = "cuda" if torch.cuda.is_available() else "cpu"
pipe = CausalStreamingPipeline(a.preset, device=dev, seed=0)
gif = None if a.no_export else a.out / "video.gif"
set_labels(True, detail=True)
res = profile(lambda: pipe.run(a.blocks, seed=0, progress=False, export_path=gif), wait=0, warmup=1, active=1,
              out_dir=a.out, name=f"trace-{a.preset}-{dev}-{a.blocks}b", record_shapes=True)
print(res.trace_path, res.trace_path.stat().st_size)
if a.analyze:
    from wmbook.device import measure_ceilings
    from wmbook.profiling.breakdown import analyze

    ceil = measure_ceilings(dev, extended=True, quick=dev == "cpu")
    t0 = time.perf_counter()
    bd = analyze(res.trace_path, ceilings=ceil)
    print(f"analysis {time.perf_counter() - t0:.1f} s")
    out = res.trace_path.with_name(res.trace_path.name.replace(".json.gz", ".breakdown.json"))
    out.write_text(bd.to_json(indent=1))
    import pandas as pd

    pd.set_option("display.width", 200, "display.max_columns", 20)
    print(bd.categories.to_string())
    print(bd.forward_split.to_string())
    print(bd.launch_stats.to_string())
    print(bd.roofline.to_string())
    print(bd.suggestions[["rank", "finding", "evidence", "estimated_saving_ms", "notebook"]].to_string())
    print(bd.syncs.to_string())
    print(bd.unclassified.head(15).to_string())
    print(json.dumps({k: v for k, v in bd.summary().items() if not isinstance(v, list)}, default=str)[:3000])
