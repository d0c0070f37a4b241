"""Notebook 08's stored rows as the reports show them: headline, published table and findings (wmbook.studies.multi_gpu
measures; this reads the rows back). No summary stage: the summary is one GPU's ladder, and this notebook's rows
compare several GPUs with that ladder's best stack."""

from __future__ import annotations

import pandas as pd

from ..rows import Findings, device_label, fmt, fmt_spread, latest_runs, md_table, number, row_of

NOTEBOOK = "08_multi_gpu"
STREAM_GOAL_FPS = {2: 120, 4: 200}  # mg2-universal with the full decoder, end to end, by GPU count


def layout_bounds(forwards: int, denoise_ms: float, decode_ms: float, frames: int, max_gpus: int = 4) -> pd.DataFrame:
    """Upper bounds on the FPS of streaming layouts over 2..max_gpus GPUs, from one GPU's measured stage times of a
    block (`denoise_ms` for its `forwards` DiT forwards, `decode_ms`, `frames` pixel frames a steady block): the DiT's
    layers split over P ranks as a pipeline, the decoder over D = GPUs - P ranks (spatial parts). Ideal parts
    (equal shares, communication free), so a real layout stays below them.

    Why the DiT pipeline gains little: a denoising step's forward needs the previous step's output, so a block's steps
    cross every stage one after the other; only the cache refresh, which the next block needs at each stage only for
    that stage's layers, overlaps the next block's first step. A block's denoising takes (forwards - 1 + 1/P) forwards
    of one GPU instead of `forwards`, however many ranks hold the layers."""
    per = denoise_ms / forwards
    rows = []
    for gpus in range(2, max_gpus + 1):
        for p in range(gpus - 1, 0, -1):
            d = gpus - p
            dit, dec = per * (forwards - 1 + 1 / p), decode_ms / d
            period = max(dit, dec)
            rows.append({"GPUs": gpus, "DiT ranks": p, "decoder ranks": d, "DiT ms a block": dit,
                         "decode ms a block": dec, "bound FPS": frames / period * 1e3,
                         "limited by": "DiT" if dit >= dec else "decoder"})
    return pd.DataFrame(rows).set_index(["GPUs", "DiT ranks", "decoder ranks"])


def pipeline_bound(forwards: int, denoise_ms: float, decode_ms: float, frames: int, shares: list[float],
                   decoder_shares_last: bool) -> float:
    """Upper bound on the FPS of a DiT layer pipeline whose ranks hold `shares` of a forward (one GPU's stage times of
    a block: `denoise_ms` for its `forwards` forwards, `decode_ms`), communication free. A block's denoising steps
    cross every stage one after the other and only the cache refresh overlaps the next block, so a block takes at
    least (forwards - 1) forwards plus the largest stage's share of one, and no rank does more than its forwards in a
    block period. When the last DiT rank also decodes, the decode sits in that chain: the last stage takes part in
    every step, so only the first stage's part of the next block's first step runs beside it (decode + forwards - 1
    forwards + the last stage's share)."""
    per = denoise_ms / forwards
    busy = [per * forwards * sh for sh in shares]
    if decoder_shares_last:
        chain = decode_ms + per * (forwards - 1 + shares[-1])
        busy[-1] += decode_ms
    else:
        chain = per * (forwards - 1 + max(shares))
        busy.append(decode_ms)
    return frames / max(chain, *busy) * 1e3


def _split(run: pd.DataFrame):
    """(the layout's variant, e.g. 'stage-split x2', its fps row, the single-GPU fps row) of a streaming run."""
    fps = run[(run["metric"] == "fps") & (run["variant"] != "one GPU")]
    if not len(fps):
        return None, None, None
    v = fps["variant"].iloc[-1]
    return v, fps.iloc[-1], row_of(run, "fps", "one GPU")


def _rollouts(run: pd.DataFrame) -> list[dict]:
    """Data-parallel: per batch, every rank's episodes per second against one GPU alone."""
    rows = []
    for _, r in run[(run["metric"] == "episodes_per_s") & run["variant"].str.contains(r" x\d+, batch ")].iterrows():
        batch = r["variant"].rsplit("batch ", 1)[1]
        alone = row_of(run, "episodes_per_s", f"one GPU, batch {batch}")
        rows.append({"batch": batch, "ranks": r["variant"].split(",")[0], "episodes/s": number(r["value"]),
                     "one GPU alone": number(alone["value"]) if alone is not None else float("nan"),
                     "gate": r.get("gate", "")})
    return rows


