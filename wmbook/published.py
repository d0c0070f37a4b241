"""The README's published GPU numbers, rendered from the results store (never typed by hand).

    python -m wmbook.published            # print the markdown
    python -m wmbook.published --write    # replace the block between the markers in README.md
    python -m wmbook.published --index data/reports/h100   # that folder's index.html (findings and links)
    python -m wmbook.published --publish EXECUTED.ipynb 02_bottleneck_breakdown-wma-bf16   # into data/reports/h100
    python -m wmbook.published --cut RUN_ID "device time ran out after row 4"   # a run whose notebook did not finish
    python -m wmbook.published --partial RUN_ID "decoder table only"   # a finished run that measured part of it

For each notebook, workload, preset and dtype the latest run in data/results/results.csv is shown, leaving out runs
marked cut (wmbook.results.mark_cut: a run stopped before its notebook finished, whose report is not published) and
runs marked partial (wmbook.results.mark_partial: a finished run that measured part of its notebook by choice; the
tables only some runs have, notebook 06's decoder table, take the latest run that has them, partial or not).
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

H100 = REPO_ROOT / "data" / "reports" / "h100"
INDEX_NOTE = ("Published H100 runs. The reports were rendered when each run was made; a link marked 'older render' is "
              "a report made before the display helpers (wmbook.display), which cut wide tables ('...') and showed "
              "progress boxes: the numbers here come from the results rows, not from the HTML.")

# the README's published block holds this device's rows only (data/reports/h100); other devices' runs are in their
# report folders' indexes (python -m wmbook.published --index data/reports/h200)
README_DEVICE = "H100"
BEGIN, END = "<!-- published:begin (python -m wmbook.published --write) -->", "<!-- published:end -->"


def _latest_runs(df: pd.DataFrame, notebook: str) -> list[pd.DataFrame]:
    """The latest GPU run of `notebook` per workload, preset and dtype, leaving out runs marked partial
    (results.mark_partial; cut runs are left out by the callers, results.without_cut)."""
    d = df[(df["notebook"] == notebook) & (df["device_kind"] == "cuda")]
    d = d[~d["run_id"].isin(results.partial_runs(df))].copy()
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
    commit = str(r['git_commit'] or '?')
    return f"{r['device_name']}, torch {r['torch']}, commit {commit[:7] if len(commit) == 40 else commit}"


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


def markdown(path=None, device: str | None = None) -> str:
    """All published tables as markdown; with `device`, only rows of devices whose name contains it (the README's
    block: README_DEVICE), so that no table takes one configuration's latest row from another machine's run."""
    from . import workloads

    df = results.without_cut(results.read(path or results.default_path()))
    df = results.of_device(df, device)
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
    parts += _step_reduction(df)
    parts += _triton_kernels(df)
    parts += _motion_loading(df)
    return "".join(parts)


def _step_reduction(df: pd.DataFrame) -> list[str]:
    """Notebook 03: per workload and preset its latest run, every point of the sweep (time with spread, speedup,
    deviation from the full-step output, quality against ground truth where the preset has it) and the knee of each
    curve."""
    parts = []
    for r in _latest_runs(df, "03_step_reduction"):
        params = [json.loads(p) if p else {} for p in r["params"]]
        r = r.assign(_sampling=[json.dumps(p.get("sampling"), sort_keys=True) for p in params],
                     _curve=[p.get("curve", "") for p in params], _ref=[bool(p.get("reference")) for p in params],
                     _criterion=[p.get("criterion", "-") for p in params],
                     _base=[p.get("base") or "eager" for p in params])
        points = r[~r["variant"].str.startswith("knee:") & r["metric"].isin(("fps", "iteration_s"))]
        if not len(points):
            continue
        metric = points["metric"].iloc[0]
        label = {"fps": "FPS", "iteration_s": "s / iteration"}[metric]
        has_gt = (r["metric"] == "psnr_gt").any()
        rows = []
        for _, pt in points.iterrows():
            v = pt["variant"]
            row = {"point": v.removeprefix("steps:") + (" (full steps)" if pt["_ref"] else ""),
                   "forwards": _val(r, "forwards", "{:.0f}", v), label: _spread(pt, "{:.3g}"),
                   "speedup": _val(r, "speedup_vs_full", "{:.2f}x", v),
                   "PSNR vs full (dB)": _val(r, "psnr_vs_full", "{:.1f}", v)}
            if has_gt:
                row |= {"PSNR vs truth (dB)": _val(r, "psnr_gt", "{:.2f}", v),
                        "SSIM vs truth": _val(r, "ssim_gt", "{:.3f}", v),
                        "agent error (px)": _val(r, "agent_err_px", "{:.1f}", v)}
            rows.append(row)
        knees = []
        for _, k in r[r["variant"].str.startswith("knee:") & (r["metric"] == "knee_speedup")].iterrows():
            same = points[(points["_sampling"] == k["_sampling"]) & (points["_curve"] == k["_curve"])]
            knees.append({"curve": k["variant"].removeprefix("knee:"),
                          "knee point": same["variant"].iloc[0].removeprefix("steps:") if len(same) else "-",
                          "forwards": _val(r, "knee_forwards", "{:.0f}", k["variant"]),
                          "speedup": _num(k["value"], "{:.2f}x"),
                          "criterion": k["_criterion"]})
        crit = "quality against ground truth" if has_gt else "deviation from the full-step output (solver error)"
        parts.append(f"\n**03 · step reduction, {r['workload'].iloc[0]} / {r['preset'].iloc[0]}** ({_device(r)}; "
                     f"on the `{points['_base'].iloc[0]}` pipeline; {label} median (p20-p80); knee by {crit})\n")
        parts.append(_table(rows))
        from .studies.step_notes import equal_work_spread_rows, timing_noise_note, weights_note

        for note in (timing_noise_note(equal_work_spread_rows(points), points["unit"].iloc[0]), weights_note(r)):
            if note:
                parts.append("\n" + note + "\n")
        if knees:
            parts.append(f"\n**03 · knees, {r['preset'].iloc[0]}**\n")
            parts.append(_table(knees))
    return parts


def _graph_timed(rows: pd.DataFrame) -> bool:
    """Whether notebook 05 timed these kernel rows as CUDA-graph replays (runs before that used do_bench)."""
    return "note" in rows.columns and rows["note"].astype(str).str.startswith("cuda-graph").all()


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
        how = "CUDA-graph replay" if _graph_timed(fused) else "do_bench"
        parts.append(f"\n**05 · fused Triton kernels, {r['workload'].iloc[0]} / {r['preset'].iloc[0]}** ({_device(r)}; "
                     f"{how} with the L2 flushed, median (p20-p80); GB/s of the bytes the op must move)\n")
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
                 "in a loop us": us(_v(r, "loop_fetch_ms", v), spread=True),
                 "loop x floor": _val(r, "loop_x_bytes_floor", "{:.1f}", v),
                 "GPU busy us": us(_v(r, "gpu_busy_ms", v)),
                 "launches / step": _val(r, "launches_per_fetch", "{:.0f}", v)}
                for v, f in ((f["variant"], f) for _, f in r[r["metric"] == "fetch_ms"].iterrows())]
        ig = _v(r, "in_graph_fetch_ms")
        parts.append(f"\n**07 · motion-data loading, {r['preset'].iloc[0]}** ({_device(r)}; bytes floor "
                     f"{us(_v(r, 'bytes_floor_ms'))} us for {_val(r, 'bytes_per_step', '{:.3g}')} bytes per step at "
                     f"the measured {_val(r, 'copy_gbps', '{:.0f}')} GB/s"
                     + (f"; a one-kernel CUDA graph replays in {us(_v(r, 'graph_replay_floor_ms'), spread=True)} us "
                        f"back to back" if _v(r, "graph_replay_floor_ms") is not None else "")
                     + (f"; {ig['variant']}, {ig['note']}: {us(ig, spread=True)} us a fetch" if ig is not None else "")
                     + ")\n")
        parts.append(_table(rows))
        sc = r[r["metric"] == "scaling_fetch_ms"].assign(n=lambda d: d["num_envs"].astype(float).astype(int))
        if len(sc):
            srows = [{"stack": v, **{f"{n} robots, us": us(g[g["n"] == n].iloc[0]) if (g["n"] == n).any() else "-"
                                     for n in sorted(set(sc["n"]))}} for v, g in sc.groupby("variant", sort=False)]
            parts.append("\n**07 · scaling** (us per step, by robots)\n")
            parts.append(_table(srows))
    return parts


def latest_decoder_run(df: pd.DataFrame, workload: str, preset: str) -> pd.DataFrame | None:
    """The rows of the latest GPU run of notebook 06 at `workload`/`preset` that has a decoder table, partial runs
    (results.mark_partial) included; None when no run has one."""
    d = df[(df["notebook"] == "06_cuda_graphs") & (df["device_kind"] == "cuda") & (df["workload"] == workload)
           & (df["preset"] == preset)]
    d = d[d["run_id"].isin(d.loc[d["metric"] == "decoder_ms_per_block", "run_id"])]
    if not len(d):
        return None
    return d[d["run_id"] == d.sort_values("timestamp")["run_id"].iloc[-1]]


def _conv_other(run: pd.DataFrame, variant: str) -> str:
    """A decoder row's kernel time in one profiled steady block: convolution / everything else (runs that stored the
    split: decoder_category_ms:*, decoder_gpu_busy_ms)."""
    busy, conv = _v(run, "decoder_gpu_busy_ms", variant), _v(run, "decoder_category_ms:convolution", variant)
    if busy is None:
        return "-"
    c = float(conv["value"]) if conv is not None else 0.0
    return f"{_num(c, '{:.1f}')} / {_num(float(busy['value']) - c, '{:.1f}')}"


def _cuda_graphs(df: pd.DataFrame, e2e_metrics: dict) -> list[str]:
    """Notebook 06: per workload and preset its latest run, one line per measured row."""
    from . import workloads

    parts = []
    for r in _latest_runs(df, "06_cuda_graphs"):
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
            busy = _v(r, "gpu_busy_ms", v)
            e2e = r[(r["variant"] == v) & (r["metric"].isin(list(e2e_metrics)))]
            ratio = float(f["value"]) / float(busy["value"]) if busy is not None else math.nan
            rows.append({"row": label,
                         "gate": f.get("gate", ""), "forward ms": _spread(f, "{:.1f}"),
                         "GPU busy ms": _num(busy["value"] if busy is not None else None, "{:.1f}"),
                         "wall / busy": _num(ratio, "{:.2f}"),
                         "launches / forward": _val(r, "launches_per_forward", "{:.0f}", v),
                         e2e_col: _num(e2e["value"].iloc[0], "{:.3g}") if len(e2e) else "-",
                         "first frame ms": _val(r, "first_frame_ms", "{:.0f}", v),
                         "run s": _spread(_v(r, "run_s", v), "{:.2f}"),
                         "frames PSNR dB": _val(r, "psnr_db", "{:.1f}", v)})
        parts.append(f"\n**06 · static caches and CUDA graphs, {r['workload'].iloc[0]} / {r['preset'].iloc[0]}** "
                     f"({_device(r)}; base: {r[r['metric'] == 'forward_ms']['variant'].iloc[0]})\n")
        parts.append(_table(rows))
        # the decoder table: the latest run that has one (a partial run made for it included), named when it is
        # not the run of the table above
        drun = latest_decoder_run(df, r["workload"].iloc[0], r["preset"].iloc[0])
        dec, src = r.iloc[:0], ""
        if drun is not None:
            if drun["run_id"].iloc[0] != r["run_id"].iloc[0]:
                when = "an earlier" if drun["timestamp"].max() < r["timestamp"].max() else "a later"
                src = f"; from {when} run, {drun['run_id'].iloc[0]}: {_device(drun)}"
            r = drun
            dec = r[r["metric"] == "decoder_ms_per_block"]
        if len(dec):
            drows = [{"decoder": d["variant"].removeprefix("decoder: "), "gate": d.get("gate", ""),
                      "ms / block": _spread(d, "{:.1f}"),
                      "PSNR dB vs fp32": _val(r, "decoder_psnr_db", "{:.1f}", d["variant"]),
                      "first pass s": _val(r, "decoder_first_pass_s", "{:.1f}", d["variant"]),
                      "GPU ms: convolution / other": _conv_other(r, d["variant"])}
                     for _, d in dec.iterrows()]
            parts.append(f"\n**06 · the decoder, {r['workload'].iloc[0]} / {r['preset'].iloc[0]}** (the "
                         f"reference's latents decoded by each stack; ms per "
                         f"{workloads.get(r['workload'].iloc[0]).decoder_unit}{src})\n")
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


def update_readme(readme=None, path=None, device: str | None = README_DEVICE) -> bool:
    """Replace the published block of README.md; True when it changed."""
    readme = Path(readme or REPO_ROOT / "README.md")
    text = readme.read_text()
    if BEGIN not in text or END not in text:
        raise ValueError(f"{readme} has no published block ({BEGIN} ... {END})")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    new = f"{head}{BEGIN}\n{markdown(path, device)}{END}{tail}"
    if new != text:
        from .atomic import atomic_open

        with atomic_open(readme, "w") as f:
            f.write(new)
    return new != text


def readme_block(readme=None) -> str:
    text = Path(readme or REPO_ROOT / "README.md").read_text()
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip("\n")


def publish(executed, name: str, folder=H100) -> Path:
    """Render the executed notebook `executed` as `folder`/`name`.html (wmbook.render.render_html: images embedded,
    the files it links copied under `folder`/artifacts/<notebook>/, missing ones kept as text, cross-links to the
    folder's reports of the same workload). Checked before anything is written: the notebook exists and `name`
    is '<its notebook>-<tag>' (the folder index groups reports by that name)."""
    import re

    from .render import render_html

    executed, folder = Path(executed), Path(folder)
    if not executed.is_file() or executed.suffix != ".ipynb":
        raise ValueError(f"executed={str(executed)!r} is not allowed: not a notebook file; allowed values: an executed "
                         f"notebook (.ipynb)")
    stem = executed.stem.removesuffix(".FAILED")
    if not re.fullmatch(re.escape(stem) + r"-[A-Za-z0-9][A-Za-z0-9_.-]*", name or ""):
        raise ValueError(f"name={name!r} is not allowed; allowed values: '{stem}-<tag>' (letters, digits, '-', '_', '.')")
    if not folder.is_dir():
        raise ValueError(f"folder={str(folder)!r} is not allowed: not a folder; allowed values: an existing folder")
    return render_html(executed, folder / f"{name}.html")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m wmbook.published", description=__doc__.splitlines()[0])
    ap.add_argument("--write", action="store_true", help="update README.md in place")
    ap.add_argument("--index", metavar="FOLDER", default=None,
                    help="write FOLDER/index.html for a folder of rendered reports (e.g. data/reports/h100): each "
                         "notebook's question, headline numbers from the stored rows, conclusion and links")
    ap.add_argument("--device", default=None,
                    help=f"only rows of devices whose name contains this (default: {README_DEVICE!r}, the README "
                         "block's device; with --index, the folder's name when a stored device name contains it, e.g. "
                         "data/reports/h200 -> 'H200', else every device)")
    ap.add_argument("--publish", nargs=2, metavar=("EXECUTED", "NAME"), default=None,
                    help="render an executed notebook (a GPU run's artifacts/<NB>-<TAG>/<notebook>.ipynb) as "
                         "FOLDER/NAME.html: the artifacts it links copied under FOLDER/artifacts/<notebook>/, links to "
                         "files no longer there (traces left on the GPU host) kept as text, links to other notebooks "
                         "pointed at their reports in FOLDER")
    ap.add_argument("--to", metavar="FOLDER", default=str(H100), help="with --publish: the folder (data/reports/h100)")
    ap.add_argument("--cut", nargs=2, metavar=("RUN_ID", "REASON"), default=None,
                    help="mark a stored run as cut before its notebook finished (its rows stay; the published tables "
                         "and indexes show the latest run that was not cut)")
    ap.add_argument("--partial", nargs=2, metavar=("RUN_ID", "REASON"), default=None,
                    help="mark a stored run that finished as partial: it measured part of its notebook by choice "
                         "(e.g. notebook 06 for its decoder table); the notebook's tables and headlines keep the latest "
                         "full run, a table only some runs have takes the latest run that has it")
    a = ap.parse_args(argv)
    for flag, mark in (("cut", results.mark_cut), ("partial", results.mark_partial)):
        if getattr(a, flag) is not None:
            try:
                print(mark(*getattr(a, flag), path=results.default_path()))
            except ValueError as e:
                ap.error(str(e))
            return 0
    if a.publish is not None:
        try:
            print(publish(*a.publish, folder=a.to))
        except ValueError as e:
            ap.error(str(e))
        return 0
    if a.index is not None:
        from .render import write_folder_index

        device = a.device
        if device is None:
            name = Path(a.index).name
            device = name if len(results.of_device(results.read(results.default_path()), name)) else None
        try:
            print(write_folder_index(a.index, note=INDEX_NOTE if Path(a.index).resolve() == H100.resolve() else None,
                                     device=device))
        except ValueError as e:
            ap.error(str(e))
        return 0
    if a.write:
        print("README.md updated" if update_readme(device=a.device or README_DEVICE) else "README.md already up to date")
    else:
        sys.stdout.write(markdown(device=a.device or README_DEVICE))
    return 0


if __name__ == "__main__":
    sys.exit(main())
