"""Notebook 02's stored rows as the reports show them: headline, published table and findings."""

from __future__ import annotations

import pandas as pd

from ..rows import Findings, fmt, fmt_spread, fmt_value, latest_runs, md_table, number, row_of

NOTEBOOK = "02_bottleneck_breakdown"


def _top(run: pd.DataFrame, n: int) -> str:
    shares = run[run["metric"].str.startswith("category_share:")].sort_values("value", ascending=False)
    return ", ".join(f"{m.split(':', 1)[1]} {float(v):.0%}" for m, v in zip(shares["metric"][:n], shares["value"][:n]))


def headline(run: pd.DataFrame) -> dict:
    out = {"top categories": _top(run, 3) or "-", "GPU idle": fmt_value(run, "idle_share", "{:.0%}"),
           "kernels / forward": fmt_value(run, "kernels_per_forward", "{:.0f}")}
    g, f = row_of(run, "gemm_tflops"), row_of(run, "gemm_frac_of_ceiling")
    if g is not None:
        out["GEMM TFLOP/s"] = fmt(g["value"]) + (f" ({fmt(f['value'], '{:.0%}')} of ceiling)" if f is not None else "")
    if row_of(run, "profiling_overhead") is not None:
        out["profiling overhead"] = fmt_spread(row_of(run, "profiling_overhead"), "{:+.1%}", " to ")
    return out


def published(df: pd.DataFrame) -> list[str]:
    rows = []
    for r in latest_runs(df, NOTEBOOK):
        def tf(key, r=r):
            a, f = row_of(r, f"{key}_tflops"), row_of(r, f"{key}_frac_of_ceiling")
            return f"{fmt(a['value'], '{:.0f}')} ({fmt(f['value'], '{:.0%}')})" if a is not None else "-"

        rows.append({"workload": r["workload"].iloc[0], "preset": r["preset"].iloc[0],
                     "top categories (GPU time)": _top(r, 5), "GPU idle": fmt_value(r, "idle_share", "{:.0%}"),
                     "kernels / forward": fmt_value(r, "kernels_per_forward", "{:.0f}"),
                     "GEMM TFLOP/s (of ceiling)": tf("gemm"), "attention TFLOP/s (of ceiling)": tf("attention"),
                     "profiling overhead, paired A/B (p20-p80)":
                         fmt_spread(row_of(r, "profiling_overhead"), "{:+.1%}", " to "),
                     "accounted": fmt_value(r, "profiling_overhead_accounted", "{:.2%}")})
    return ["\n**02 · bottleneck breakdown** (bf16, one traced run)\n", md_table(rows)]


def findings(run: pd.DataFrame) -> Findings:
    idle, launches = fmt_value(run, "idle_share", "{:.0%}"), fmt_value(run, "kernels_per_forward", "{:.0f}")
    head = (f"GPU time goes to **{_top(run, 3) or '-'}**"
            + (f"; the GPU idles {idle} of the region" if idle != "-" else "")
            + (f" with {launches} kernel launches per forward" if launches != "-" else "") + ".")
    ov = row_of(run, "profiling_overhead")
    goal = "No target here: this notebook ranks where the time goes for the notebooks that follow."
    if ov is not None:
        lo, hi = number(ov.get("p20")), number(ov.get("p80"))
        goal += (f" Its profiling session costs {fmt_spread(ov, '{:+.1%}', ' to ')} of a run (paired runs, p20 to p80"
                 + ("; a spread that includes zero)." if lo <= 0 <= hi else ")."))
    idle = number(row_of(run, "idle_share")["value"]) if row_of(run, "idle_share") is not None else float("nan")
    if idle == idle and idle > 0.3:
        nxt = ("Next: the GPU waits on the host for much of the time, so launches matter: compile (04) fuses kernels, "
               "CUDA graphs (06) remove the launches.")
        links = [("the suggestions", "#Ranked-suggestions"), ("04 · compile and precision", "04_compile_autocast"),
                 ("06 · CUDA graphs", "06_cuda_graphs")]
    else:
        nxt = "Next: the kernels themselves: precision and compile (04), fused kernels (05)."
        links = [("the suggestions", "#Ranked-suggestions"), ("04 · compile and precision", "04_compile_autocast"),
                 ("05 · Triton kernels", "05_triton_kernels")]
    return Findings(head, goal, nxt, links)
