"""What a ProfilingSession costs a workload, part by part: paired runs (ABBA) without and inside a session, for the
shipped configs and for the development config with one part switched off at a time (label timing, the monitor's
GPU metrics, the console status line, every monitor). Uses wmbook.profiling.measure_overhead; prints one row per
configuration and writes them as JSON.

    PYTHONPATH=$PWD python3 tools/profiling_overhead.py wma --pairs 10 -p ddim_steps 5 --json out.json
    PYTHONPATH=$PWD python3 tools/profiling_overhead.py mg2 --pairs 10 -p num_blocks 3
"""

from __future__ import annotations

import argparse
import json

import yaml

from wmbook import workloads
from wmbook.errors import command
from wmbook.profiling import measure_overhead
from wmbook.profiling.config import load_config
from wmbook.studies import breakdown

GPU_METRICS = ("monitor_gpu_temperature", "monitor_gpu_power", "monitor_gpu_clocks")
ALL_METRICS = ("monitor_gpu_memory", "monitor_gpu_utilization", *GPU_METRICS, "monitor_cpu_usage",
               "monitor_system_memory")


def configurations() -> dict:
    dev = load_config("development")
    return {
        "production": load_config("production"),
        "development": dev,
        "dev-no-label-timing": dev.replace(time_labels=False),
        "dev-no-temp-power-clocks": dev.replace(**dict.fromkeys(GPU_METRICS, False)),
        "dev-no-status-line": dev.replace(real_time_display=False),
        "dev-no-monitor": dev.replace(real_time_display=False, **dict.fromkeys(ALL_METRICS, False)),
    }


@command("profiling_overhead.py")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("workload", choices=workloads.names())
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--only", default="", help="comma-separated subset of the configuration names")
    ap.add_argument("-p", nargs=2, action="append", default=[], metavar=("NAME", "VALUE"),
                    help="a notebook-02 parameter (YAML scalar), e.g. -p ddim_steps 5")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    params = {k: yaml.safe_load(v) for k, v in a.p}
    cfg = breakdown.validate(workload=a.workload, measure_overhead=True, **params)
    pipe, inputs = cfg.workload.build(cfg)
    fn = cfg.workload.generate_callable(pipe, inputs, cfg)
    confs = configurations()
    if a.only:
        confs = {k: v for k, v in confs.items() if k in {x.strip() for x in a.only.split(",")}}
    out = {"workload": a.workload, "preset": cfg.preset.name, "device": str(cfg.device), "params": cfg.params(),
           "rows": []}
    for name, conf in confs.items():
        ov = measure_overhead(fn, config=conf, pairs=a.pairs, warmup=1, device=cfg.device, seed=cfg.seed)
        ov["config"] = name
        out["rows"].append(ov)
        lo, hi = ov["overhead_ci90"]
        print(f"{name:26s} overhead {ov['overhead_frac']:+.2%} (p20-p80 {ov['overhead_p20']:+.1%}..."
              f"{ov['overhead_p80']:+.1%}, 90% CI {lo:+.1%}..{hi:+.1%}) baseline {ov['baseline_ms']['median']:.1f} ms "
              f"(spread {ov['baseline_spread_frac']:.1%}), sampler {ov['monitor']['sampling_share_of_wall'] or 0:.2%} "
              f"of wall", flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
