"""Notebook 02 (bottleneck breakdown): record (or load) a labelled trace, break it down, turn the numbers into
findings, and run a profiling session with monitors for its report.

The trace analysis itself lives in wmbook.profiling (parse once, one function per question); which region and
labels to read comes from the workload object.
"""

from __future__ import annotations

import contextlib
import math
from pathlib import Path

from tqdm.auto import tqdm

from .. import display as _display
from .. import results as results_store
from ..bench import Samples
from ..params import (
    DEVICE,
    DTYPE,
    OUTPUT_DIR,
    PRESET,
    RESULTS_PATH,
    SEED,
    VAE_DTYPE,
    WARMUP,
    Param,
    ParameterError,
    boolean,
    integer,
)
from ..profiling import ProfilingSession, measure_overhead, profile, set_labels
from ..profiling.breakdown import analyze
from ..profiling.config import load_config
from ..runconfig import WORKLOAD, NotebookSpec, RunConfig
from ..runconfig import validate as _validate

NOTEBOOK = "02_bottleneck_breakdown"


def _trace(v, ctx):
    if not isinstance(v, (str, Path)):
        raise ParameterError(f"trace={v!r} is not allowed; allowed values: '' (record afresh) or a path to a "
                             f".json / .json.gz Chrome trace")
    if not str(v):
        return None
    p = Path(v)
    if not p.is_file() or not (p.name.endswith(".json") or p.name.endswith(".json.gz")):
        raise ParameterError(f"trace={str(v)!r} is not allowed; allowed values: '' (record afresh) or an existing "
                             f".json / .json.gz Chrome trace file")
    return p


def _region(v, ctx):
    if v == "auto":
        return ctx["workload"].labels.region
    if not isinstance(v, str) or not v:
        raise ParameterError(f"region={v!r} is not allowed; allowed values: 'auto' or a label name")
    return v


def _profiling_config(v, ctx):
    try:
        load_config(v)
    except ValueError as e:
        raise ParameterError(f"profiling_config={v!r} is not allowed: {e}; allowed values: 'development', "
                             f"'production' or the path of a YAML file") from None
    return v if isinstance(v, str) else "custom"


SPEC = NotebookSpec(NOTEBOOK, (
    WORKLOAD, PRESET, DEVICE, DTYPE, VAE_DTYPE, WARMUP,
    Param("trace", "", _trace, "empty: record a trace afresh; or a .json/.json.gz trace to analyse"),
    Param("region", "auto", _region, "label whose device time is broken down; auto: the workload's region"),
    Param("detail", True, boolean, "fine labels inside the forward while tracing"),
    Param("profiling_config", "development", _profiling_config, "development | production | a YAML path"),
    Param("measure_overhead", True, boolean, "time the pipeline with and without the session's monitors"),
    Param("overhead_pairs", 8, integer(2),
          "paired runs (one without, one inside a session) of the overhead measurement"),
    OUTPUT_DIR, RESULTS_PATH, SEED),
    quick={"measure_overhead": False})


def validate(**params) -> RunConfig:
    """Check every notebook-02 parameter before any heavy work (errors name the parameter and allowed values)."""
    return _validate(SPEC, **params)


def record_trace(run_fn, cfg: RunConfig, name: str = "02_breakdown_trace") -> Path:
    """One traced call of run_fn (after cfg.warmup untraced calls and one profiler warm-up call), fine labels on
    and input shapes recorded (needed for the roofline); returns the gzip trace path."""
    for _ in tqdm(range(cfg.warmup), desc="warm-up (untraced)", leave=False):
        run_fn()
    set_labels(True, detail=cfg.options.detail)
    try:
        res = profile(run_fn, wait=0, warmup=1, active=1, out_dir=cfg.output_dir, name=name, record_shapes=True)
    finally:
        set_labels(True, detail=False)
    return res.trace_path


