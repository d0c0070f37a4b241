"""Notebook 06's stored rows as the reports show them: which runs stand for it (its decoder table from the latest run
that has one), headline, published tables, findings and the summary's CUDA-graphs stage (wmbook.studies.graphs
measures; this reads the rows back)."""

from __future__ import annotations

import math

import pandas as pd

from .. import workloads
from ..rows import (
    Findings,
    Stage,
    best_counted,
    device_label,
    fmt,
    fmt_spread,
    fmt_value,
    ladder_stage,
    latest_decoder_run,
    latest_runs,
    md_table,
    metric_row,
    number,
    psnr_clause,
    row_of,
    summary_best,
    workload_of,
)

NOTEBOOK = "06_cuda_graphs"
STAGE = (3, "+ static caches and CUDA graphs (06)")


def runs(df: pd.DataFrame) -> dict[tuple[str, str, str], pd.DataFrame]:
    """The latest run per workload and preset, with the decoder table of the latest run that has one."""
    out = {}
    for r in latest_runs(df, NOTEBOOK):
        key = (NOTEBOOK, r["workload"].iloc[0], r["preset"].iloc[0])
        d = latest_decoder_run(df, *key[1:])
        if d is not None and d["run_id"].iloc[0] != r["run_id"].iloc[0]:
            own = ~r["metric"].str.startswith("decoder_")
            r = pd.concat([r[own], d[d["metric"].str.startswith("decoder_")]])
        if key not in out or r["timestamp"].max() > out[key]["timestamp"].max():
            out[key] = r.drop(columns=["dtype"], errors="ignore")
    return out


def best_of_04_variant(run: pd.DataFrame) -> str | None:
    """The comparison row of notebook 04's best stack alone (its base then holds notebook 05's kernels): the measured
    row whose variants are a strict subset of the first row's."""
    fw = run.loc[run["metric"] == "forward_ms", "variant"].tolist()
    if not fw:
        return None
    base = set(fw[0].split(" + "))
    return next((v for v in fw[1:] if set(v.split(" + ")) < base), None)


def judged(run: pd.DataFrame) -> set | None:
    """The rows whose frames were judged (a stand-in decoder's are not: it is no best row), notebook 04's best stack
    alone left out; None (every row) for a run that judged no frames."""
    seen = set(run.loc[run["metric"] == "psnr_db", "variant"])
    return (seen - {best_of_04_variant(run)}) if seen else None


def _best(run: pd.DataFrame):
    """(best gated row, its summary metric) among the rows whose frames were judged."""
    among = judged(run)
    if among is None:
        among = set(run.loc[run["metric"] == "forward_ms", "variant"]) - {best_of_04_variant(run)}
    return summary_best(run, workload_of(run), among)


def _first_frame(run: pd.DataFrame):
    """The first_frame_ms row with the lowest value among the gated rows whose frames were judged (None without one)."""
    among = judged(run)
    passed = set(run.loc[(run["metric"] == "forward_ms") & (run["gate"] == "pass"), "variant"])
    ff = run[(run["metric"] == "first_frame_ms") & run["variant"].isin(passed & among if among else passed)]
    ff = ff[pd.to_numeric(ff["value"], errors="coerce").notna()]
    return None if ff.empty else ff.loc[pd.to_numeric(ff["value"]).idxmin()]


def _run_speedup(run: pd.DataFrame):
    """(notebook 04's best stack's run_s row, best row's run_s row, speedup) where the run measured the comparison."""
    b04 = best_of_04_variant(run)
    base = row_of(run, "run_s", b04) if b04 else None
    best, _ = _best(run)
    mine = row_of(run, "run_s", best["variant"]) if best is not None else None
    if base is None or mine is None:
        return None
    return base, mine, number(base["value"]) / number(mine["value"])


