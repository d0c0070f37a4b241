"""Headline numbers of the published GPU runs (what the report indexes show per notebook): which run stands for each
notebook, workload and preset (`published_runs`: the latest that finished; notebook 04's parts combined), and a few
numbers that answer its notebook's question (`headline`), all from the results rows. The README's tables are
wmbook.published; the index pages that show these are wmbook.render.write_folder_index.
"""

from __future__ import annotations

import math

import pandas as pd

from . import results
from .published import _latest_runs, _num, _spread, _v, _val, latest_decoder_run



def _short(variant: str, n: int = 3) -> str:
    """A stack name shortened to its last `n` parts ('... + a + b + c')."""
    parts = str(variant).split(" + ")
    return variant if len(parts) <= n else "… + " + " + ".join(parts[-n:])


def _best_counted(r: pd.DataFrame, metric: str, lower_is_better: bool = True):
    """The row of `metric` whose gate passed (or is the reference) with the best value, else None."""
    d = r[r["metric"] == metric].copy()
    if not len(d):
        return None
    if "gate" in d:
        ok = d[d["gate"].fillna("").isin(["pass", "reference", ""])]
        d = ok if len(ok) else d
    d["v"] = pd.to_numeric(d["value"], errors="coerce")
    d = d.dropna(subset=["v"])
    if not len(d):
        return None
    return d.loc[d["v"].idxmin() if lower_is_better else d["v"].idxmax()]


def _headline_01(r: pd.DataFrame) -> dict:
    from . import workloads

    wl = workloads.get(r["workload"].iloc[0])
    out = {}
    for header, metric, fmt, spread in wl.published_columns or ():
        row = _v(r, metric)
        if row is not None:
            out[header] = _spread(row, fmt) if spread else _num(row["value"], fmt)
    return out


def _headline_02(r: pd.DataFrame) -> dict:
    shares = r[r["metric"].str.startswith("category_share:")].sort_values("value", ascending=False)
    top = ", ".join(f"{m.split(':', 1)[1]} {float(v):.0%}" for m, v in zip(shares["metric"][:3], shares["value"][:3]))
    out = {"top categories": top or "-", "GPU idle": _val(r, "idle_share", "{:.0%}"),
           "kernels / forward": _val(r, "kernels_per_forward", "{:.0f}")}
    g, f = _v(r, "gemm_tflops"), _v(r, "gemm_frac_of_ceiling")
    if g is not None:
        out["GEMM TFLOP/s"] = _num(g["value"], "{:.3g}") + (f" ({_num(f['value'], '{:.0%}')} of ceiling)"
                                                            if f is not None else "")
    if _v(r, "profiling_overhead") is not None:
        out["profiling overhead"] = _spread(_v(r, "profiling_overhead"), "{:+.1%}", " to ")
    return out


def _ladder_headline(r: pd.DataFrame, metric: str, unit_fmt: str, what: str) -> dict:
    first = r[r["metric"] == metric]
    best = _best_counted(r, metric)
    if best is None or not len(first):
        return {}
    base = first.iloc[0]
    out = {f"{what} (first row)": _spread(base, unit_fmt), f"{what} (best gated row)": _spread(best, unit_fmt),
           "best row": _short(best["variant"])}
    try:
        out["speedup vs first row"] = _num(float(base["value"]) / float(best["value"]), "{:.2f}x")
    except (TypeError, ValueError, ZeroDivisionError):
        pass
    failed = r[(r["metric"] == metric) & (r.get("gate", pd.Series("", index=r.index)).fillna("") == "FAIL")]
    if len(failed):
        out["rows failing the gate"] = str(len(failed))
    return out


def _headline_04(r: pd.DataFrame) -> dict:
    out = _ladder_headline(r, "forward_ms", "{:.3g}", "forward ms")
    xf = _v(r, "x_floor", _best_counted(r, "forward_ms")["variant"]) if _best_counted(r, "forward_ms") is not None else None
    if xf is not None:
        out["x FLOP floor"] = _num(xf["value"], "{:.1f}")
    comp = r[r["metric"] == "steady_forward_ms"]
    if len(comp):
        b = comp.loc[pd.to_numeric(comp["value"], errors="coerce").idxmin()]
        out["fastest compile"] = f"{b['variant'].removeprefix('compile:')}: {_spread(b, '{:.3g}')} ms"
    cold = _v(r, "cold_s", "compile:regional, after hygiene")
    if cold is not None:
        out["regional compile, cold s"] = _num(cold["value"], "{:.1f}")
    return out


