"""Notebook 08 (beyond one GPU): the workload's stream spread over several processes with torch.distributed
(wmbook.distributed), on notebook 06's best stack, measured beside that stack on one GPU in the same job.

Layouts: `stage-split` (streaming workloads: rank 0 denoises, rank 1 decodes), `dit-pipeline` (the DiT's layers over
ranks, one rank decodes), `decoder-split` (rank 0 denoises, the other ranks decode strips of the frame with halo
exchange), `pipeline-split` (the DiT's layers over all ranks but two, which decode the frame's halves) and
`data-parallel` (interaction loops: one loop per rank, a batch sweep). Per layout: the
end-to-end rate and first frame (streaming) or episodes per second (loops), the single-GPU run beside it, the bound
the single-GPU stage times set, each rank's busy and idle time, the bytes and time on the wire, a timeline per rank
and the rank sessions merged (wmbook aggregate). A failed job's rows are stored as a cut run, never mixed with
whole ones.
"""

from __future__ import annotations

import math

import matplotlib.pyplot as plt
import pandas as pd
import torch

from .. import distributed as dist_jobs
from .. import results as results_store
from ..display import headless
from ..params import DEVICE, OUTPUT_DIR, PRESET, REPEATS, RESULTS_PATH, SEED, WARMUP, Param, ParameterError, integer
from ..profiling.aggregate import aggregate_reports
from ..runconfig import WORKLOAD, NotebookSpec, RunConfig
from ..runconfig import validate as _validate
from ..variants import Variant
from . import graphs as study06
from .multi_gpu_report import bounds_sentence, layout_bounds, pipeline_bound, sweep_sentence

NOTEBOOK = "08_multi_gpu"
STREAM_LAYOUTS = dist_jobs.STREAM_LAYOUTS
LAYOUT_NAMES = {"stage-split": "stage split", "dit-pipeline": "DiT pipeline", "decoder-split": "decoder split",
                "pipeline-split": "DiT pipeline + decoder halves"}
PIPELINE_LAYOUTS = dist_jobs.PIPELINE_LAYOUTS


def _layout(v, ctx):
    wl = ctx["workload"]
    fits = [n for n, lay in dist_jobs.LAYOUTS.items() if lay.requires <= wl.features]
    if v == "auto":
        return fits[0]
    if v not in fits:
        raise ParameterError(f"layout={v!r} is not allowed for workload {wl.name!r}; allowed values: "
                             f"['auto', {', '.join(repr(f) for f in fits)}]")
    return v


def _nproc(v, ctx):
    n = integer(0)(v, ctx)
    lay = dist_jobs.LAYOUTS[ctx["layout"]]
    gpus = torch.cuda.device_count() if ctx["device"].type == "cuda" else None
    if n == 0:  # as many ranks as the layout takes and the host has (its fewest on a CPU)
        n = lay.max_ranks or (gpus if gpus else max(2, lay.min_ranks))
    if n < lay.min_ranks or (lay.max_ranks is not None and n > lay.max_ranks):
        hi = lay.max_ranks
        raise ParameterError(f"nproc={v!r} is not allowed for layout {ctx['layout']!r}; allowed values: 0 (auto) or "
                             + (str(hi) if hi == lay.min_ranks else f"{lay.min_ranks}..{hi or 'the GPU count'}"))
    if gpus is not None and n > gpus:
        raise ParameterError(f"nproc={n} needs {n} GPUs (one per rank); this host has {gpus}")
    return n


def _batches(v, ctx):
    if v == "auto":
        return (1, 2, 4, 8) if ctx["device"].type == "cuda" else (1, 2)
    if isinstance(v, int) and not isinstance(v, bool):  # `-p batches 4` on the command line
        v = [v]
    elif isinstance(v, str):  # `-p batches 1,2,4`
        try:
            v = [int(b) for b in v.split(",")]
        except ValueError:
            raise ParameterError(f"batches={v!r} is not allowed; allowed values: 'auto' or a list of integers >= 1 "
                                 "(e.g. '1,2,4')") from None
    if not isinstance(v, (list, tuple)) or not v or any(isinstance(b, bool) or not isinstance(b, int) or b < 1
                                                        for b in v):
        raise ParameterError(f"batches={v!r} is not allowed; allowed values: 'auto' or a list of integers >= 1 "
                             "(e.g. '1,2,4')")
    return tuple(v)