def headline(run: pd.DataFrame) -> dict:
    best, m = _best(run)
    out = {}
    if best is None:
        return out
    v = best["variant"]
    e2e = metric_row(run, m, v)
    out = {"best row": v.split(" + ")[-1], "forward ms (best row)": fmt_spread(best),
           f"{m.label if m else 'end to end'} (best row)": fmt(e2e["value"] if e2e is not None else None),
           "frames PSNR dB": fmt_value(run, "psnr_db", "{:.1f}", v)}
    busy = row_of(run, "gpu_busy_ms", v)
    if busy is not None:
        out["wall / GPU busy"] = fmt(number(best["value"]) / number(busy["value"]), "{:.2f}")
    out["launches / forward"] = fmt_value(run, "launches_per_forward", "{:.0f}", v)
    rs = _run_speedup(run)
    if rs is not None:
        out["run s, notebook 04's best stack"] = fmt_spread(rs[0])
        out["run s (best row)"] = fmt_spread(rs[1])
        out["run speedup vs notebook 04's best"] = fmt(rs[2], "{:.2f}x")
    dec = best_counted(run, "decoder_ms_per_block")
    if dec is not None:
        out["decoder ms / block (best)"] = fmt_spread(dec, "{:.1f}")
    return out


def _conv_other(run: pd.DataFrame, variant: str) -> str:
    """A decoder row's kernel time in one profiled steady block: convolution / everything else (runs that stored the
    split: decoder_category_ms:*, decoder_gpu_busy_ms)."""
    busy, conv = row_of(run, "decoder_gpu_busy_ms", variant), row_of(run, "decoder_category_ms:convolution", variant)
    if busy is None:
        return "-"
    c = number(conv["value"]) if conv is not None else 0.0
    return f"{fmt(c, '{:.1f}')} / {fmt(number(busy['value']) - c, '{:.1f}')}"


def published(df: pd.DataFrame) -> list[str]:
    """Per workload and preset its latest run, one line per measured row; then its decoder table."""
    e2e_metrics = {w.metric.name: w.metric.label for w in workloads.all_workloads()}
    parts = []
    for r in latest_runs(df, NOTEBOOK):
        rows, prev, base = [], None, None
        measured = r.loc[r["metric"].isin(list(e2e_metrics)), "metric"]  # one column name for every row of the run
        e2e_col = e2e_metrics[measured.iloc[0]] if len(measured) else "end to end"  # (a failed row has no e2e)
        for _, f in r[r["metric"] == "forward_ms"].iterrows():
            v = f["variant"]
            names = v.split(" + ")
            if base is None:
                label, base = "base", names
            elif prev is not None and names[:-1] == prev:
                label = names[-1]  # one variant on top of the row before
            else:  # a comparison row (reduce-overhead, the stand-in decoder): what it adds to the base stack, or
                # (notebook 04's best stack where the base holds notebook 05's kernels) what it leaves out
                label = (" + ".join(n for n in names if n not in base)
                         or "base without " + " + ".join(n for n in base if n not in names))
            prev = names if f.get("gate") != "error" else names[:-1]  # later rows go on without a failed variant
            busy = row_of(r, "gpu_busy_ms", v)
            e2e = r[(r["variant"] == v) & (r["metric"].isin(list(e2e_metrics)))]
            ratio = number(f["value"]) / number(busy["value"]) if busy is not None else math.nan
            rows.append({"row": label, "gate": f.get("gate", ""), "forward ms": fmt_spread(f, "{:.1f}"),
                         "GPU busy ms": fmt(busy["value"] if busy is not None else None, "{:.1f}"),
                         "wall / busy": fmt(ratio, "{:.2f}"),
                         "launches / forward": fmt_value(r, "launches_per_forward", "{:.0f}", v),
                         e2e_col: fmt(e2e["value"].iloc[0], "{:.3g}") if len(e2e) else "-",
                         "first frame ms": fmt_value(r, "first_frame_ms", "{:.0f}", v),
                         "run s": fmt_spread(row_of(r, "run_s", v), "{:.2f}"),
                         "frames PSNR dB": fmt_value(r, "psnr_db", "{:.1f}", v)})
        parts.append(f"\n**06 · static caches and CUDA graphs, {r['workload'].iloc[0]} / {r['preset'].iloc[0]}** "
                     f"({device_label(r)}; base: {r[r['metric'] == 'forward_ms']['variant'].iloc[0]})\n")
        parts.append(md_table(rows))
        # the decoder table: the latest run that has one (a partial run made for it included), named when it is
        # not the run of the table above
        drun = latest_decoder_run(df, r["workload"].iloc[0], r["preset"].iloc[0])
        dec, src = r.iloc[:0], ""
        if drun is not None:
            if drun["run_id"].iloc[0] != r["run_id"].iloc[0]:
                when = "an earlier" if drun["timestamp"].max() < r["timestamp"].max() else "a later"
                src = f"; from {when} run, {drun['run_id'].iloc[0]}: {device_label(drun)}"
            r = drun
            dec = r[r["metric"] == "decoder_ms_per_block"]
        if len(dec):
            drows = [{"decoder": d["variant"].removeprefix("decoder: "), "gate": d.get("gate", ""),
                      "ms / block": fmt_spread(d, "{:.1f}"),
                      "PSNR dB vs fp32": fmt_value(r, "decoder_psnr_db", "{:.1f}", d["variant"]),
                      "first pass s": fmt_value(r, "decoder_first_pass_s", "{:.1f}", d["variant"]),
                      "GPU ms: convolution / other": _conv_other(r, d["variant"])}
                     for _, d in dec.iterrows()]
            parts.append(f"\n**06 · the decoder, {r['workload'].iloc[0]} / {r['preset'].iloc[0]}** (the "
                         f"reference's latents decoded by each stack; ms per "
                         f"{workloads.get(r['workload'].iloc[0]).decoder_unit}{src})\n")
            parts.append(md_table(drows))
    return parts


