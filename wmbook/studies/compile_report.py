"""Notebook 04's figures, results rows and interpretation (wmbook.studies.compile measures; this reports), and its
stored rows as the reports show them: which runs stand for it, headline, published tables, findings and the
summary's compile-and-precision stage."""

from __future__ import annotations

import math
import re

import pandas as pd

from .. import results as results_store
from .. import workloads
from ..display import num
from ..rows import (
    Findings,
    Stage,
    device_label,
    fmt,
    fmt_spread,
    fmt_value,
    gate_of,
    ladder_stage,
    md_table,
    number,
    psnr_clause,
    row_of,
    summary_best,
    workload_of,
)

NOTEBOOK = "04_compile_autocast"
STAGE = (1, "+ precision and compile (04)")

RECOMPILES_GOAL = 0  # zero recompiles across a steady end-to-end run


def plot_forward_vs_floor(ladder, ax=None):
    """Time per forward of each ladder row against the FLOP floor (measured GEMM ceiling)."""
    import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

    t = ladder.table()
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.45 * len(t) + 1))
    ok = t["gate"].isin(["pass", "reference"])
    ax.barh(t["variant"][::-1], t["forward_ms"][::-1], xerr=[(t["forward_ms"] - t["forward_p20"])[::-1],
                                                            (t["forward_p80"] - t["forward_ms"])[::-1]],
            color=["#4477aa" if o else "#cccccc" for o in ok[::-1]], capsize=2)
    goal = ladder.workload.goals.get("forward_x_floor")
    if ladder.floor_ms == ladder.floor_ms:
        ax.axvline(ladder.floor_ms, color="k", ls="--", lw=1, label=f"FLOP floor {ladder.floor_ms:.3g} ms")
        if goal:
            ax.axvline(goal * ladder.floor_ms, color="#ee6677", ls=":", lw=1, label=f"target: {goal}x the floor")
        ax.legend(fontsize=7)
    ax.set_xscale("log")
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter  # noqa: PLC0415  heavy: matplotlib

    ax.xaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))  # labels at 1-2-5: a short range has several
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: num(v, 2)))
    ax.xaxis.set_minor_formatter(NullFormatter())  # labelled minor ticks overlapped on a short log axis
    ax.set_xlabel("ms per forward (median, p20-p80 bars; log scale)")
    ax.set_title("Time per forward vs FLOP floor")
    return ax


def plot_compile_times(df: pd.DataFrame, goal_s: float | None = None, ax=None):
    """Cold and warm compile time of each configuration of the compile table."""
    import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

    d = df.dropna(subset=["cold_s"]) if "cold_s" in df else df.iloc[0:0]
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.5 * max(len(d), 1) + 1))
    y = range(len(d))
    ax.barh([i + 0.2 for i in y], d["cold_s"], height=0.4, label="cold (empty cache)", color="#ee6677")
    ax.barh([i - 0.2 for i in y], d["warm_s"], height=0.4, label="warm (on-disk cache)", color="#66ccee")
    ax.set_yticks(list(y), d["config"])
    if goal_s:
        ax.axvline(goal_s, color="k", ls=":", lw=1, label=f"target: {goal_s:.0f} s cold")
    ax.set_xlabel("compile time: first call, s")
    ax.set_title("Compile time")
    ax.legend(fontsize=7)
    return ax


_LADDER_METRICS = (("speedup", "x"), ("x_floor", "x"), ("gpu_busy_ms", "ms"), ("busy_x_floor", "x"),
                   ("e2e_value", None), ("psnr_db", "dB"), ("peak_memory_gib", "GiB"), ("first_call_s", "s"),
                   ("recompiles", "count"))
_COMPILE_METRICS = (("cold_s", "s"), ("warm_s", "s"), ("steady_forward_ms", "ms"), ("x_floor", "x"),
                    ("gpu_busy_ms", "ms"), ("busy_x_floor", "x"), ("steady_run_recompiles", "count"),
                    ("graph_breaks", "count"))


def _finite(v) -> bool:
    return v is not None and not (isinstance(v, float) and math.isnan(v))


