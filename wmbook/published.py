"""The README's published GPU numbers, rendered from the results store (never typed by hand).

    python -m wmbook.published            # print the markdown
    python -m wmbook.published --write    # replace the block between the markers in README.md

For each notebook, workload, preset and dtype the latest run in data/results/results.csv is shown.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import pandas as pd

from . import results
from .paths import REPO_ROOT

BEGIN, END = "<!-- published:begin (python -m wmbook.published --write) -->", "<!-- published:end -->"


def _latest_runs(df: pd.DataFrame, notebook: str) -> list[pd.DataFrame]:
    d = df[(df["notebook"] == notebook) & (df["device_kind"] == "cuda")].copy()
    if not len(d):
        return []
    d["dtype"] = [json.loads(p).get("dtype", "") if p else "" for p in d["params"]]
    last = d.sort_values("timestamp").groupby(["workload", "preset", "dtype"])["run_id"].last()
    return [d[d["run_id"] == r] for r in last.tolist()]


def _v(run: pd.DataFrame, metric: str, variant: str | None = None):
    r = run[run["metric"] == metric]
    if variant is not None:
        r = r[r["variant"] == variant]
    return r.iloc[-1] if len(r) else None


def _val(run: pd.DataFrame, metric: str, fmt="{:.3g}", variant: str | None = None) -> str:
    """The formatted value of one metric of a run, '-' when the run has none."""
    r = _v(run, metric, variant)
    return "-" if r is None else _num(r["value"], fmt)


def _num(x, fmt="{:.3g}") -> str:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "-"
    if math.isnan(x):
        return "-"
    if math.isinf(x):
        return "inf"
    return fmt.format(x)


def _spread(row, fmt="{:.3g}", sep="-") -> str:
    if row is None:
        return "-"
    s = _num(row["value"], fmt)
    if _num(row.get("p20")) != "-":
        s += f" ({_num(row['p20'], fmt)}{sep}{_num(row['p80'], fmt)})"
    return s


def _device(run: pd.DataFrame) -> str:
    r = run.iloc[0]
    return f"{r['device_name']}, torch {r['torch']}, commit {r['git_commit'] or '?'}"


def _table(rows: list[dict]) -> str:
    if not rows:
        return "_no GPU rows yet_\n"
    cols = list(rows[0])
    out = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    out += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(out) + "\n"


def _baseline_row(run: pd.DataFrame, columns) -> dict:
    """One row of a workload's notebook-01 table (wmbook.workloads.Workload.published_columns)."""
    row = {"preset": run["preset"].iloc[0], "dtype": run["dtype"].iloc[0]}
    for header, metric, fmt, spread in columns:
        row[header] = _spread(_v(run, metric), fmt) if spread else _val(run, metric, fmt)
    return row | {"device": _device(run)}


def markdown(path=None) -> str:
    """All published tables as markdown."""
    from . import workloads

    df = results.read(path or results.default_path())
    parts = []
    runs = _latest_runs(df, "01_baseline_profiling")
    for i, wl in enumerate([w for w in workloads.all_workloads() if w.published_columns]):  # those with notebook 01
        parts.append(("\n" if i else "") + f"**01 · baseline, {wl.published_title}\n")
        parts.append(_table([_baseline_row(r, wl.published_columns) for r in runs
                             if r["workload"].iloc[0] == wl.name]))
    rows = []
    for r in _latest_runs(df, "02_bottleneck_breakdown"):
        shares = r[r["metric"].str.startswith("category_share:")].sort_values("value", ascending=False)
        top = ", ".join(f"{m.split(':', 1)[1]} {float(v):.0%}" for m, v in zip(shares["metric"][:5], shares["value"][:5]))

        def tf(key):
            a, f = _v(r, f"{key}_tflops"), _v(r, f"{key}_frac_of_ceiling")
            return f"{_num(a['value'], '{:.0f}')} ({_num(f['value'], '{:.0%}')})" if a is not None else "-"

        rows.append({"workload": r["workload"].iloc[0], "preset": r["preset"].iloc[0], "top categories (GPU time)": top,
                     "GPU idle": _val(r, "idle_share", "{:.0%}"),
                     "kernels / forward": _val(r, "kernels_per_forward", "{:.0f}"),
                     "GEMM TFLOP/s (of ceiling)": tf("gemm"), "attention TFLOP/s (of ceiling)": tf("attention"),
                     "profiling overhead, paired A/B (p20-p80)": _spread(_v(r, "profiling_overhead"), "{:+.1%}", " to "),
                     "accounted": _val(r, "profiling_overhead_accounted", "{:.2%}")})
    parts.append("\n**02 · bottleneck breakdown** (bf16, one traced run)\n")
    parts.append(_table(rows))
    parts += _compile_autocast(df, {wl.metric.name for wl in workloads.all_workloads()})
    parts += _cuda_graphs(df, {wl.metric.name: wl.metric.label for wl in workloads.all_workloads()})
    parts += _triton_kernels(df)
    parts += _motion_loading(df)
    return "".join(parts)