def headline(run: pd.DataFrame) -> dict:
    v, split, one = _split(run)
    if v is not None:
        out = {"layout": v, "FPS": fmt_spread(split), "one GPU, FPS": fmt_spread(one)}
        if one is not None:
            out["speedup"] = fmt(number(split["value"]) / number(one["value"]), "{:.2f}x")
        out["first frame ms"] = fmt_spread(row_of(run, "first_frame_ms", v), "{:.0f}")
        out["one GPU, first frame ms"] = fmt_spread(row_of(run, "first_frame_ms", "one GPU"), "{:.0f}")
        return out
    rows = _rollouts(run)
    if not rows:
        return {}
    best = max(rows, key=lambda r: r["episodes/s"] / r["one GPU alone"] if r["one GPU alone"] else 0)
    return {"layout": best["ranks"], "batch": best["batch"], "episodes/s": fmt(best["episodes/s"]),
            "one GPU alone": fmt(best["one GPU alone"]),
            "scaling": fmt(best["episodes/s"] / best["one GPU alone"], "{:.2f}x"), "frames vs rank 0": best["gate"]}


def published(df: pd.DataFrame) -> list[str]:
    """Per workload, preset and layout its latest run: the layout against one GPU of the same job."""
    parts = []
    for r in latest_runs(df, NOTEBOOK, by="layout"):
        h = headline(r)
        if not h:
            continue
        parts.append(f"\n**08 · beyond one GPU, {r['workload'].iloc[0]} / {r['preset'].iloc[0]}** ({device_label(r)}; "
                     "one GPU measured in the same job)\n")
        parts.append(md_table([h]))
    return parts


def _more_gpus(run: pd.DataFrame, gpus: int = 4) -> str:
    """What `gpus` GPUs could give at best (layout_bounds from the run's stored single-GPU stage times), one
    sentence; empty when the rows lack them."""
    from ..models.vae import pixel_frames_for  # noqa: PLC0415  heavy: torch
    from ..workloads import get  # noqa: PLC0415  the preset's forwards a block

    den, dec = row_of(run, "denoise_ms_per_block", "one GPU"), row_of(run, "decode_ms_per_block", "one GPU")
    try:
        preset = get(run["workload"].iloc[0]).presets[run["preset"].iloc[0]]
        forwards = preset.forwards_per_block
        frames = pixel_frames_for(preset.num_frame_per_block, False)  # a steady block's pixel frames
    except (KeyError, AttributeError, ValueError):
        return ""
    if den is None or dec is None:
        return ""
    d, c = number(den["value"]), number(dec["value"])
    return "More GPUs, at best (ideal parts from these stage times): " + bounds_sentence(
        layout_bounds(forwards, d, c, frames, gpus), forwards)


def bounds_sentence(bounds: pd.DataFrame, forwards: int) -> str:
    """The best layout_bounds row at the most GPUs of `bounds`, and why a layer pipeline gains little, one sentence
    (the notebook's interpretation and the published findings)."""
    gpus = bounds.index.get_level_values("GPUs").max()
    top = bounds.xs(gpus, level="GPUs")
    best = top["bound FPS"].idxmax()
    return (f"{gpus} GPUs {top.loc[best, 'bound FPS']:.0f} FPS ({best[0]} DiT + {best[1]} decoder ranks, limited by "
            f"the {top.loc[best, 'limited by']}), the best of {len(top)} layouts: a pipeline of the DiT's layers "
            f"shortens a block's {forwards} forwards only to {forwards - 1} + 1/P, since each denoising step waits "
            "for the one before.")


def batch_knee(eps: pd.Series) -> tuple[object, bool]:
    """One GPU's episodes per second by batch (ascending): the batch up to which they grow, i.e. the last before a
    step of the sweep adds less than 10%, and whether they still grow at the largest batch run."""
    for b, prev in zip(eps.index[1:], eps.index[:-1]):
        if eps[b] < 1.1 * eps[prev]:
            return prev, False
    return eps.index[-1], True