def result_rows(cfg, ladder=None, compile_df=None, attention_best=None) -> list[dict]:
    """The ladder rows (forward time with its spread, speedups, floors, end-to-end metric, PSNR, ...), the compile
    table and the winning attention backend, as results rows."""
    common = dict(notebook=cfg.notebook, workload=cfg.workload.name, preset=cfg.preset.name, params=cfg.params(),
                  warmup=cfg.warmup, repeats=cfg.repeats)
    rows = []
    if ladder is not None:
        for _, r in ladder.table().iterrows():
            v = r["stack"] if r["stack"] != "-" else "fp32-eager"
            extra = dict(gate=r["gate"], rel_l2_vs_fp32=r["rel_l2_vs_fp32"])
            failed = r["gate"] == "error"  # a row that failed to apply, compile or run: no time, the error noted
            rows.append(results_store.make_row(metric="forward_ms", value=r["forward_ms"], unit="ms", variant=v,
                                               **common, **extra, **({"note": r["note"]} if failed else {}))
                        | {"p20": r["forward_p20"], "p80": r["forward_p80"], "median": r["forward_ms"],
                           "n": 0 if failed else cfg.repeats})
            for m, unit in _LADDER_METRICS:
                if _finite(r[m]):
                    name, unit = (r["e2e_metric"], cfg.workload.metric.unit) if m == "e2e_value" else (m, unit)
                    rows.append(results_store.make_row(metric=name, value=float(r[m]), unit=unit, variant=v,
                                                       **common, **extra))
    if compile_df is not None and len(compile_df) and "cold_s" in compile_df:
        for _, r in compile_df.dropna(subset=["cold_s"]).iterrows():
            v = f"compile:{r['config']}"
            for m, unit in _COMPILE_METRICS:
                if _finite(r.get(m)):
                    spread = ({"median": r[m], "p20": r["steady_p20"], "p80": r["steady_p80"], "n": cfg.repeats}
                              if m == "steady_forward_ms" else {})
                    rows.append(results_store.make_row(metric=m, value=float(r[m]), unit=unit, variant=v, **common)
                                | spread)
    if attention_best:
        rows.append(results_store.make_row(metric="attention_best_backend", value=float("nan"), unit=attention_best,
                                           variant="attention", **common))
    return rows


def guard_groups(recompiles: pd.DataFrame, top: int = 12) -> pd.DataFrame:
    """The failed guards of a run's recompiles grouped by their shape (numbers folded to N, the guard's source comment
    dropped), most frequent first: count, the functions that recompiled, one example. A run that recompiles per block
    gives one group per kind of guard instead of one row per block."""
    g = recompiles.assign(
        shape=recompiles["guard"].astype(str).str.replace(r"\s+#.*$", "", regex=True)
        .map(lambda t: re.sub(r"\d+", "N", t)).str.slice(0, 120))
    out = g.groupby("shape", sort=False).agg(
        count=("guard", "size"), functions=("function", lambda f: ", ".join(sorted(set(map(str, f)))[:3])),
        example=("guard", "first"))
    out = out.sort_values("count", ascending=False).head(top)
    out["example"] = out["example"].astype(str).str.replace(r"\s+#.*$", "", regex=True).str.slice(0, 120)
    return out.rename_axis("guard (numbers as N)")


def _verdict(ok: bool) -> str:
    return "met" if ok else "missed"