def _triton_kernels(df: pd.DataFrame) -> list[str]:
    """Notebook 05: per workload and preset its latest run's kernel table (GB/s of eager, torch.compile and the fused
    kernel at each call site; the kernel's time with its spread)."""
    parts = []
    for r in _latest_runs(df, "05_triton_kernels"):
        fused = r[r["metric"] == "fused_us"]
        if not len(fused):
            continue
        rows = [{"call site": f["variant"].removeprefix("kernel:"), "gate": f.get("gate", ""),
                 "fused us": _spread(f, "{:.1f}"),
                 **{f"{i} GB/s": _val(r, f"{i}_gbps", "{:,.0f}", f["variant"]) for i in ("eager", "compile", "fused")}}
                for _, f in fused.iterrows()]
        parts.append(f"\n**05 · fused Triton kernels, {r['workload'].iloc[0]} / {r['preset'].iloc[0]}** ({_device(r)}; "
                     f"do_bench with the L2 flushed, median (p20-p80); GB/s of the bytes the op must move)\n")
        parts.append(_table(rows))
    return parts


def _motion_loading(df: pd.DataFrame) -> list[str]:
    """Notebook 07: per preset its latest run, the ladder and the scaling points (us per step)."""
    def us(row, fmt="{:.1f}", spread=False):
        if row is None:
            return "-"
        row = row.copy()
        for c in ("value", "p20", "p80"):
            row[c] = float(row[c]) * 1e3 if c in row and row[c] == row[c] else row.get(c)
        return _spread(row, fmt) if spread else _num(row["value"], fmt)

    parts = []
    for r in _latest_runs(df, "07_motion_data_loading"):
        rows = [{"ladder row": v, "gate": f.get("gate", ""), "fetch us": us(f, spread=True),
                 "speedup": _val(r, "speedup", "{:.1f}x", v), "x bytes floor": _val(r, "x_bytes_floor", "{:.1f}", v),
                 "GPU busy us": us(_v(r, "gpu_busy_ms", v)),
                 "launches / step": _val(r, "launches_per_fetch", "{:.0f}", v)}
                for v, f in ((f["variant"], f) for _, f in r[r["metric"] == "fetch_ms"].iterrows())]
        parts.append(f"\n**07 · motion-data loading, {r['preset'].iloc[0]}** ({_device(r)}; bytes floor "
                     f"{us(_v(r, 'bytes_floor_ms'))} us for {_val(r, 'bytes_per_step', '{:.3g}')} bytes per step at "
                     f"the measured {_val(r, 'copy_gbps', '{:.0f}')} GB/s)\n")
        parts.append(_table(rows))
        sc = r[r["metric"] == "scaling_fetch_ms"].assign(n=lambda d: d["num_envs"].astype(float).astype(int))
        if len(sc):
            srows = [{"stack": v, **{f"{n} robots, us": us(g[g["n"] == n].iloc[0]) if (g["n"] == n).any() else "-"
                                     for n in sorted(set(sc["n"]))}} for v, g in sc.groupby("variant", sort=False)]
            parts.append("\n**07 · scaling** (us per step, by robots)\n")
            parts.append(_table(srows))
    return parts


def _cuda_graphs(df: pd.DataFrame, e2e_metrics: dict) -> list[str]:
    """Notebook 06: per workload and preset its latest run, one line per measured row."""
    parts = []
    for r in _latest_runs(df, "06_cuda_graphs"):
        rows = []
        for _, f in r[r["metric"] == "forward_ms"].iterrows():
            v = f["variant"]
            busy = _v(r, "gpu_busy_ms", v)
            e2e = r[(r["variant"] == v) & (r["metric"].isin(list(e2e_metrics)))]
            ratio = float(f["value"]) / float(busy["value"]) if busy is not None else math.nan
            rows.append({"row (base = notebook 04's best stack)": v.split(" + ")[-1] if len(rows) else "base",
                         "gate": f.get("gate", ""), "forward ms": _spread(f, "{:.1f}"),
                         "GPU busy ms": _num(busy["value"] if busy is not None else None, "{:.1f}"),
                         "wall / busy": _num(ratio, "{:.2f}"),
                         "launches / forward": _val(r, "launches_per_forward", "{:.0f}", v),
                         (e2e_metrics.get(e2e["metric"].iloc[0]) if len(e2e) else "end to end"):
                             _num(e2e["value"].iloc[0], "{:.3g}") if len(e2e) else "-",
                         "first frame ms": _val(r, "first_frame_ms", "{:.0f}", v),
                         "run s": _val(r, "run_s", "{:.2f}", v),
                         "frames PSNR dB": _val(r, "psnr_db", "{:.1f}", v)})
        parts.append(f"\n**06 · static caches and CUDA graphs, {r['workload'].iloc[0]} / {r['preset'].iloc[0]}** "
                     f"({_device(r)}; base: {r[r['metric'] == 'forward_ms']['variant'].iloc[0]})\n")
        parts.append(_table(rows))
        dec = r[r["metric"] == "decoder_ms_per_block"]
        if len(dec):
            drows = [{"decoder": d["variant"].removeprefix("decoder: "), "gate": d.get("gate", ""),
                      "ms / block": _spread(d, "{:.1f}"),
                      "PSNR dB vs fp32": _val(r, "decoder_psnr_db", "{:.1f}", d["variant"]),
                      "first pass s": _val(r, "decoder_first_pass_s", "{:.1f}", d["variant"])}
                     for _, d in dec.iterrows()]
            parts.append(f"\n**06 · the streaming decoder, {r['workload'].iloc[0]} / {r['preset'].iloc[0]}** (the "
                         f"reference's latents decoded by each stack; ms per steady block of 12 pixel frames)\n")
            parts.append(_table(drows))
    return parts