_P06 = {p.name: p for p in study06.SPEC.params}  # notebook 06's parameters: its stack and compile backend rules


SPEC = NotebookSpec(NOTEBOOK, (
    WORKLOAD, PRESET, DEVICE,
    Param("layout", "auto", _layout, "auto: stage-split for a streaming workload, data-parallel for interaction loops; "
          "dit-pipeline: the DiT's layers over ranks; decoder-split: rank 0 denoises, the others decode strips; "
          "pipeline-split: the DiT's layers over all ranks but two, which decode the frame's halves"),
    Param("nproc", 0, _nproc, "ranks, one per GPU; 0: 2 for stage-split, every GPU otherwise (on a CPU the "
          "layout's fewest: 3 for decoder-split, 4 for pipeline-split, else 2)"),
    Param("base", "auto", _P06["base"].check, "the single-GPU stack on every rank; auto: notebook 06's best (its "
          "base + graph rows)"),
    Param("blocks", 0, integer(0), "blocks per streaming run; 0: 8 on a GPU, 3 on a CPU"),
    Param("ddim_steps", 2, integer(1), "DDIM steps per pass of an interaction loop (2: notebook 03's knee at wma)"),
    Param("batches", "auto", _batches, "episodes per forward swept by data-parallel rollouts; auto: 1, 2, 4, 8 on a "
          "GPU, 1, 2 on a CPU"),
    Param("timeout_s", 900, integer(10), "a rank waiting longer than this on another ends the job"),
    WARMUP.with_default(1), REPEATS.with_default(3), OUTPUT_DIR, RESULTS_PATH, SEED), workload_params=False,
    gpus="all", quick={"repeats": 2})


def validate(**params) -> RunConfig:
    """Check every notebook-08 parameter before any process starts; errors name the parameter and allowed values."""
    return _validate(SPEC, **params)


def single_gpu_stack(cfg: RunConfig) -> list[Variant]:
    """The stack every rank applies: `base`, or notebook 06's best (its base, then its graph and decoder rows)."""
    if cfg.options.base is not None:
        return list(cfg.options.base)
    c06 = study06.validate(workload=cfg.workload.name, preset=cfg.preset.name, device=str(cfg.device))
    return study06.base_stack(c06) + study06.graph_steps(c06)


def job(cfg: RunConfig) -> dist_jobs.JobSpec:
    """The job this run starts (checked against the host before any process starts)."""
    o = cfg.options
    gpu = cfg.device.type == "cuda"
    spec = dist_jobs.JobSpec(
        workload=cfg.workload.name, preset=cfg.preset.name, layout=o.layout, nproc=o.nproc,
        device="cuda" if gpu else "cpu", stack=tuple(v.name for v in single_gpu_stack(cfg)),
        compile_backend=_P06["compile_backend"].check("auto", {"device": cfg.device, "_name": "compile_backend"}),
        blocks=o.blocks or (8 if gpu else 3), ddim_steps=o.ddim_steps, batches=o.batches, warmup=cfg.warmup,
        repeats=cfg.repeats, seed=cfg.seed, timeout_s=float(o.timeout_s))
    try:
        dist_jobs.check_job(spec)
    except dist_jobs.JobError as e:
        raise ParameterError(str(e)) from None
    return spec


def run(cfg: RunConfig, progress: bool = True) -> dist_jobs.JobResult:
    """Start the job (one process per rank, torchrun), show its progress, store its rows; a failed job's finished
    ranks' rows are stored as a cut run (marked with the failure) and the failure raised."""
    spec = job(cfg)
    try:  # a headless run (papermill) shows the runner's own progress: a bar here would print every update
        res = dist_jobs.run_job(spec, cfg.output_dir / "jobs", progress=progress and not headless())
    except dist_jobs.JobFailed as e:
        rows = result_rows(cfg, spec, {r: v for r, v in e.partial.items()})
        if rows:
            results_store.append(rows, cfg.results_path)
            results_store.mark_cut(rows[0]["run_id"], f"multi-GPU job failed: {str(e).splitlines()[0]}",
                                   cfg.results_path)
        raise
    results_store.append(result_rows(cfg, spec, dict(enumerate(res.ranks))), cfg.results_path)
    return res


def _summary(s: dict | None) -> tuple[float, float, float]:
    return (s["median"], s["p20"], s["p80"]) if s else (math.nan, math.nan, math.nan)


