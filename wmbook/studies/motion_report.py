"""Notebook 07's results rows and interpretation (wmbook.studies.motion measures; this reports), and its stored rows as
the reports show them: headline, published tables and findings."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import pandas as pd

from .. import results as results_store
from .. import workloads
from ..motion import variants as mvariants
from ..rows import (
    Findings,
    Stage,
    best_counted,
    device_label,
    fmt,
    fmt_spread,
    fmt_value,
    latest_runs,
    md_table,
    number,
    row_of,
    scaled,
)

if TYPE_CHECKING:
    from ..runconfig import RunConfig
    from .motion import MotionLadder, MotionSetup


NOTEBOOK = "07_motion_data_loading"
STAGE = (0, "eager")  # the motion workload's only notebook: its eager row and its best row are the summary


def result_rows(cfg: RunConfig, s: MotionSetup, lad: MotionLadder, scaling: pd.DataFrame | None = None,
                stages: pd.DataFrame | None = None) -> list[dict]:
    """Results rows: per ladder row its fetch time (with spread), speedup, x bytes floor, GPU busy time and launches,
    worst error; the floor and copy ceiling; each scaling point; the eager reference's stage shares."""
    common = dict(notebook=cfg.notebook, workload=cfg.workload.name, preset=cfg.preset.name, params=cfg.params(),
                  warmup=cfg.warmup, repeats=cfg.repeats)
    rows = []
    for r in lad.rows:
        extra = dict(gate=r.gate, num_envs=r.num_envs, rel_l2_vs_fp64=r.check.fields[r.check.worst].vs_fp32.rel_l2,
                     note=r.note)
        rows.append(results_store.make_row(variant=r.name, metric="fetch_ms", value=r.fetch.median, unit="ms",
                                           timing=r.fetch, **common, **extra))
        if r.loop is not None:
            rows.append(results_store.make_row(variant=r.name, metric="loop_fetch_ms", value=r.loop.median, unit="ms",
                                               timing=r.loop, **common, **extra))
        for metric, value, unit in (("speedup", r.speedup, "x"),
                                    ("x_bytes_floor", r.x_floor if r.counts else math.nan, "x"),
                                    ("loop_x_bytes_floor", r.loop_x_floor if r.counts else math.nan, "x"),
                                    ("gpu_busy_ms", r.gpu_busy_ms, "ms"), ("host_ms", r.host_ms, "ms"),
                                    ("launches_per_fetch", r.launches, "count"),
                                    ("first_call_s", r.first_call_s, "s")):
            if not (isinstance(value, float) and math.isnan(value)):
                rows.append(results_store.make_row(variant=r.name, metric=metric, value=value, unit=unit, **common,
                                                   **extra))
    for metric, value, unit in (("bytes_per_step", s.bytes_per_step(), "bytes"), ("bytes_floor_ms", s.floor_ms(), "ms"),
                                ("copy_gbps", s.ceilings["copy_gbps"], "GB/s")):
        rows.append(results_store.make_row(variant="-", metric=metric, value=value, unit=unit, num_envs=s.num_envs,
                                           **common))
    if lad.in_graph is not None:
        rows.append(results_store.make_row(variant=lad.in_graph_stack, metric="in_graph_fetch_ms",
                                           value=lad.in_graph.median, unit="ms", timing=lad.in_graph,
                                           num_envs=s.num_envs, note=f"{lad.in_graph_k} fetches per graph", **common))
        rows.append(results_store.make_row(variant=lad.in_graph_stack, metric="in_graph_x_bytes_floor",
                                           value=lad.in_graph.median / s.floor_ms(), unit="x", num_envs=s.num_envs,
                                           **common))
    if lad.replay is not None:
        rows.append(results_store.make_row(variant="-", metric="graph_replay_floor_ms", value=lad.replay.ms, unit="ms",
                                           timing=lad.replay.loop, num_envs=s.num_envs, **common))
        rows.append(results_store.make_row(variant="-", metric="graph_replay_host_ms", value=lad.replay.host_ms,
                                           unit="ms", num_envs=s.num_envs, **common))
    for _, p in (scaling if scaling is not None else pd.DataFrame()).iterrows():
        rows.append(results_store.make_row(variant=p["stack"], metric="scaling_fetch_ms", value=p["fetch ms"],
                                           unit="ms", num_envs=int(p["num_envs"]), gate=p["gate"], **common))
    if stages is not None:
        side = "device" if cfg.device.type == "cuda" else "host"
        for _, st in stages.iterrows():
            rows.append(results_store.make_row(variant="eager", metric=f"stage_share:{st['label']}",
                                               value=float(st[f"{side} share"]), unit="fraction", source=side,
                                               **common))
            rows.append(results_store.make_row(variant="eager", metric=f"stage_host_ms:{st['label']}",
                                               value=float(st["host ms / step"]), unit="ms", **common))
    return rows