def _headline_05(r: pd.DataFrame) -> dict:
    fused = r[r["metric"] == "fused_us"]
    if not len(fused):
        return {}
    ratios = []
    for _, f in fused.iterrows():
        e = _v(r, "eager_us", f["variant"])
        c = _v(r, "compile_us", f["variant"])
        try:
            ratios.append((float(e["value"]) / float(f["value"]) if e is not None else math.nan,
                           float(c["value"]) / float(f["value"]) if c is not None else math.nan))
        except (TypeError, ValueError, ZeroDivisionError):
            pass
    out = {"call sites": str(len(fused))}
    eg = [a for a, _ in ratios if a == a]
    cg = [b for _, b in ratios if b == b]
    if eg:
        out["fused vs eager"] = f"{min(eg):.2f}x-{max(eg):.2f}x"
    if cg:
        out["fused vs torch.compile"] = f"{min(cg):.2f}x-{max(cg):.2f}x"
    gb = pd.to_numeric(r[r["metric"] == "fused_gbps"]["value"], errors="coerce").dropna()
    if len(gb):
        out["fused GB/s (best)"] = _num(gb.max(), "{:,.0f}")
    ladder = _ladder_headline(r, "forward_ms", "{:.3g}", "forward ms")
    return out | ladder


def _best_of_04_variant(r: pd.DataFrame) -> str | None:
    """Notebook 06's comparison row of notebook 04's best stack alone (its base then holds notebook 05's kernels):
    the measured row whose variants are a strict subset of the first row's."""
    fw = r.loc[r["metric"] == "forward_ms", "variant"].tolist()
    if not fw:
        return None
    base = set(fw[0].split(" + "))
    return next((v for v in fw[1:] if set(v.split(" + ")) < base), None)


def _headline_06(r: pd.DataFrame) -> dict:
    out = _ladder_headline(r, "forward_ms", "{:.3g}", "forward ms")
    b04 = _best_of_04_variant(r)
    runs = r[(r["metric"] == "run_s") & (r["variant"] != b04)] if b04 else r.iloc[:0]
    best_run, base_run = _best_counted(runs, "run_s"), _v(r, "run_s", b04) if b04 else None
    if best_run is not None and base_run is not None:  # the 2x goal of a workload timed per step (wma)
        out["run s, notebook 04's best stack"] = _spread(base_run, "{:.3g}")
        out["run s (best row)"] = _spread(best_run, "{:.3g}")
        out["run speedup vs notebook 04's best"] = _num(float(base_run["value"]) / float(best_run["value"]), "{:.2f}x")
    best = _best_counted(r, "forward_ms")
    if best is not None:
        busy = _v(r, "gpu_busy_ms", best["variant"])
        if busy is not None:
            out["wall / GPU busy"] = _num(float(best["value"]) / float(busy["value"]), "{:.2f}")
        lf = _v(r, "launches_per_forward", best["variant"])
        if lf is not None:
            out["launches / forward"] = _num(lf["value"], "{:.0f}")
    judged = r[r["variant"].isin(set(r.loc[r["metric"] == "psnr_db", "variant"]))]  # a stand-in decoder's row
    for metric, fmt, label in (("fps", "{:.3g}", "FPS (best row)"), ("ddim_step_ms", "{:.3g}", "ms / DDIM step (best)")):
        b = _best_counted(judged, metric, lower_is_better=metric != "fps")  # (frames not judged) is no best row
        if b is not None:
            out[label] = _num(b["value"], fmt)
    dec = _best_counted(r, "decoder_ms_per_block")
    if dec is not None:
        out["decoder ms / block (best)"] = _spread(dec, "{:.1f}")
    return out


def _headline_07(r: pd.DataFrame) -> dict:
    def us(row):
        row = row.copy()
        for c in ("value", "p20", "p80"):
            if c in row and row[c] == row[c]:
                row[c] = float(row[c]) * 1e3
        return _spread(row, "{:.1f}")

    d = r[r["metric"] == "fetch_ms"]
    best = _best_counted(r, "fetch_ms")
    if best is None:
        return {}
    out = {"eager fetch us": us(d.iloc[0]), "best fetch us": us(best), "best row": _short(best["variant"])}
    for m, fmt, label in (("speedup", "{:.1f}x", "speedup vs eager"), ("x_bytes_floor", "{:.1f}", "x bytes floor")):
        v = _v(r, m, best["variant"])
        if v is not None:
            out[label] = _num(v["value"], fmt)
    return out