def layout_bound(res: dist_jobs.JobResult) -> float:
    """The FPS a streaming layout can reach at best from the single-GPU stage times of its job: the stage split the
    slower stage; the DiT pipeline its measured layer shares (pipeline_bound)."""
    return _bound(res.spec, res.ranks[0])


def _bound(spec: dist_jobs.JobSpec, rank0: dict) -> float:
    single = rank0["single"]
    steady, den, dec = (single["frames_per_block"][-1], single["denoise_ms"]["median"],
                        single["decode_ms"]["median"])
    if spec.layout == "stage-split":
        return steady / max(den, dec) * 1e3
    if spec.layout == "decoder-split":  # the decode shared evenly by the strip ranks, the halo exchanges free
        return steady / max(den, dec / (spec.nproc - 1)) * 1e3
    ms, ranges = rank0["layer_ms"], rank0["layer_ranges"]
    shares = [sum(ms[a:b]) / sum(ms) for a, b in ranges]
    if spec.layout == "pipeline-split":  # the decode shared by the two halves, the halo exchanges free
        dec /= dist_jobs.HALVES
    return pipeline_bound(len(single["forward_ms"][-1]), den, dec, steady, shares,
                          decoder_shares_last=len(ranges) == spec.nproc)


def layer_table(res: dist_jobs.JobResult) -> pd.DataFrame:
    """DiT pipeline: each DiT rank's layers, their share of a forward (measured per layer on rank 0; the first
    layer's time holds the embeddings) and whether the rank also decodes."""
    r0 = res.ranks[0]
    ms = r0["layer_ms"]
    rows = []
    for r, (a, b) in enumerate(r0["layer_ranges"]):
        rows.append({"rank": r, "layers": f"{a}-{b - 1}", "count": b - a, "ms a forward (eager)": sum(ms[a:b]),
                     "share of a forward": sum(ms[a:b]) / sum(ms),
                     "also decodes": len(r0["layer_ranges"]) == res.spec.nproc and r == res.spec.nproc - 1})
    return pd.DataFrame(rows).set_index("rank")


def stream_table(res: dist_jobs.JobResult) -> pd.DataFrame:
    """A streaming layout (stage split, DiT pipeline) against the single-GPU stack measured in the same job, and the
    bound the single-GPU stage times set (layout_bound)."""
    den, dec = res.ranks[0], res.ranks[-1]
    single = den["single"]
    bound = layout_bound(res)
    name = LAYOUT_NAMES[res.spec.layout]
    rows = []
    for what, fps, first in (("one GPU (the whole stack)", single["fps"], single["first_frame_ms"]),
                             (f"{name} over {res.spec.nproc} GPUs", dec["fps"], dec["first_frame_ms"])):
        f, f20, f80 = _summary(fps)
        ff, ff20, ff80 = _summary(first)
        rows.append({"run": what, "FPS": f, "FPS p20": f20, "FPS p80": f80, "first frame ms": ff,
                     "first frame p20": ff20, "first frame p80": ff80})
    t = pd.DataFrame(rows).set_index("run")
    t["speedup"] = t["FPS"] / t["FPS"].iloc[0]
    t["first frame x one GPU"] = t["first frame ms"] / t["first frame ms"].iloc[0]
    t.attrs["bound_fps"] = bound
    t.attrs["stage_ms"] = {"denoise": single["denoise_ms"]["median"], "decode": single["decode_ms"]["median"]}
    return t


def stage_bounds(res: dist_jobs.JobResult, max_gpus: int = 4) -> pd.DataFrame:
    """layout_bounds from a streaming job's single-GPU run (its stage times, medians over the steady blocks)."""
    single = res.ranks[0]["single"]
    return layout_bounds(len(single["forward_ms"][-1]), single["denoise_ms"]["median"], single["decode_ms"]["median"],
                         single["frames_per_block"][-1], max_gpus)


def rank_table(res: dist_jobs.JobResult) -> pd.DataFrame:
    """Per rank: its role, busy and idle time of one run (medians), and the wire: bytes per block, one-way time."""
    rows = []
    for r in res.ranks:
        busy, wall = r["busy_ms"]["median"], r["wall_ms"]["median"]
        w = r.get("wire") or {}
        rows.append({"rank": r["rank"], "role": r.get("role", "rollouts"), "busy ms": busy, "idle ms": wall - busy,
                     "idle share": 1 - busy / wall if wall else math.nan, "wall ms": wall,
                     "wire bytes / block": w.get("bytes"), "wire one-way ms": (w.get("one_way_ms") or {}).get("median"),
                     "wire GB/s": w.get("gbps")})
    return pd.DataFrame(rows).set_index("rank")