def _ladder_lines(cfg, ladder) -> list[str]:
    wl = cfg.workload
    t = ladder.table()
    last_ok = t[t["gate"].isin(["pass", "reference"])].iloc[-1]
    failed = t[t["gate"] == "FAIL"]["variant"].tolist()
    lines = [f"The ladder takes one {wl.forward_name} from {t['forward_ms'].iloc[0]:.3g} ms (fp32 eager) to "
             f"{last_ok['forward_ms']:.3g} ms with `{last_ok['stack']}`, {last_ok['speedup']:.2f}x, every counted row "
             "within its correctness gate"
             + (f"; rows that failed it (not counted): {failed}" if failed else "") + "."]
    goal = wl.goals.get("forward_x_floor")
    if last_ok["x_floor"] == last_ok["x_floor"]:
        busy = last_ok.get("gpu_busy_ms", float("nan"))
        lines.append(f"That is {last_ok['x_floor']:.2f}x the FLOP floor of {ladder.floor_ms:.3g} ms"
                     + (f" (goal {goal}x: {_verdict(last_ok['x_floor'] <= goal)})" if goal else "")
                     + (f"; its kernels alone keep the GPU busy {busy:.3g} ms ({last_ok['busy_x_floor']:.2f}x)"
                        if busy == busy else "") + ".")
    best = t.loc[t["speedup"].idxmax()] if t["speedup"].notna().any() else None
    if best is not None and best.name != last_ok.name:
        lines.append(f"The fastest counted forward is row {best.name} (`{best['stack']}`): {best['forward_ms']:.3g} "
                     f"ms, {best['speedup']:.2f}x; later rows are slower, so they do not pay off at this shape.")
    e2e = t["e2e_speedup"].dropna()
    if len(e2e) > 1:
        top = t.loc[e2e.idxmax()]
        line = (f"End to end ({wl.metric.label}): {e2e.iloc[-1]:.2f}x over fp32 eager for the last row")
        if e2e.idxmax() != e2e.index[-1]:
            line += f", {e2e.max():.2f}x at best (row {top.name}, `{top['stack']}`)"
        step_goal = wl.goals.get("ddim_step_speedup")
        if step_goal:
            line += f"; the goal of {step_goal}x is {_verdict(e2e.max() >= step_goal)}"
        lines.append(line + ". End-to-end numbers are medians of few runs: see the table for the forward spread.")
    psnr = last_ok["psnr_db"]
    if psnr == psnr and not math.isinf(psnr):
        lines.append(f"Decoded frames of that row are {psnr:.1f} dB PSNR from the fp32 reference's.")
    return lines


def _compile_lines(cfg, compile_df) -> list[str]:
    wl = cfg.workload
    c = compile_df.set_index("config")
    lines = []
    if "regional, reference code" in c.index:
        r0 = c.loc["regional, reference code"]
        lines.append(f"Compiling the reference code regionally gives {int(r0['graph_breaks'] or 0)} graph breaks and "
                     f"{int(r0['warmup_run_recompiles'])} recompiles in its first end-to-end run "
                     f"({int(r0['steady_run_recompiles'])} in the next).")
    if "regional, after hygiene" in c.index:
        r1 = c.loc["regional, after hygiene"]
        cold_goal = wl.goals.get("regional_cold_s")
        lines.append(f"After the hygiene variants (no host reads, no Python ints or lazily filled caches inside a "
                     f"block): {int(r1['graph_breaks'] or 0)} graph breaks, {int(r1['warmup_run_recompiles'])} "
                     f"recompiles while the first run warms its shapes and {int(r1['steady_run_recompiles'])} across "
                     f"the next {r1['e2e_run']} (goal: {RECOMPILES_GOAL}); cold compile {r1['cold_s']:.1f} s, warm "
                     + (f"{r1['warm_s']:.1f} s" if _finite(r1["warm_s"]) else "not measured (only inductor keeps an "
                        "on-disk cache)")
                     + (f" (goal under {cold_goal:.0f} s cold: {_verdict(r1['cold_s'] < cold_goal)})" if cold_goal
                        else "") + ".")
    if "x_floor" in c and c["x_floor"].notna().any():
        b = c.loc[c["x_floor"].idxmin()]
        goal = wl.goals.get("forward_x_floor")
        lines.append(f"The fastest compiled forward is `{b.name}` at {b['steady_forward_ms']:.3g} ms "
                     f"(p20-p80 {b['steady_p20']:.3g}-{b['steady_p80']:.3g}), {b['x_floor']:.2f}x the FLOP floor"
                     + (f" (goal {goal}x: {_verdict(b['x_floor'] <= goal)})" if goal else "")
                     + (f"; its kernels alone keep the GPU busy {b['gpu_busy_ms']:.3g} ms "
                        f"({b['busy_x_floor']:.2f}x the floor), the remaining "
                        f"{max(0.0, 1 - b['gpu_busy_ms'] / b['steady_forward_ms']):.0%} of the wall time is host "
                        f"and launch overhead that CUDA graphs (notebook 06) target"
                        if b["gpu_busy_ms"] == b["gpu_busy_ms"] else "") + ".")
    if "whole model" in c.index and "regional, after hygiene" in c.index:
        w, r1 = c.loc["whole model"], c.loc["regional, after hygiene"]
        if w["cold_s"] == w["cold_s"]:
            lines.append(f"Whole-model compile takes {w['cold_s']:.1f} s cold vs {r1['cold_s']:.1f} s regional, "
                         f"for a steady forward of {w['steady_forward_ms']:.3g} vs {r1['steady_forward_ms']:.3g} ms.")
    return lines