def _headline_03(r: pd.DataFrame) -> dict:
    """The reference curve's knee (the first knee row: the workload's reference solver) and the fastest knee."""
    knees = r[r["variant"].str.startswith("knee:") & (r["metric"] == "knee_speedup")]
    if not len(knees):
        return {"knee": "none within budget"} if (r["metric"] == "speedup_vs_full").any() else {}
    first = knees.iloc[0]
    best = knees.loc[pd.to_numeric(knees["value"]).idxmax()]
    out = {f"knee ({first['variant'].removeprefix('knee:')})":
           f"{_num(first['value'], '{:.2f}x')}, {_val(r, 'knee_forwards', '{:.0f}', first['variant'])} forwards"}
    if best["variant"] != first["variant"]:
        out[f"fastest knee ({best['variant'].removeprefix('knee:')})"] = _num(best["value"], "{:.2f}x")
    from .studies.step_notes import EQUAL_WORK_TOLERANCE, equal_work_spread_rows, weights_note

    eq = equal_work_spread_rows(r)
    if eq is not None and eq["ratio"] > EQUAL_WORK_TOLERANCE:
        out["timing noise"] = (f"equal-work points {eq['ratio']:.2f}x apart: speedups closer than that are not "
                               f"resolved")
    out["weights"] = weights_note(r, short=True)
    return out


_HEADLINES = {"01_baseline_profiling": _headline_01, "02_bottleneck_breakdown": _headline_02,
              "03_step_reduction": _headline_03, "04_compile_autocast": _headline_04,
              "05_triton_kernels": _headline_05, "06_cuda_graphs": _headline_06, "07_motion_data_loading": _headline_07}


def headline(run: pd.DataFrame) -> dict[str, str]:
    """A few numbers that answer a run's notebook question, from its results rows (any device; one notebook):
    {header: formatted value}. Unknown notebooks (or no rows) give {}."""
    if run is None or not len(run):
        return {}
    notebooks = set(run["notebook"])
    if len(notebooks) != 1:
        raise ValueError(f"headline() takes the rows of one notebook; got {sorted(notebooks)}")
    fn = _HEADLINES.get(run["notebook"].iloc[0])
    if fn is None:
        return {}
    try:
        return {k: v for k, v in fn(run.reset_index(drop=True)).items() if v not in (None, "", "-")}
    except (KeyError, IndexError, ValueError, TypeError) as e:
        return {"note": f"no headline ({type(e).__name__}: {e})"}


def published_runs(df: pd.DataFrame) -> dict[tuple[str, str, str], pd.DataFrame]:
    """{(notebook, workload, preset): rows} of the GPU runs the published tables show: the latest run per notebook,
    workload and preset; for notebook 04 (run in parts) the latest run with a ladder plus each compile
    configuration's latest measurement; for notebook 06 the decoder table of the latest run that has one. Runs marked
    cut (results.mark_cut) are left out, runs marked partial (results.mark_partial) give only such tables."""
    df = results.without_cut(df)
    out = {}
    for nb in _HEADLINES:
        if nb == "04_compile_autocast":
            d = df[(df["notebook"] == nb) & (df["device_kind"] == "cuda")]
            for (wl, preset), g in d.groupby(["workload", "preset"], sort=False):
                parts = []
                ladders = g[g["metric"] == "forward_ms"]
                if len(ladders):
                    parts.append(g[g["run_id"] == ladders.sort_values("timestamp")["run_id"].iloc[-1]])
                comp = g[g["variant"].str.startswith("compile:")]
                for _, c in comp.groupby("variant", sort=False):
                    parts.append(c[c["run_id"] == c.sort_values("timestamp")["run_id"].iloc[-1]])
                if parts:
                    out[(nb, wl, preset)] = pd.concat(parts).drop_duplicates()
            continue
        for r in _latest_runs(df, nb):
            key = (nb, r["workload"].iloc[0], r["preset"].iloc[0])
            if nb == "06_cuda_graphs":  # its decoder table from the latest run that has one (as the README's)
                d = latest_decoder_run(df, *key[1:])
                if d is not None and d["run_id"].iloc[0] != r["run_id"].iloc[0]:
                    own = ~r["metric"].str.startswith("decoder_")
                    r = pd.concat([r[own], d[d["metric"].str.startswith("decoder_")]])
            if key not in out or r["timestamp"].max() > out[key]["timestamp"].max():
                out[key] = r.drop(columns=["dtype"], errors="ignore")
    return out



__all__ = ["headline", "published_runs"]