def gate_table(res: dist_jobs.JobResult) -> pd.DataFrame:
    """The layout's output against the single-GPU run of the same stack on the same rank (the clean latents on the
    rank that makes them, frames on the decoder)."""
    den = next(r for r in res.ranks if "latents_bit_equal" in r)
    dec = res.ranks[-1]
    return pd.DataFrame([
        {"output": f"latents (rank {den['rank']})", "bit-equal": den["latents_bit_equal"],
         "max abs diff": den["latents_max_abs_diff"], "PSNR dB": math.inf if den["latents_bit_equal"] else math.nan},
        {"output": "frames (decoder rank)", "bit-equal": dec["bit_equal"], "max abs diff": dec["max_abs_diff"],
         "PSNR dB": math.inf if dec["bit_equal"] else dec["psnr_db"]}]).set_index("output")


# the PSNR a layout's output must keep from the single-GPU (or rank 0's) output where it is not bit-equal
GATE_DB = 45.0


def _rank0_gate(per: list[dict]) -> tuple[bool, float]:
    """Data-parallel: whether every rank's frames (same stack, same seed) match rank 0's, and the lowest PSNR of those
    that differ (inf when all are bit-equal). Ranks on different GPUs of one kind may round differently (notebook
    06's wma stack on two H200s: 48.3 dB, each GPU repeating itself; data/reports/NOTES.md), so the gate is GATE_DB,
    not bit-equality."""
    psnrs = [math.inf if p["bit_equal_to_rank0"] else float(p["psnr_vs_rank0_db"]) for p in per]
    low = min(psnrs)
    return low >= GATE_DB, low


def rollout_table(res: dist_jobs.JobResult) -> pd.DataFrame:
    """Data-parallel: per batch, episodes per second of one GPU alone and of every rank at once (their sum), the
    scaling over the single GPU, one GPU's iteration time (median, p20-p80), and every rank's frames against rank 0's
    (gate GATE_DB)."""
    rows = []
    for i, b in enumerate(res.ranks[0]["batches"]):
        per = [r["batches"][i] for r in res.ranks]
        total = sum(p["episodes_per_s"] for p in per)
        alone = b.get("alone_episodes_per_s", math.nan)
        it, it20, it80 = _summary(b.get("alone_iteration_ms"))
        ok, low = _rank0_gate(per)
        rows.append({"batch": b["batch"], "one GPU alone, episodes/s": alone,
                     "one GPU alone, iteration ms": f"{it:.0f} ({it20:.0f}-{it80:.0f})",
                     f"{len(per)} ranks, episodes/s": total, "scaling": total / alone if alone else math.nan,
                     "per rank, episodes/s": total / len(per),
                     "frames vs rank 0": "bit-equal" if math.isinf(low) else
                     f"{low:.1f} dB, {'pass' if ok else 'fail'}"})
    t = pd.DataFrame(rows).set_index("batch")
    t["one GPU: gain over batch 1"] = t["one GPU alone, episodes/s"] / t["one GPU alone, episodes/s"].iloc[0]
    return t


def plot_timeline(res: dist_jobs.JobResult, ax=None):
    """One row per rank: what it did when, over one timed run (ms from the common start)."""
    colors = {"denoise": "#4477aa", "decode": "#ee6677", "wait": "#dddddd"}
    ax = ax or plt.subplots(figsize=(11, 1.2 + 0.6 * len(res.ranks)))[1]
    for r in res.ranks:
        for s in r.get("spans", []):
            ax.barh(r["rank"], s["end_ms"] - s["start_ms"], left=s["start_ms"], color=colors[s["what"]],
                    edgecolor="white", height=0.6)
            if s["what"] != "wait":
                ax.text((s["start_ms"] + s["end_ms"]) / 2, r["rank"], str(s["block"]), ha="center", va="center",
                        fontsize=7, color="white")
    ax.set_yticks([r["rank"] for r in res.ranks],
                  [f"rank {r['rank']} ({r.get('role', 'rollouts')})" for r in res.ranks])
    ax.invert_yaxis()
    ax.set_xlabel("ms since the common start (blocks numbered; grey: waiting for latents)")
    ax.set_title("One run per rank")
    return ax