def interpret(cfg, ladder=None, compile_df=None, vae=None, hygiene=None) -> str:
    """Sentences computed from the measurements, checked against the workload's goals."""
    from ..variants.tables import casts  # noqa: PLC0415  heavy: wmbook.variants (triton); reports stay light

    lines = [*_ladder_lines(cfg, ladder), *ladder.failures()] if ladder is not None else []
    if compile_df is not None and len(compile_df) and "cold_s" in compile_df:
        lines += _compile_lines(cfg, compile_df)
    if vae is not None and len(vae):
        v = vae[~vae["channels_last"]].set_index("vae_dtype")
        worst = v["psnr_db"].replace(math.inf, float("nan")).idxmin() if len(v) > 1 else None
        if worst is not None and worst == worst:
            lines.append(f"The VAE in {worst} decodes at {v.loc[worst, 'psnr_db']:.1f} dB PSNR against fp32 "
                         f"({v.loc[worst, 'ms_per_frame']:.3g} vs {v.loc['fp32', 'ms_per_frame']:.3g} ms per frame).")
    if hygiene is not None and len(hygiene) >= 2:
        a, b = hygiene.iloc[0], hygiene.iloc[-1]
        reads = "host reads (aten::_local_scalar_dense)"
        lines.append(f"The hygiene variants take a forward from {casts(a)} to {casts(b)} cast/copy ops and from "
                     f"{int(a[reads])} to {int(b[reads])} host reads.")
    if cfg.tiny:
        lines.append(f"Tiny-preset CPU numbers (compile backend {cfg.options.compile_backend}): they check the "
                     f"transforms and the gate, not the speed of the real model.")
    return " ".join(lines)


# --- the stored rows: which runs stand for the notebook, its tables, headline and findings --------------------------


def runs(df: pd.DataFrame) -> dict[tuple[str, str, str], pd.DataFrame]:
    """Notebook 04 is often run in parts (sections=...): per workload and preset the latest run with a ladder plus each
    compile configuration's latest measurement, whichever run it came from."""
    d = df[(df["notebook"] == NOTEBOOK) & (df["device_kind"] == "cuda")]
    out = {}
    for (wl, preset), g in d.groupby(["workload", "preset"], sort=False):
        parts = []
        ladders = g[g["metric"] == "forward_ms"]
        if len(ladders):
            parts.append(g[g["run_id"] == ladders.sort_values("timestamp")["run_id"].iloc[-1]])
        for _, c in g[g["variant"].str.startswith("compile:")].groupby("variant", sort=False):
            parts.append(c[c["run_id"] == c.sort_values("timestamp")["run_id"].iloc[-1]])
        if parts:
            out[(NOTEBOOK, wl, preset)] = pd.concat(parts).drop_duplicates()
    return out


def best_row(run: pd.DataFrame):
    """The gated ladder row the workload's summary metric ranks best (rows.summary_best)."""
    return summary_best(run, workload_of(run))[0]