def interpret(cfg: RunConfig, s: MotionSetup, lad: MotionLadder, scaling: pd.DataFrame | None = None,
              stages: pd.DataFrame | None = None) -> str:
    """Sentences computed from the measured numbers."""
    from .motion import LEAF_STAGES, scaling_slopes, step_floor_ms  # noqa: PLC0415  heavy: study module (triton)

    ref, best = lad.reference, lad.best()
    goals = cfg.workload.goals
    dev = s.ceilings.get("device_name", str(cfg.device))
    us = 1e3
    lines = [f"On {dev}, the eager reference fetch for {s.num_envs} robots x {s.frames_per_env} frames takes "
             f"{ref.fetch.median * us:.0f} us per step (p20 {ref.fetch.p20 * us:.0f}, p80 {ref.fetch.p80 * us:.0f}), "
             f"{ref.x_floor:.0f}x the {s.floor_ms() * us:.1f} us it takes to move its {s.bytes_per_step() / 1e6:.2f} "
             f"MB at the measured copy bandwidth ({s.ceilings['copy_gbps']:.0f} GB/s)."]
    if stages is not None and len(stages):
        leaves = stages.set_index("label").loc[list(LEAF_STAGES)]
        for side in ("host", "device"):
            if leaves[f"{side} share"].notna().any():
                top = leaves[f"{side} share"].idxmax()
                lines.append(f"Of the labelled stages, `{top}` holds the most {side} time: "
                             f"{leaves.loc[top, f'{side} share']:.0%} of the profiled fetch's "
                             f"{stages[f'{side} ms / step'].iloc[0] * us:.0f} us per step (profiler overhead "
                             f"included).")
    if ref.launches == ref.launches:
        busy = ref.gpu_busy_ms / ref.fetch.median
        lines.append(f"The eager fetch launches {ref.launches:.0f} kernels per step for {ref.gpu_busy_ms * us:.0f} us "
                     f"of GPU work, {busy:.0%} of its wall time: "
                     + ("the rest of the step the GPU waits for the host (launch-bound)." if busy < 0.5 else
                        "the kernels themselves take most of the step."))
    if best is not ref:
        sp, xf = best.speedup, best.x_floor
        verdict = ("" if cfg.tiny else
                   f" (goal {goals['fetch_speedup']:.0f}x: {'met' if sp >= goals['fetch_speedup'] else 'not met'})")
        floor = ("" if cfg.tiny else
                 f" (goal {goals['bytes_floor_x']:.0f}x: {'met' if xf <= goals['bytes_floor_x'] else 'not met'})")
        lines.append(f"The fastest row that passes the gate, `{best.name}`, takes {best.fetch.median * us:.1f} us: "
                     f"{sp:.1f}x faster than eager{verdict} and {xf:.1f}x the bytes floor{floor}, {best.gbps:.0f} GB/s "
                     f"achieved.")
        if best.loop is not None:
            lx = best.loop_x_floor
            goal = ("" if cfg.tiny else
                    f" (goal {goals['bytes_floor_x']:.0f}x: {'met' if lx <= goals['bytes_floor_x'] else 'not met'})")
            why = ""
            if best.host_ms == best.host_ms and best.gpu_busy_ms == best.gpu_busy_ms:
                bound = "host" if best.host_ms > best.gpu_busy_ms else "GPU"
                why = (f": about the larger of the {best.host_ms * us:.1f} us the host takes to issue one and the "
                       f"{best.gpu_busy_ms * us:.1f} us the GPU takes to run it ({bound}-bound)")
            lines.append(f"Issued back to back, as a loop issues one per step, it costs {best.loop.median * us:.1f} us "
                         f"a step (p20 {best.loop.p20 * us:.1f}, p80 {best.loop.p80 * us:.1f}), {lx:.1f}x the bytes "
                         f"floor{goal}{why}; one at a time, with the GPU idle between calls, the two add up.")
    if lad.replay is not None and best.loop is not None:
        rp, sf = lad.replay, step_floor_ms(s, lad)
        lines.append(f"On this machine a CUDA graph holding one one-element kernel replays at {rp.ms * us:.1f} us back "
                     f"to back (p20 {rp.loop.p20 * us:.1f}, p80 {rp.loop.p80 * us:.1f}; {rp.host_ms * us:.1f} us of "
                     f"host time to issue one): no fetch captured as one graph a step costs less in a loop. Against "
                     f"the larger of the two floors ({sf * us:.1f} us) `{best.name}`'s loop is at "
                     f"{best.loop.median / sf:.1f}x"
                     + ("; the replay's own cost, not the fetch's bytes, sets that floor." if rp.ms > s.floor_ms()
                        else "."))
    if lad.in_graph is not None:
        ig, xf = lad.in_graph, lad.in_graph.median / s.floor_ms()
        counted = ("" if cfg.tiny else
                   f" (the goal's {goals['bytes_floor_x']:.0f}x, counted this way: "
                   f"{'met' if xf <= goals['bytes_floor_x'] else 'not met'})")
        rest = ""
        if best.loop is not None and best.loop.median > ig.median:
            rest = (f"; the other {(best.loop.median - ig.median) * us:.1f} us of the loop's step are the graph launch "
                    f"and its host path, which a step captured whole pays once for all its work")
        lines.append(f"With {lad.in_graph_k} fetches captured in one graph (a fetch inside a larger captured program, "
                     f"such as an environment step captured whole), `{lad.in_graph_stack}` costs {ig.median * us:.1f} "
                     f"us a fetch (p20 {ig.p20 * us:.1f}, p80 {ig.p80 * us:.1f}), {xf:.1f}x the bytes "
                     f"floor{counted}{rest}.")
    elif "in-graph" in lad.notes:
        lines.append(f"The fetch inside a larger graph was not measured: {lad.notes['in-graph']}.")
    failed = [r.name for r in lad.rows if r.gate == "FAIL"]
    if failed:
        lines.append(f"Failed the gate (their times do not count): {', '.join(failed)}.")
    else:
        lines.append(f"Every row matches the float64 reference (worst relative L2 "
                     f"{max(max(r.check.rel_l2().values()) for r in lad.rows):.1e}, allowed 1e-5 per field; "
                     f"quaternions up to sign).")
    if scaling is not None and len(scaling):
        sl = scaling_slopes(scaling)
        for stack in dict.fromkeys((ref.name, best.name)):
            g = sl[sl["stack"] == stack]
            if len(g):
                desc = ", ".join(f"{r['from robots']}->{r['to robots']}: x{r['time x']:.2f} (slope {r['slope']:.2f})"
                                 for _, r in g.iterrows())
                lines.append(f"`{stack}` as robots grow: {desc}.")
        lines.append("A slope near 0 is a launch-bound fetch (time independent of the robots), near 1 a "
                     "bandwidth-bound one (time proportional to the bytes).")
    skip = [n for n in mvariants.known() if n not in mvariants.known(cfg.device)]
    if cfg.device.type != "cuda":
        lines.append(f"These are CPU numbers at `{cfg.preset.name}`: they check the code paths and the gate, not the "
                     f"speed. Skipped here (need a GPU): {', '.join(skip) or '-'}"
                     + ("; the Triton kernel ran in Triton's CPU interpreter (checked, not timed as a speed)."
                        if any("interpreter" in r.note for r in lad.rows) else "."))
    return " ".join(lines)


