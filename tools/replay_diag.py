"""Why does notebook 07's captured fetch cost more host time per replay than a one-kernel graph? (H100, c045e2c: 12.3 us
to issue one fetch against 6.1 us for a graph holding one `add_`; the wrapper's Python is under 1 us.) Measures, on
one GPU, the host time to issue one replay and the back-to-back time per replay of:

- a graph of one `x.add_(1)` (wmbook.bench.graph_replay_floor's graph), and of 2 and 8 of them (cost per node);
- the fetch's Triton kernel captured alone in a bare torch.cuda.CUDAGraph, with and without a private pool;
- the notebook's row (`triton` + `cuda-graph`: wmbook.graphs.GraphedCallable through `term.fetch`);
- K steps in one graph (fetch, then every robot's time advanced, K times): the fetch's cost per step when it is one
  part of a larger captured environment step, where the graph's launch is paid once for the whole step.

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
from wmbook.motion import variants as mvariants
from wmbook.studies import motion as study


def _nodes(capture) -> int | None:
    """Kernel/memset/memcpy nodes of a graph captured by `capture(g)` with debug mode on (None when unavailable)."""
    g = torch.cuda.CUDAGraph()
    try:
        g.enable_debug_mode()
    except Exception:  # noqa: BLE001
        return None
    capture(g)
    with tempfile.TemporaryDirectory() as d:
        p = Path(d) / "g.dot"
        try:
            g.debug_dump(str(p))
        except Exception:  # noqa: BLE001
            return None
        text = p.read_text()
    return len(re.findall(r"(?m)^\s*\"?graph_\d+_node_\d+\"?\s*\[", text)) or text.count("label=\"{")


def _measure(name: str, fn, dev, calls: int = 50, rounds: int = 20, nodes=None, steps: int = 1) -> dict:
    loop = bench.time_back_to_back(fn, calls=calls, rounds=rounds, warmup=3, device=dev)
    host = statistics.median(bench.host_launch_ms(fn, dev) for _ in range(rounds))
    return {"graph": name, "steps per call": steps, "nodes": nodes, "host us / call": host * 1e3,
            "loop us / call": loop.median * 1e3, "loop p20": loop.p20 * 1e3, "loop p80": loop.p80 * 1e3,
            "loop us / step": loop.median * 1e3 / steps}


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
        def body(n=n):
            for _ in range(n):
                x.add_(1)
        body()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            body()
        rows.append(_measure(f"{n} x add_", g.replay, dev, nodes=_nodes(lambda gg: _cap(gg, body))))

    cfg = study.validate(preset=a.preset, device="cuda")
    s = study.setup(cfg, {"copy_gbps": float("nan")})
    term = s.term(["packed-gather", "contiguous-layout", "triton"])
    fetch = term._fetch  # the Triton launch writing the term's output rows in place
    for _ in range(3):
        fetch()
    torch.cuda.synchronize()
    for pool in (False, True):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, pool=torch.cuda.graph_pool_handle() if pool else None):
            fetch()
        rows.append(_measure(f"triton fetch, bare graph{', private pool' if pool else ''}", g.replay, dev,
                             nodes=_nodes(lambda gg: _cap(gg, fetch))))

    row_term = s.term(["packed-gather", "contiguous-layout", "triton", "cuda-graph"])
    for _ in range(4):
        row_term.fetch()
    rows.append(_measure("notebook 07 row (GraphedCallable via term.fetch)", row_term.fetch, dev))
    rows.append(_measure("GraphedCallable, called directly", row_term._fetch, dev))

    for k in (int(v) for v in a.steps.split(",")):
        def k_steps(k=k):
            for _ in range(k):
                fetch()
                term.episode_times += term.step_dt
        k_steps()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            k_steps()
        rows.append(_measure(f"{k} steps (fetch + advance) in one graph", g.replay, dev, steps=k,
                             nodes=_nodes(lambda gg: _cap(gg, k_steps))))

    df = pd.DataFrame(rows)
    floor = s.bytes_per_step()
    print(f"{torch.cuda.get_device_name(dev)}, torch {torch.__version__}; {a.preset}: {floor / 1e6:.2f} MB per step")
    print(df.to_string(index=False, float_format=lambda v: f"{v:.2f}"))
    if a.out:
        df.to_csv(a.out, index=False)
    return 0


def _cap(g, fn) -> None:
    with torch.cuda.graph(g):
        fn()


if __name__ == "__main__":
    sys.exit(main())