def headline(run: pd.DataFrame) -> dict:
    wl = workload_of(run)
    first, best = row_of(run[run["variant"] == "fp32-eager"], "forward_ms"), best_row(run)
    out = {}
    if best is not None and first is not None:
        v = best["variant"]
        out = {"forward ms (fp32 eager)": fmt_spread(first), "forward ms (best row)": fmt_spread(best),
               "best row": "+ " + v.split(" + ")[-1] if " + " in v else v,
               "speedup vs fp32 eager": fmt(number(first["value"]) / number(best["value"]), "{:.2f}x"),
               "x FLOP floor": fmt_value(run, "x_floor", "{:.1f}", v),
               wl.metric.label: fmt_value(run, wl.metric.name, "{:.3g}", v),
               "frames PSNR dB": fmt_value(run, "psnr_db", "{:.1f}", v)}
        failed = run[(run["metric"] == "forward_ms") & (gate_of(run) == "FAIL")]
        if len(failed):
            out["rows failing the gate"] = str(len(failed))
    comp = run[run["metric"] == "steady_forward_ms"]
    if len(comp):
        b = comp.loc[pd.to_numeric(comp["value"], errors="coerce").idxmin()]
        out["fastest compile"] = f"{b['variant'].removeprefix('compile:')}: {fmt_spread(b)} ms"
    cold = row_of(run, "cold_s", "compile:regional, after hygiene")
    if cold is not None:
        out["regional compile, cold s"] = fmt(cold["value"], "{:.1f}")
    return out


def published(df: pd.DataFrame) -> list[str]:
    parts = []
    e2e_metrics = {w.metric.name for w in _all_workloads()}
    for (_, wl, preset), g in runs(results_store.without_cut(df)).items():
        ladder = g[g["metric"] == "forward_ms"]
        if len(ladder):
            r = g[g["run_id"] == ladder["run_id"].iloc[0]]
            rows = []
            for _, f in r[r["metric"] == "forward_ms"].iterrows():
                v = f["variant"]
                e2e = r[(r["variant"] == v) & (r["metric"].isin(e2e_metrics))]
                rows.append({"ladder row": v, "gate (as recorded)": f.get("gate", ""),
                             "rel-L2 vs fp32": fmt(f.get("rel_l2_vs_fp32"), "{:.4f}"),
                             "forward ms": fmt_spread(f, "{:.1f}"), "speedup": fmt_value(r, "speedup", "{:.2f}x", v),
                             "x floor": fmt_value(r, "x_floor", "{:.1f}", v),
                             "GPU busy ms": fmt_value(r, "gpu_busy_ms", "{:.1f}", v),
                             (e2e["metric"].iloc[0] if len(e2e) else "end to end"):
                                 fmt(e2e["value"].iloc[0], "{:.3g}") if len(e2e) else "-",
                             "frames PSNR dB": fmt_value(r, "psnr_db", "{:.1f}", v)})
            parts.append(f"\n**04 · ladder, {wl} / {preset}** ({device_label(r)})\n")
            parts.append(md_table(rows))
        crow = []
        for v, c in g[g["variant"].str.startswith("compile:")].groupby("variant", sort=False):
            c = c[c["run_id"] == c.sort_values("timestamp")["run_id"].iloc[-1]]
            m = {x["metric"]: x for _, x in c.iterrows()}
            val = {k: x["value"] for k, x in m.items()}
            crow.append({"compile": v.split(":", 1)[1], "cold s": fmt(val.get("cold_s"), "{:.1f}"),
                         "warm s": fmt(val.get("warm_s"), "{:.1f}"),
                         "steady forward ms": fmt_spread(m.get("steady_forward_ms"), "{:.1f}"),
                         "x floor": fmt(val.get("x_floor"), "{:.1f}"),
                         "GPU busy ms": fmt(val.get("gpu_busy_ms"), "{:.1f}"),
                         "graph breaks": fmt(val.get("graph_breaks"), "{:.0f}"),
                         "recompiles, steady run": fmt(val.get("steady_run_recompiles"), "{:.0f}"),
                         "commit": c["git_commit"].iloc[0] or "?", "measured (UTC)": str(c["timestamp"].iloc[0])[:16]})
        if crow:
            parts.append(f"\n**04 · compile, {wl} / {preset}** (latest measurement of each configuration; rows "
                         f"measured at different times may come from different machines of the same kind: compare "
                         f"times within one run)\n")
            parts.append(md_table(crow))
    return parts