def breakdown(trace, cfg: RunConfig, ceilings: dict | None):
    """The breakdown of the configured region, with the workload's forward and fine labels."""
    labels = cfg.workload.labels
    return analyze(trace, region=cfg.options.region, ceilings=ceilings, forward_label=labels.forward,
                   fine_labels=labels.fine)


def session_report(pipe, inputs, cfg: RunConfig, bd, ceilings: dict, show_monitor: bool = False):
    """Run the pipeline once inside a ProfilingSession (monitors on, tracing off), attach the breakdown and the
    measured profiling overhead, write the JSON + HTML session report. Returns (session, paths, overhead).

    show_monitor: show the session's GPU/CPU monitor live in the notebook (wmbook.display.monitor_view; a static
    snapshot in headless runs) in place of the monitor's console status lines (the config's real_time_display
    still prints them, into a filter that drops them: what is measured is unchanged)."""
    wl, opt = cfg.workload, cfg.options
    overhead = None
    quiet = _display.drop_lines if show_monitor else contextlib.nullcontext
    if opt.measure_overhead:
        gen = wl.generate_callable(pipe, inputs, cfg)
        with quiet():
            overhead = measure_overhead(gen, config=opt.profiling_config, pairs=opt.overhead_pairs, warmup=1,
                                        device=cfg.device, seed=cfg.seed)
    tags = {"notebook": NOTEBOOK, "workload": wl.name, "preset": cfg.preset.name}
    session = ProfilingSession(f"{NOTEBOOK}-{cfg.preset.name}", config=opt.profiling_config, device=cfg.device,
                               tags=tags, output_dir=cfg.output_dir / "session")
    session.config = session.config.replace(generate_final_report=False)  # written below, with the breakdown
    with quiet(), session:
        view = _display.monitor_view(session).start() if show_monitor and session.monitor is not None else None
        try:
            wl.session_run(pipe, inputs, cfg, session)
        finally:
            if view is not None:
                view.stop()
    session.set_metrics(ceilings={k: ceilings.get(k) for k in ("gemm_tflops", "copy_gbps", "sdpa_tflops")})
    session.attach_breakdown(bd)
    if overhead is not None:
        session.set_overhead(overhead)
    paths = session.write_report()
    return session, paths, overhead


_SUMMARY_UNITS = (("busy_ms", "ms"), ("idle_share", "fraction"), ("kernels_per_forward", "kernels"),
                  ("short_kernel_share", "fraction"), ("forward_ms", "ms"), ("syncs_in_forward", "count"),
                  ("casts_per_forward", "count"), ("gemm_tflops", "TFLOP/s"), ("gemm_frac_of_ceiling", "fraction"),
                  ("attention_tflops", "TFLOP/s"), ("attention_frac_of_ceiling", "fraction"),
                  ("conv_tflops", "TFLOP/s"), ("busy_over_host", "fraction"))


def result_rows(cfg: RunConfig, bd, overhead: dict | None = None) -> list[dict]:
    """Category shares, idle/launch statistics and achieved throughput as results rows."""
    common = dict(notebook=NOTEBOOK, workload=cfg.workload.name, preset=cfg.preset.name, variant="eager",
                  params=cfg.params(), warmup=cfg.warmup, repeats=1)
    rows = [results_store.make_row(metric=f"category_share:{r['category']}", value=float(r["share"]),
                                   unit="fraction", **common) for _, r in bd.categories.iterrows()]
    s = bd.summary()
    for key, unit in _SUMMARY_UNITS:
        v = s.get(key)
        if v is not None and not (isinstance(v, float) and math.isnan(v)):
            rows.append(results_store.make_row(metric=key, value=float(v), unit=unit, **common))
    if overhead:
        ab = Samples([float(v) for v in overhead.get("ratios", [])], "fraction") if overhead.get("ratios") else None
        rows.append(results_store.make_row(metric="profiling_overhead", value=float(overhead["overhead_frac"]),
                                           unit="fraction", timing=ab, **common))
        rows.append(results_store.make_row(metric="profiling_overhead_accounted",
                                           value=float(overhead["accounted_frac"]), unit="fraction", **common))
    return rows