def sweep_sentence(eps: pd.Series) -> str:
    """Where one GPU's throughput stops growing over a batch sweep (the notebook's interpretation and the published
    findings), one sentence."""
    knee, growing = batch_knee(eps)
    seen = ", ".join(f"{eps[b]:.3g} at batch {b}" for b in eps.index)
    gain = eps[knee] / eps.iloc[0]
    if growing:
        return (f"One GPU's episodes per second ({seen}) still grow at the largest batch run ({knee}: {gain:.2f}x "
                "batch 1).")
    return (f"One GPU's episodes per second ({seen}) stop growing past batch **{knee}** ({gain:.2f}x batch 1): beyond "
            "it a step of the sweep adds less than 10%.")


def findings(run: pd.DataFrame) -> Findings:
    v, split, one = _split(run)
    links = [("against one GPU", "#Against-one-GPU"), ("where each rank's time goes", "#Where-each-rank's-time-goes")]
    if v is not None:
        s, o = number(split["value"]), number(one["value"]) if one is not None else float("nan")
        first, first1 = row_of(run, "first_frame_ms", v), row_of(run, "first_frame_ms", "one GPU")
        ratio = number(first["value"]) / number(first1["value"]) if first is not None and first1 is not None \
            else float("nan")
        eq = row_of(run, "frames_bit_equal", v)
        psnr = row_of(run, "psnr_db", v)
        quality = ("frames bit-equal to the single-GPU run's" if eq is not None and number(eq["value"]) == 1 else
                   f"frames {fmt(psnr['value'], '{:.1f}')} dB from the single-GPU run's" if psnr is not None else
                   f"gate {split.get('gate', '')}")
        head = (f"**{v}: {fmt_spread(split, '{:.1f}')} FPS** against {fmt_spread(one, '{:.1f}')} for the same stack on "
                f"one GPU in the same job (**{s / o:.2f}x**); first frame {fmt(number(first['value']), '{:.0f}')} ms "
                f"({ratio:.2f}x one GPU's); {quality}.")
        gpus = int(v.rsplit("x", 1)[1])
        target = STREAM_GOAL_FPS.get(gpus)
        goal = ((f"Goals ({gpus} GPUs): {target} FPS: **{'met' if s >= target else 'missed'}** ({s:.1f}); " if target
                 else f"Goals: no FPS goal for {gpus} GPUs (2: 120, 4: 200); ")
                + f"first frame at most 1.15x one GPU's: **{'met' if ratio <= 1.15 else 'missed'}** ({ratio:.2f}x).")
        more = _more_gpus(run)
        nxt = ("Read the timeline: the slower stage sets the block period." if v.startswith("stage-split") else
               "Read the timeline: the slowest strip sets when a block's frame is whole, the denoiser the block "
               "period." if v.startswith("decoder-split") else
               "Read the timeline and the layer table: a block's steps cross every stage in turn.") + (
            f" {more}" if more else "")
        return Findings(head, goal, nxt, links)
    rows = _rollouts(run)
    best = max(rows, key=lambda r: r["episodes/s"] / r["one GPU alone"] if r["one GPU alone"] else 0)
    scale = best["episodes/s"] / best["one GPU alone"]
    n = int(best["ranks"].rsplit("x", 1)[1])
    psnr = row_of(run, "psnr_vs_rank0_db", f"{best['ranks']}, batch {best['batch']}")
    quality = (f"the lowest PSNR of a rank's frames against rank 0's {fmt(psnr['value'], '{:.1f}')} dB (gate "
               f"{best['gate']})" if psnr is not None else
               "every rank's frames bit-equal to rank 0's" if best["gate"] == "pass" else
               "a rank's frames differ from rank 0's (gate fail; their PSNR was not stored)")
    head = (f"**{best['ranks']}, batch {best['batch']}: {fmt(best['episodes/s'])} episodes/s**, {scale:.2f}x one GPU "
            f"alone at the same batch ({n} would be perfect); {quality}.")
    goal = ("Goal (4 GPUs: at least 3.6x one GPU): "
            + (f"**{'met' if scale >= 3.6 else 'missed'}** ({scale:.2f}x)." if n == 4 else
               f"not judged by a run of {n} ranks."))
    alone = pd.Series({int(r["batch"]): r["one GPU alone"] for r in rows}).sort_index().dropna()
    sweep = (sweep_sentence(alone) if len(alone) > 1 else
             "One batch size was run: the sweep (`batches`) says where one GPU's throughput stops growing.")
    return Findings(head, goal, sweep, links)