def _all_workloads():
    return workloads.all_workloads()


def findings(run: pd.DataFrame) -> Findings:
    wl = workload_of(run)
    first, best = row_of(run[run["variant"] == "fp32-eager"], "forward_ms"), best_row(run)
    goals = []
    if best is not None and first is not None:
        v = best["variant"]
        head = (f"Best gated row **{'+ ' + v.split(' + ')[-1] if ' + ' in v else v}**: one "
                f"{wl.forward_name} in **{fmt_spread(best)} ms**, "
                f"{fmt(number(first['value']) / number(best['value']), '{:.2f}x')} "
                f"fp32 eager ({fmt_spread(first)} ms); {wl.metric.label} {fmt_value(run, wl.metric.name, '{:.3g}', v)}"
                + psnr_clause(run, v) + ".")
        busy = row_of(run, "gpu_busy_ms", v)
        wall, busy_ms = number(best["value"]), number(busy["value"]) if busy is not None else math.nan
        if busy_ms == busy_ms and busy_ms < 0.8 * wall:  # a host-bound forward: say where the rest of the time is
            brow = row_of(run, "busy_x_floor", v)
            head += (f" The GPU is busy {busy_ms:.1f} ms of it"
                     + (f" ({number(brow['value']):.2f}x the floor)" if brow is not None else "")
                     + ": the rest is the host launching kernels, which notebook 06's CUDA graphs take away.")
        xrow = row_of(run, "x_floor", v)
        xf, goal_x = number(xrow["value"]) if xrow is not None else math.nan, wl.goals.get("forward_x_floor")
        if goal_x and xf == xf:
            goals.append(f"forward within {goal_x:g}x its FLOP floor: **{_verdict(xf <= goal_x)}** ({xf:.2f}x)")
        step_goal = wl.goals.get("ddim_step_speedup")
        e2e_first, e2e_best = row_of(run, wl.metric.name, "fp32-eager"), row_of(run, wl.metric.name, v)
        if step_goal and e2e_first is not None and e2e_best is not None:
            sp = wl.metric.speedup(number(e2e_best["value"]), number(e2e_first["value"]))
            goals.append(f"{step_goal:g}x per DDIM step over fp32 eager: **{_verdict(sp >= step_goal)}** ({sp:.2f}x)")
    else:
        head = "This run has no ladder (a compile-only part): " + "; ".join(
            f"{k} {v}" for k, v in headline(run).items()) + "."
    cold, cold_goal = row_of(run, "cold_s", "compile:regional, after hygiene"), wl.goals.get("regional_cold_s")
    if cold is not None and cold_goal:
        goals.append(f"regional compile under {cold_goal:.0f} s cold: "
                     f"**{_verdict(number(cold['value']) < cold_goal)}** "
                     f"({number(cold['value']):.1f} s)")
    rec = row_of(run, "steady_run_recompiles", "compile:regional, after hygiene")
    if rec is not None:
        goals.append(f"{RECOMPILES_GOAL} recompiles in a steady run: "
                     f"**{_verdict(number(rec['value']) <= RECOMPILES_GOAL)}** ({number(rec['value']):.0f})")
    goal = ("Goals: " + "; ".join(goals) + ".") if goals else "No goal of this workload is judged by this run."
    return Findings(head, goal, "Read the ladder (each row adds one variant) and the compile table; then fused kernels "
                    "and CUDA graphs on top of the best stack.",
                    [("the ladder", "#The-ladder"), ("the compile table", "#torch.compile"),
                     ("05 · Triton kernels", "05_triton_kernels"), ("06 · CUDA graphs", "06_cuda_graphs")])


def stage(run: pd.DataFrame, wl) -> Stage | None:
    return ladder_stage(run, wl, STAGE[1], NOTEBOOK)