def plot_batches(t: pd.DataFrame, ax=None):
    """Data-parallel: episodes per second against batch, one GPU alone and all ranks."""
    ax = ax or plt.subplots(figsize=(6, 3.5))[1]
    for col in [c for c in t.columns if c.endswith("episodes/s") and not c.startswith("per rank")]:
        ax.plot(t.index, t[col], marker="o", label=col)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("episodes per forward (batch)")
    ax.set_ylabel("episodes per second")
    ax.legend(fontsize=8)
    return ax


def sessions(res: dist_jobs.JobResult):
    """The ranks' ProfilingSession reports merged (what `wmbook aggregate` prints): per rank and per stage."""
    return aggregate_reports(res.job_dir / "sessions", write=False)


def result_rows(cfg: RunConfig, spec: dist_jobs.JobSpec, ranks: dict[int, dict]) -> list[dict]:
    """The job's results rows (those of the ranks that finished): variant `<layout> x<nproc>`; the single-GPU run
    beside it as variant `one GPU`."""
    common = dict(notebook=NOTEBOOK, workload=cfg.workload.name, preset=cfg.preset.name, warmup=cfg.warmup,
                  repeats=cfg.repeats, params={**cfg.params(), "stack": list(spec.stack), "nproc": spec.nproc,
                                               "layout": spec.layout})
    v = f"{spec.layout} x{spec.nproc}"
    rows = []

    def add(variant, metric, value, unit, summary=None, **extra):
        if value is None or (isinstance(value, float) and not math.isfinite(value)):
            return
        row = results_store.make_row(variant=variant, metric=metric, value=float(value), unit=unit, **common, **extra)
        if summary:
            row.update({k: summary[k] for k in ("median", "p20", "p80", "p95", "n")})
        rows.append(row)

    for r, res in sorted(ranks.items()):
        spread = res["busy_ms"] if "p20" in res["busy_ms"] else None  # data-parallel ranks: one timed phase
        add(v, f"busy_ms:rank{r}", res["busy_ms"]["median"], "ms", spread)
        add(v, f"idle_ms:rank{r}", res["wall_ms"]["median"] - res["busy_ms"]["median"], "ms")
        if "wire" in res and r == 0:
            add(v, "wire_bytes_per_block", res["wire"]["bytes"], "bytes")
            add(v, "wire_one_way_ms", res["wire"]["one_way_ms"]["median"], "ms", res["wire"]["one_way_ms"])
    if spec.layout in STREAM_LAYOUTS:
        dec = spec.nproc - 1
        if 0 in ranks:
            s = ranks[0]["single"]
            add("one GPU", "fps", s["fps"]["median"], "frames/s", s["fps"])
            add("one GPU", "first_frame_ms", s["first_frame_ms"]["median"], "ms", s["first_frame_ms"])
            add("one GPU", "denoise_ms_per_block", s["denoise_ms"]["median"], "ms", s["denoise_ms"])
            add("one GPU", "decode_ms_per_block", s["decode_ms"]["median"], "ms", s["decode_ms"])
            add(v, "bound_fps", _bound(spec, ranks[0]), "frames/s")
        if dec in ranks:
            d = ranks[dec]
            gate = "pass" if d["bit_equal"] or (d["psnr_db"] or 0) >= GATE_DB else "fail"
            add(v, "fps", d["fps"]["median"], "frames/s", d["fps"], gate=gate)
            add(v, "first_frame_ms", d["first_frame_ms"]["median"], "ms", d["first_frame_ms"], gate=gate)
            add(v, "frames_bit_equal", float(d["bit_equal"]), "bool", gate=gate)
            add(v, "psnr_db", d["psnr_db"], "dB", gate=gate)  # stored where not bit-equal (inf is no number)
    else:
        for r, res in sorted(ranks.items()):
            for b in res["batches"]:
                bv = f"{v}, batch {b['batch']}"
                add(bv, f"episodes_per_s:rank{r}", b["episodes_per_s"], "episodes/s")
                add(bv, f"iteration_ms:rank{r}", b["iteration_ms"]["median"], "ms", b["iteration_ms"])
                if "alone_episodes_per_s" in b:
                    one = f"one GPU, batch {b['batch']}"
                    add(one, "episodes_per_s", b["alone_episodes_per_s"], "episodes/s")
                    add(one, "iteration_ms", b["alone_iteration_ms"]["median"], "ms", b["alone_iteration_ms"])
        if len(ranks) == spec.nproc:
            for i, b in enumerate(ranks[0]["batches"]):
                ok, low = _rank0_gate([ranks[r]["batches"][i] for r in ranks])
                gate = "pass" if ok else "fail"
                bv = f"{v}, batch {b['batch']}"
                add(bv, "episodes_per_s", sum(ranks[r]["batches"][i]["episodes_per_s"] for r in ranks), "episodes/s",
                    gate=gate)
                add(bv, "psnr_vs_rank0_db", low, "dB", gate=gate)  # stored where some rank differs (inf is no number)
    return rows