def _compile_autocast(df: pd.DataFrame, e2e_metrics: set[str]) -> list[str]:
    """Notebook 04 is often run in parts (sections=...): per workload and preset the latest run that has a
    ladder, and for each compile configuration its latest measurement, whichever run it came from."""
    d = df[(df["notebook"] == "04_compile_autocast") & (df["device_kind"] == "cuda")]
    parts = []
    for (wl, preset), g in d.groupby(["workload", "preset"], sort=False):
        ladders = g[g["metric"] == "forward_ms"]
        if len(ladders):
            r = g[g["run_id"] == ladders.sort_values("timestamp")["run_id"].iloc[-1]]
            rows = []
            for _, f in r[r["metric"] == "forward_ms"].iterrows():
                v = f["variant"]
                e2e = r[(r["variant"] == v) & (r["metric"].isin(e2e_metrics))]
                rows.append({"ladder row": v, "gate (as recorded)": f.get("gate", ""),
                             "rel-L2 vs fp32": _num(f.get("rel_l2_vs_fp32"), "{:.4f}"),
                             "forward ms": _spread(f, "{:.1f}"),
                             "speedup": _val(r, "speedup", "{:.2f}x", v),
                             "x floor": _val(r, "x_floor", "{:.1f}", v),
                             "GPU busy ms": _val(r, "gpu_busy_ms", "{:.1f}", v),
                             (e2e["metric"].iloc[0] if len(e2e) else "end to end"):
                                 _num(e2e["value"].iloc[0], "{:.3g}") if len(e2e) else "-",
                             "frames PSNR dB": _val(r, "psnr_db", "{:.1f}", v)})
            parts.append(f"\n**04 · ladder, {wl} / {preset}** ({_device(r)})\n")
            parts.append(_table(rows))
        comp = g[g["variant"].str.startswith("compile:")]
        crow = []
        for v, c in comp.groupby("variant", sort=False):
            c = c[c["run_id"] == c.sort_values("timestamp")["run_id"].iloc[-1]]
            m = {r["metric"]: r for _, r in c.iterrows()}
            val = {k: r["value"] for k, r in m.items()}
            crow.append({"compile": v.split(":", 1)[1], "cold s": _num(val.get("cold_s"), "{:.1f}"),
                         "warm s": _num(val.get("warm_s"), "{:.1f}"),
                         "steady forward ms": _spread(m.get("steady_forward_ms"), "{:.1f}"),
                         "x floor": _num(val.get("x_floor"), "{:.1f}"),
                         "GPU busy ms": _num(val.get("gpu_busy_ms"), "{:.1f}"),
                         "graph breaks": _num(val.get("graph_breaks"), "{:.0f}"),
                         "recompiles, steady run": _num(val.get("steady_run_recompiles"), "{:.0f}"),
                         "commit": c["git_commit"].iloc[0] or "?", "measured (UTC)": str(c["timestamp"].iloc[0])[:16]})
        if crow:
            parts.append(f"\n**04 · compile, {wl} / {preset}** (latest measurement of each configuration; rows "
                         f"measured at different times may come from different machines of the same kind: compare "
                         f"times within one run)\n")
            parts.append(_table(crow))
    return parts


def update_readme(readme=None, path=None) -> bool:
    """Replace the published block of README.md; True when it changed."""
    readme = Path(readme or REPO_ROOT / "README.md")
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{readme} has no published block ({BEGIN} ... {END})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{markdown(path)}{END}{tail}"
    if new != text:
        from .atomic import atomic_open

        with atomic_open(readme, "w") as f:
            f.write(new)
    return new != text


def readme_block(readme=None) -> str:
    text = Path(readme or REPO_ROOT / "README.md").read_text()
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wmbook.published", description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="update README.md in place")
    a = ap.parse_args(argv)
    if a.write:
        print("README.md updated" if update_readme() else "README.md already up to date")
    else:
        sys.stdout.write(markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