__all__ = ["interpret", "result_rows"]


# --- the stored rows: headline, published tables, findings ------------------------------------------------------------


def _us(row, spread: bool = False, spec: str = "{:.1f}") -> str:
    """A stored ms row in microseconds."""
    if row is None:
        return "-"
    row = scaled(row, 1e3)
    return fmt_spread(row, spec) if spread else fmt(row["value"], spec)


def headline(run: pd.DataFrame) -> dict:
    d = run[run["metric"] == "fetch_ms"]
    best = best_counted(run, "fetch_ms")
    if best is None:
        return {}
    out = {"eager fetch us": _us(d.iloc[0], True), "best fetch us": _us(best, True), "best row": best["variant"]}
    for m, spec, label in (("speedup", "{:.1f}x", "speedup vs eager"), ("x_bytes_floor", "{:.1f}", "x bytes floor")):
        v = row_of(run, m, best["variant"])
        if v is not None:
            out[label] = fmt(v["value"], spec)
    return out


def published(df: pd.DataFrame) -> list[str]:
    """Per preset its latest run, the ladder and the scaling points (us per step)."""
    parts = []
    for r in latest_runs(df, NOTEBOOK):
        rows = [{"ladder row": v, "gate": f.get("gate", ""), "fetch us": _us(f, True),
                 "speedup": fmt_value(r, "speedup", "{:.1f}x", v),
                 "x bytes floor": fmt_value(r, "x_bytes_floor", "{:.1f}", v),
                 "in a loop us": _us(row_of(r, "loop_fetch_ms", v), True),
                 "loop x floor": fmt_value(r, "loop_x_bytes_floor", "{:.1f}", v),
                 "GPU busy us": _us(row_of(r, "gpu_busy_ms", v)),
                 "launches / step": fmt_value(r, "launches_per_fetch", "{:.0f}", v)}
                for v, f in ((f["variant"], f) for _, f in r[r["metric"] == "fetch_ms"].iterrows())]
        ig = row_of(r, "in_graph_fetch_ms")
        parts.append(f"\n**07 · motion-data loading, {r['preset'].iloc[0]}** ({device_label(r)}; bytes floor "
                     f"{_us(row_of(r, 'bytes_floor_ms'))} us for {fmt_value(r, 'bytes_per_step', '{:.3g}')} bytes per "
                     f"step at the measured {fmt_value(r, 'copy_gbps', '{:.0f}')} GB/s"
                     + (f"; a one-kernel CUDA graph replays in {_us(row_of(r, 'graph_replay_floor_ms'), True)} us "
                        f"back to back" if row_of(r, "graph_replay_floor_ms") is not None else "")
                     + (f"; {ig['variant']}, {ig['note']}: {_us(ig, True)} us a fetch" if ig is not None else "")
                     + ")\n")
        parts.append(md_table(rows))
        sc = r[r["metric"] == "scaling_fetch_ms"].assign(n=lambda d: d["num_envs"].astype(float).astype(int))
        if len(sc):
            srows = [{"stack": v, **{f"{n} robots, us": _us(g[g["n"] == n].iloc[0]) if (g["n"] == n).any() else "-"
                                     for n in sorted(set(sc["n"]))}} for v, g in sc.groupby("variant", sort=False)]
            parts.append("\n**07 · scaling** (us per step, by robots)\n")
            parts.append(md_table(srows))
    return parts