def interpretation(cfg: RunConfig, res: dist_jobs.JobResult) -> list[str]:
    """Sentences computed from the job's numbers."""
    if res.spec.layout in STREAM_LAYOUTS:
        t = stream_table(res)
        split, one = t.iloc[1], t.iloc[0]
        bound, st = t.attrs["bound_fps"], t.attrs["stage_ms"]
        slow = max(st, key=st.get)
        why = (f"The single-GPU stage times predict {bound:.0f} FPS (the slower stage, {slow}, takes {st[slow]:.1f} "
               f"ms a block there); the split runs at {split['FPS'] / bound:.0%} of that prediction (a GPU that runs "
               "one stage runs it at its own pace, not interleaved with the other)."
               if res.spec.layout == "stage-split" else
               f"The single-GPU stage times predict {bound:.0f} FPS with the decode shared evenly by "
               f"{res.spec.nproc - 1} strip ranks and free halo exchanges; the split runs at "
               f"{split['FPS'] / bound:.0%} of that (each strip rank decodes eagerly and exchanges halo rows before "
               "every spatial convolution)."
               if res.spec.layout == "decoder-split" else
               f"The single-GPU stage times and the measured layer shares predict {bound:.0f} FPS at best (a block's "
               "steps cross every stage one after the other; only the cache refresh overlaps the next block; a "
               f"rank's forwards and decodes add up); the pipeline runs at {split['FPS'] / bound:.0%} of that.")
        out = [f"Over {res.spec.nproc} ranks the stream runs at **{split['FPS']:.1f} FPS** (p20-p80 "
               f"{split['FPS p20']:.1f}-{split['FPS p80']:.1f}) against **{one['FPS']:.1f}** for the whole stack on "
               f"one GPU in the same job: **{split['speedup']:.2f}x**. " + why,
               f"First frame {split['first frame ms']:.0f} ms against {one['first frame ms']:.0f} ms on one GPU "
               f"({split['first frame x one GPU']:.2f}x): the first block still waits for every stage."]
        g = gate_table(res)
        fr = g.loc["frames (decoder rank)"]
        forwards = len(res.ranks[0]["single"]["forward_ms"][-1])
        out.append("Other layouts (upper bounds from the same stage times, in the table of bounds above): "
                   + bounds_sentence(stage_bounds(res), forwards))
        out.append("Gate: the clean latents the DiT ranks make are "
                   + ("bit-equal to" if g.iloc[0]["bit-equal"] else "not equal to")
                   + " the single-GPU run's; the decoded frames are "
                   + ("bit-equal" if fr["bit-equal"] else f"{fr['PSNR dB']:.1f} dB from the single-GPU frames "
                      f"(max abs diff {fr['max abs diff']:.3g}; gate 45 dB)") + ".")
        return out
    t = rollout_table(res)
    n = res.spec.nproc
    best = t["scaling"].idxmax()
    out = [f"{n} ranks run {t.loc[best, f'{n} ranks, episodes/s']:.3g} episodes per second at batch {best}: "
           f"**{t.loc[best, 'scaling']:.2f}x** one GPU alone at the same batch ({n:d} would be perfect)."]
    if len(t) == 1:
        out.append(f"One batch size was run ({t.index[0]}): where one GPU's throughput stops growing needs the sweep "
                   "(`batches`).")
    else:
        out.append(sweep_sentence(t["one GPU alone, episodes/s"]))
    gates = t["frames vs rank 0"]
    out.append("Gate: every rank's frames (same stack, same seed) are bit-equal to rank 0's." if (gates == "bit-equal")
               .all() else "Gate: every rank's frames (same stack, same seed) against rank 0's, by batch: "
               + ", ".join(f"{b}: {g}" for b, g in gates.items()) + f" (gate {GATE_DB:.0f} dB: two GPUs of one kind "
               "may round differently while each repeats itself bit for bit).")
    return out
