"""Why does notebook 07's captured fetch cost more host time per replay than a one-kernel graph? (H100, c045e2c: 12.3 us
to issue one fetch against 6.1 us for a graph holding one `add_`; the wrapper's Python is under 1 us.) Measures, on
one GPU, the host time to issue one replay and the back-to-back time per replay of:

- a graph of one `x.add_(1)` (wmbook.bench.graph_replay_floor's graph), and of 2 and 8 of them (cost per node);
- the fetch's Triton kernel captured alone in a bare torch.cuda.CUDAGraph, with and without a private pool;
- the notebook's row (`triton` + `cuda-graph`: wmbook.graphs.GraphedCallable through `term.fetch`);
- K steps in one graph (fetch, then every robot's time advanced, K times; bench.time_in_graph): the fetch's cost per
  step when it is one part of a larger captured environment step, where the graph's launch is paid once.

Each graph's node count comes from its debug dump (DOT). Prints a table and writes it as CSV.

    PYTHONPATH=$PWD python3 tools/replay_diag.py --out /tmp/replay_diag.csv
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import tempfile
from pathlib import Path

import pandas as pd
import torch

from wmbook import bench
from wmbook.errors import command
from wmbook.studies import motion as study


def _nodes(fn, calls: int = 1) -> int | None:
    """Kernel/memset/memcpy nodes of a graph of `calls` calls of fn, from its debug dump (None when unavailable)."""
    g = torch.cuda.CUDAGraph()
    try:
        g.enable_debug_mode()
    except Exception:  # noqa: BLE001
        return None
    with torch.cuda.graph(g):
        for _ in range(calls):
            fn()
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "g.dot"
        try:
            g.debug_dump(str(p))
            text = p.read_text()
        except Exception:  # noqa: BLE001  (no dump written: the count is unavailable, not an error)
            return None
    return len(re.findall(r"(?m)^\s*\"?graph_\d+_node_\d+\"?\s*\[", text)) or text.count("label=\"{")


def _measure(name: str, fn, dev, rounds: int = 20, nodes=None) -> dict:
    """Host time to issue one call of fn and its back-to-back time per call (fn: a replay or a captured fetch)."""
    loop = bench.time_back_to_back(fn, calls=50, rounds=rounds, warmup=3, device=dev)
    host = statistics.median(bench.host_launch_ms(fn, dev) for _ in range(rounds))
    return {"graph": name, "steps per call": 1, "nodes": nodes, "host us / call": host * 1e3,
            "loop us / step": loop.median * 1e3, "loop p20": loop.p20 * 1e3, "loop p80": loop.p80 * 1e3}


@command("replay_diag.py")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="g1-4096")
    ap.add_argument("--steps", default="1,4,16", help="steps per graph for the K-steps rows")
    ap.add_argument("--out", default=None, help="CSV path")
    a = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("replay_diag needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda")
    rows = []

    x = torch.zeros(1, device=dev)
    for n in (1, 2, 8):
        g = bench.capture_graph(lambda: x.add_(1), n, device=dev)
        rows.append(_measure(f"{n} x add_", g.replay, dev, nodes=_nodes(lambda: x.add_(1), n)))

    cfg = study.validate(preset=a.preset, device="cuda")
    s = study.setup(cfg, {"copy_gbps": float("nan")})
    term = s.term(["packed-gather", "contiguous-layout", "triton"])
    fetch = term._fetch  # the Triton launch writing the term's output rows in place
    for pool in (False, True):
        for _ in range(3):
            fetch()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=torch.cuda.graph_pool_handle() if pool else None):
            fetch()
        rows.append(_measure(f"triton fetch, bare graph{', private pool' if pool else ''}", g.replay, dev,
                             nodes=_nodes(fetch)))

    row_term = s.term(["packed-gather", "contiguous-layout", "triton", "cuda-graph"])
    for _ in range(4):
        row_term.fetch()
    rows.append(_measure("notebook 07 row (GraphedCallable via term.fetch)", row_term.fetch, dev))
    rows.append(_measure("GraphedCallable, called directly", row_term._fetch, dev))

    def step():  # one environment step's share: the fetch, then every robot's time advanced
        fetch()
        term.episode_times += term.step_dt

    for k in (int(v) for v in a.steps.split(",")):
        per = bench.time_in_graph(step, k, rounds=20, device=dev)
        rows.append({"graph": f"{k} steps (fetch + advance) in one graph", "steps per call": k,
                     "nodes": _nodes(step, k), "loop us / step": per.median * 1e3, "loop p20": per.p20 * 1e3,
                     "loop p80": per.p80 * 1e3})

    df = pd.DataFrame(rows)
    floor = s.bytes_per_step()
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}; {a.preset}: {floor / 1e6:.2f} MB per step")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    if a.out:
        df.to_csv(a.out, index=False)
    return 0


if __name__ == "__main__":
    sys.exit(main())