def findings(run: pd.DataFrame) -> Findings:
    goals = workloads.get(run["workload"].iloc[0]).goals
    best = best_counted(run, "fetch_ms")
    if best is None:
        return Findings("No fetch rows in this run.", "No goal is judged by this run.", "", [])
    v = best["variant"]
    sp, xf = row_of(run, "speedup", v), row_of(run, "x_bytes_floor", v)
    head = (f"Best gated row **{v.split(' + ')[-1]}**: one fetch in **{_us(best, True)} us**, "
            f"{fmt(sp['value'] if sp is not None else None, '{:.1f}x')} the eager fetch "
            f"({_us(run[run['metric'] == 'fetch_ms'].iloc[0], True)} us).")
    parts = []
    if sp is not None and goals.get("fetch_speedup"):
        ok = number(sp["value"]) >= goals["fetch_speedup"]
        parts.append(f"{goals['fetch_speedup']:.0f}x faster than eager: **{'met' if ok else 'missed'}** "
                     f"({number(sp['value']):.1f}x)")
    if xf is not None and goals.get("bytes_floor_x"):
        ok = number(xf["value"]) <= goals["bytes_floor_x"]
        parts.append(f"within {goals['bytes_floor_x']:.0f}x the bytes floor: **{'met' if ok else 'missed'}** "
                     f"({number(xf['value']):.1f}x)")
    goal = ("Goals: " + "; ".join(parts) + ".") if parts else "No goal is judged by this run."
    return Findings(head, goal, "Read the ladder against the bytes floor, then the scaling to more robots.",
                    [("the ladder", "#The-ladder")])


def stage(run: pd.DataFrame, wl) -> list[Stage]:
    d, best = run[run["metric"] == "fetch_ms"], best_counted(run, "fetch_ms")
    if best is None or not len(d):
        return []
    m = wl.metric
    xf = row_of(run, "x_bytes_floor", best["variant"])
    return [Stage("eager", NOTEBOOK, m.name, m.label, number(d.iloc[0]["value"]), m.higher_is_better, "reference",
                  d.iloc[0]["variant"]),
            Stage("+ best ladder row (07)", NOTEBOOK, m.name, m.label, number(best["value"]), m.higher_is_better,
                  f"gate {best.get('gate', '')}" + (f", {number(xf['value']):.1f}x the bytes floor" if xf is not None
                                                    else ""), best["variant"])]