def findings(run: pd.DataFrame) -> Findings:
    wl = workload_of(run)
    best, m = _best(run)
    if best is None:
        return Findings("No gated row in this run.", "No goal is judged by this run.", "",
                        [("05 · Triton kernels", "05_triton_kernels")])
    v = best["variant"]
    e2e = metric_row(run, m, v)
    first = run[run["metric"] == "forward_ms"].iloc[0]
    busy = row_of(run, "gpu_busy_ms", v)
    head = (f"Best gated row **{'+ ' + v.split(' + ')[-1] if v != first['variant'] else 'base'}**: "
            f"{m.label if m else 'end to end'} **{fmt(e2e['value'] if e2e is not None else None)}**, one forward "
            f"{fmt_spread(best)} ms"
            + (f" at {number(best['value']) / number(busy['value']):.2f}x its GPU busy time"
               if busy is not None else "")
            + (f", {launches} launches" if (launches := fmt_value(run, "launches_per_forward", "{:.0f}", v)) != "-"
               else "") + psnr_clause(run, v) + ".")
    goals = []
    fps_goal = wl.goals.get("fps")
    if fps_goal and m == wl.metric and m.higher_is_better and e2e is not None:
        ok = number(e2e["value"]) >= fps_goal
        goals.append(f"{fps_goal:.0f} {wl.metric.label} with the full decoder: **{'met' if ok else 'missed'}** "
                     f"({number(e2e['value']):.3g})")
    ff = _first_frame(run)
    if ff is not None:
        head += (f" The earliest first frame of a fresh stream: **{number(ff['value']):.0f} ms** "
                 f"(+ {ff['variant'].split(' + ')[-1]}).")
        if (ff_goal := wl.goals.get("first_frame_ms")) is not None:
            goals.append(f"first frame within {ff_goal:.0f} ms: "
                         f"**{'met' if number(ff['value']) <= ff_goal else 'missed'}** ({number(ff['value']):.0f} ms)")
    rs, run_goal = _run_speedup(run), wl.goals.get("run_speedup")
    if run_goal and rs is not None:
        goals.append(f"the whole run {run_goal:g}x faster than notebook 04's best stack: "
                     f"**{'met' if rs[2] >= run_goal else 'missed'}** ({rs[2]:.2f}x, {fmt_spread(rs[1])} s against "
                     f"{fmt_spread(rs[0])} s)")
    goal = ("Goals: " + "; ".join(goals) + ".") if goals else "No goal of this workload is judged by this run."
    return Findings(head, goal, "Read the ladder (wall against GPU busy time per row) and the decoder table; fewer "
                    "denoising steps on this stack are notebook 03's question.",
                    [("the rows", "#The-rows"), ("the decoder", "#The-decoder"),
                     ("03 · step reduction", "03_step_reduction")])


def stage(run: pd.DataFrame, wl) -> Stage | None:
    return ladder_stage(run, wl, STAGE[1], NOTEBOOK, judged(run))