def interpret(cfg: RunConfig, bd, overhead: dict | None = None) -> str:
    """Sentences computed from the breakdown's numbers."""
    s = bd.summary()
    basis = "GPU kernel time" if bd.source == "gpu" else "CPU self time of aten ops (the trace has no device activity)"
    top = bd.categories.head(3)
    cats = ", ".join(f"{c} {sh:.0%}" for c, sh in zip(top["category"], top["share"]))
    lines = [f"In `{cfg.options.region}` ({s['busy_ms']:.1f} ms of {basis}), the largest operator categories are "
             f"{cats}."]
    if bd.source == "gpu" and s.get("idle_share") == s.get("idle_share"):
        lines.append(f"The GPU is idle {s['idle_share']:.0%} of the region's span ({s['idle_ms']:.1f} ms): "
                     f"kernels run {s['busy_over_host']:.0%} of the host time the region takes, with "
                     f"{s['kernels_per_forward']:.0f} kernel launches per forward, "
                     f"{s['short_kernel_share']:.0%} of them under 10 us.")
    fs = bd.forward_split
    if len(fs):
        f0 = fs.iloc[0]
        lines.append(f"Inside one forward ({s['forward_ms']:.3g} ms of {bd.basis} time, mean over "
                     f"{fs.attrs['forwards']} forwards), `{f0['fine_label']}` takes the most: {f0['share']:.0%}.")
    for key, what in (("gemm", "GEMMs"), ("attention", "attention")):
        tf, frac = s.get(f"{key}_tflops"), s.get(f"{key}_frac_of_ceiling")
        if tf is not None and frac is not None:
            lines.append(f"{what} achieve {tf:.3g} TFLOP/s, {frac:.0%} of the measured ceiling.")
    if len(bd.suggestions):
        sg = bd.suggestions.iloc[0]
        lines.append(f"First suggestion: {sg['finding']} ({sg['evidence']}) -> notebook {sg['notebook']}.")
    if overhead:
        b, i = overhead["baseline_ms"], overhead["session_ms"]
        lo, hi = overhead["overhead_ci90"]
        verdict = ("not distinguishable from zero at this run-to-run spread" if lo <= 0 <= hi
                   else "a measurable cost" if lo > 0 else "faster inside the session, i.e. noise")
        lines.append(f"Profiling overhead with monitors on and tracing off (`{overhead['config']}` config): "
                     f"{overhead['overhead_frac']:+.1%} (median of {overhead['pairs']} paired runs, p20-p80 "
                     f"{overhead['overhead_p20']:+.1%} to {overhead['overhead_p80']:+.1%}, 90% interval of the median "
                     f"{lo:+.1%} to {hi:+.1%}; {i['median']:.1f} vs {b['median']:.1f} ms), {verdict}.")
        acc = overhead["accounted"]
        lines.append(f"Accounted part by part, the session adds {overhead['accounted_frac']:.2%} to the launching "
                     f"thread: {acc['timed_labels_per_call']:.0f} timed labels per run x "
                     f"{acc['us_per_timed_label']:.1f} "
                     f"us = {acc['labels_frac']:.2%}, and the sampler thread's {acc['sampler_frac']:.2%} of the wall "
                     f"time (an upper bound on what it can take from the launching thread).")
    if cfg.tiny:
        lines.append("Tiny-preset numbers: they check the analysis, not the speed of the real model.")
    return " ".join(lines)


def plot_dashboard(bd):
    """Category bars, per-forward split, roofline: one figure."""
    import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

    fig, axes = plt.subplots(1, 3, figsize=(17, 4.2), gridspec_kw={"width_ratios": [1, 1, 1.1]})
    bd.plot_categories(ax=axes[0])
    bd.plot_forward_split(ax=axes[1])
    bd.plot_roofline(ax=axes[2])
    fig.tight_layout()
    return fig
