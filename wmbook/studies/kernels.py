"""Notebook 05 (fused Triton kernels and fp8 GEMMs): each kernel at the workload's real call sites against the
model's own unfused op sequence (eager) and what torch.compile generates for that sequence, in GB/s of the bytes
the op must move, as a share of the measured copy bandwidth; then ladder rows on top of notebook 04's best stack:
+ triton-fused (the kernels swapped into the denoiser), + vae-triton-fused (the decoder's norm + SiLU pairs),
+ fp8-static (fp8 GEMMs with static scales; torchao's dynamic ones are the variant fp8), each gated against the
fp32 reference.

Timing on a GPU: each implementation captured in a CUDA graph and replayed between CUDA events, the L2 flushed before
every replay (median and p20-p80): the kernels' GPU time with cold caches, not their Python launch path. On a CPU
the kernels run in Triton's interpreter on the tiny shapes: correctness only, no speed.
"""

from __future__ import annotations

import argparse
import math

import pandas as pd
import torch
from tqdm.auto import tqdm

from .. import results as results_store
from .. import variants, workloads
from ..bench import spin_up, time_fn
from ..check import compare
from ..graphs import GraphedCallable
from ..kernels import runs_triton
from ..models.attention import sage_call_counts
from ..params import DEVICE, OUTPUT_DIR, PRESET, REPEATS, RESULTS_PATH, SEED, WARMUP, Param, boolean, number
from ..presets import resolve_device
from ..runconfig import WORKLOAD, NotebookSpec, RunConfig
from ..runconfig import validate as _validate
from ..variants import Variant
from ..variants.builtin import fp8_static_unavailable, sage_unavailable
from ..variants.ladder import LadderSettings
from ..variants.ladder import run_ladder as _run
from .common import COMPILE_AHEAD, compile_backend, variant_stack
from .graphs import DENOISER_KERNELS, E2E_PARAMS, best_of_04, check_e2e, e2e_size, store_each_row

NOTEBOOK = "05_triton_kernels"


def _ladder(v, ctx):
    return ctx["device"].type == "cuda" if v == "auto" else boolean(v, ctx)


SPEC = NotebookSpec(NOTEBOOK, (
    WORKLOAD, PRESET, DEVICE,
    Param("kernel_table", True, boolean, "time every kernel at the workload's call sites (GPU) / check it (CPU)"),
    Param("rep_ms", 200, number(1, 10000), "milliseconds of repeated graph replays per kernel timing"),
    Param("ladder", "auto", _ladder, "the ladder rows on top of notebook 04's best stack; auto: on a GPU only (on a "
          "CPU the interpreted kernels take seconds per forward)"),
    Param("base", "auto", variant_stack(),
          "the stack the rows build on; auto: notebook 04's best (its ladder + compile)"),
    Param("steps", "auto", variant_stack(), "rows added to the base, in order; auto: triton-fused, norm-conv-bias + "
          "head-conv-gemm + upsample-fold + frames-norm-triton (wma), ffn-gelu-epilogue + action-norm-rope + "
          "fused-qkv (mg2), vae-triton-fused, vae-norm-conv-bias (wma), attn-sage "
          "(where sageattention is installed), fp8-static (where the device has FP8; the slowest row to build), "
          "attn-triton (mg2)"),
    Param("compile_backend", "auto", compile_backend, "auto: inductor on a GPU, aot_eager on a CPU"),
    WARMUP.with_default(3), REPEATS.with_default(10), *E2E_PARAMS, COMPILE_AHEAD,
    OUTPUT_DIR, RESULTS_PATH, SEED), workload_params=False, cross_check=check_e2e,
    quick={"rep_ms": 50, "warmup": 2, "repeats": 5, "e2e_repeats": 1}, builds_on=("04_compile_autocast",))


def validate(**params) -> RunConfig:
    """Check every notebook-05 parameter before any heavy work; errors name the parameter and allowed values."""
    return _validate(SPEC, **params)


# --- the kernel table --------------------------------------------------------------------------------------------

GATE_REL_L2 = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 2e-3}  # a fused op vs its fp32 reference


def _rel_l2(out, ref) -> float:
    """Relative L2 error of an op's output(s) against its reference (wmbook.check.compare); inf with any NaN/inf."""
    r = compare(out, ref)
    return r.rel_l2 if r.nan_count == 0 else math.inf


TIMED_GRAPH = "cuda-graph replay, L2 flushed"
TIMED_DO_BENCH = "do_bench, L2 flushed (capture failed)"


def _bench(fn, rep_ms: float, device: torch.device) -> tuple[float, float, float, str]:
    """(median, p20, p80 in ms, how it was timed) of fn's GPU work on a CUDA device, with cold caches and without the
    host's launch path.

    fn runs through wmbook.graphs.GraphedCallable (three eager warm-up calls: compile, autotuning; then captured) and
    its replays are timed with bench.time_fn's CUDA events, each after a 256 MB write that evicts the L2 (as
    triton.testing.do_bench flushes it), outside the timed span. Timing the graph, not fn, matters for kernels of a
    few microseconds: a Python launcher (argument checks, Triton's binder, a compiled graph's guards) can take
    longer to launch them than they take to run, and do_bench would then time the GPU waiting for the host
    (notebook 06 is where launch overhead is the subject). fn that cannot be captured falls back to do_bench. Starts
    after 100 ms of busy GPU (wmbook.bench.spin_up: clocks drop while compile runs)."""
    spin_up(device, 100.0)
    with torch.cuda.device(device):
        graphed = GraphedCallable(fn, name="kernel timing", warmup=3, clone_outputs=False, device=device)
        for _ in range(4):  # three eager calls, then the capture
            graphed()
        if not graphed.captured:
            from triton.testing import do_bench  # noqa: PLC0415  optional: triton

            med, p20, p80 = do_bench(fn, warmup=25, rep=rep_ms, quantiles=[0.5, 0.2, 0.8])
            return float(med), float(p20), float(p80), TIMED_DO_BENCH
        flush = torch.empty(256 << 20, dtype=torch.int8, device=device)
        est = time_fn(graphed, warmup=0, repeats=5, device=device, before=flush.zero_).min  # sizes the run to rep_ms
        s = time_fn(graphed, warmup=0, repeats=int(min(2000, max(20, rep_ms / max(est, 1e-3)))), device=device,
                    before=flush.zero_)
        graphed.reset()
        del flush
    return s.median, s.p20, s.p80, TIMED_GRAPH


def sweep_sites(workload: str, preset: str | None, device: torch.device, kernels: tuple[str, ...], settings_of,
                runner, name, rep_ms: float, site: str | None = None, cases_of=None) -> pd.DataFrame:
    """The launcher-setting sweeps' loop (tools/gn_sweep.py, tools/row_sweep.py): at each of the workload's kernel
    call sites of `kernels` (the preset's, default the real one on a GPU, the tiny one on a CPU), torch.compile of
    the model's op sequence as the reference row (GPU only), then each setting of settings_of(case): runner(case,
    inputs, setting) -> a 0-arg callable, gated against the fp32 reference like notebook 05 (relative L2 within twice
    the eager sequence's, at least GATE_REL_L2) and timed with _bench when it passes (GPU only); a setting Triton
    cannot compile is a row with its error, not a crash; cases_of(preset), where given, replaces the kernel table's
    call sites. Rows: kernel, site, shape, layout, MB, setting (name(s)),
    us, p20, p80, timing, rel_l2, gate."""
    wl = workloads.get(workload)
    p = wl.presets[preset or (wl.real_preset if device.type == "cuda" else wl.tiny_preset)]
    cases = [c for c in (cases_of or wl.kernel_cases)(p) if c.kernel in kernels and (site is None or site in c.site)]
    if not cases:
        raise SystemExit(f"no {' / '.join(kernels)} call site{f' named with {site!r}' if site else ''} in "
                         f"{workload}/{p.name}'s kernel table")
    gpu = device.type == "cuda"
    rows = []
    for case in cases:
        inputs = case.make(device, case.dtype, 0)
        with torch.inference_mode():
            ref = case.ref(**inputs)
            tol = max(2 * _rel_l2(case.eager(**inputs), ref), GATE_REL_L2.get(case.dtype, 1e-2))
            base = {"kernel": case.kernel, "site": case.site, "shape": "x".join(map(str, case.shape)),
                    "layout": case.layout, "MB": case.nbytes(**inputs) / 1e6}
            timed = []
            if gpu:
                compiled = torch.compile(case.eager, dynamic=False)
                compiled(**inputs)
                row = base | {"setting": "torch.compile", "rel_l2": _rel_l2(compiled(**inputs), ref),
                              "gate": "reference"}
                timed.append((row, lambda compiled=compiled, inputs=inputs: compiled(**inputs)))
            for s in settings_of(case):
                run = runner(case, inputs, s)
                try:
                    err = _rel_l2(run(), ref)
                except Exception as e:  # noqa: BLE001  (a setting Triton cannot compile is a finding, not a crash)
                    rows.append(base | {"setting": name(s), "gate": f"error: {type(e).__name__}: {e}"[:200]})
                    continue
                timed.append((base | {"setting": name(s), "rel_l2": err, "gate": "pass" if err <= tol else "FAIL"},
                              run))
            for row, run in timed:
                if gpu and row["gate"] in ("pass", "reference"):
                    med, p20, p80, how = _bench(run, rep_ms, device)
                    row |= {"us": med * 1e3, "p20": p20 * 1e3, "p80": p80 * 1e3, "timing": how}
                rows.append(row)
            if gpu:
                torch._dynamo.reset()
        del inputs, ref
    return pd.DataFrame(rows)


def sweep_cli(sweep, doc: str, workloads: list[str], quick_help: str, argv=None) -> int:
    """The command line of the launcher-setting sweeps (tools/gn_sweep.py, tools/row_sweep.py): runs
    sweep(workload, preset, device, quick, rep_ms) -> rows with site, shape, MB, setting, us, p20, p80, rel_l2, gate
    (torch.compile's row as setting "torch.compile"), adds GB/s and the speedup over compile, prints each call site
    sorted by time, writes the CSV; exit 1 when a setting failed its gate or did not compile."""
    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--workload", default=workloads[0], choices=workloads)
    ap.add_argument("--preset", default=None, help="default: the real preset on a GPU, the tiny one on a CPU")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--rep-ms", type=float, default=100.0)
    ap.add_argument("--quick", action="store_true", help=quick_help)
    ap.add_argument("--out", default=None, help="CSV path")
    ap.add_argument("--site", default=None, help="only the call sites whose name contains this text")
    a = ap.parse_args(argv)
    df = finish_sweep(sweep(a.workload, a.preset, resolve_device(a.device), a.quick, a.rep_ms, site=a.site))
    with pd.option_context("display.width", 250, "display.max_rows", 500, "display.max_colwidth", 70):
        for site, g in df.groupby("site", sort=False):
            print(f"\n{g['kernel'].iloc[0] + ': ' if 'kernel' in g else ''}{site} ({g['shape'].iloc[0]}, "
                  f"{g['MB'].iloc[0]:.1f} MB)")
            cols = [c for c in ("setting", "us", "p20", "p80", "GB/s", "vs compile", "rel_l2", "gate") if c in g]
            print((g.sort_values("us") if "us" in g else g)[cols].to_string(index=False))
    if a.out:
        df.to_csv(a.out, index=False)
    bad = df[df["gate"].astype(str).str.startswith(("FAIL", "error"))]
    return 1 if len(bad) else 0


def finish_sweep(df: pd.DataFrame) -> pd.DataFrame:
    """A sweep's rows with GB/s and the speedup over torch.compile's row at the same call site (where timed)."""
    if "us" in df:
        df["GB/s"] = df["MB"] * 1e3 / df["us"]
        comp = df[df["setting"] == "torch.compile"].set_index("site")["us"]
        df["vs compile"] = df["site"].map(comp) / df["us"]
    return df


def kernel_table(cfg: RunConfig, ceilings: dict | None) -> pd.DataFrame:
    """One row per call site of the workload (Workload.kernel_cases): bytes, the error of eager and of the fused kernel
    against the fp32 reference (the gate), and on a GPU the time and GB/s of eager, torch.compile (inductor, default
    mode) and the kernel, the kernel's share of the copy bandwidth and its speedup over compile."""
    dev = cfg.device
    if not runs_triton(dev):
        raise RuntimeError("the fused kernels need Triton on a CUDA device, or TRITON_INTERPRET=1 on a CPU (set it "
                           "before triton is imported)")
    gpu = dev.type == "cuda"
    copy = (ceilings or {}).get("copy_gbps", math.nan)
    rows = []
    for case in tqdm(cfg.workload.kernel_cases(cfg.preset), desc="kernels", leave=False):
        inputs = case.make(dev, case.dtype, cfg.seed)
        with torch.inference_mode():
            ref = case.ref(**inputs)
            fused = case.fused(**inputs)
            eager = case.eager(**inputs)
        nbytes = case.nbytes(**inputs)
        err_fused, err_eager = _rel_l2(fused, ref), _rel_l2(eager, ref)
        tol = GATE_REL_L2.get(case.dtype, 1e-2)
        row = {"kernel": case.kernel, "site": case.site, "shape": "x".join(map(str, case.shape)),
               "dtype": str(case.dtype).replace("torch.", ""), "layout": case.layout, "MB": nbytes / 1e6,
               "rel_l2 eager": err_eager, "rel_l2 fused": err_fused,
               "gate": "pass" if err_fused <= max(2 * err_eager, tol) else "FAIL"}
        if gpu:
            compiled = torch.compile(case.eager, backend=cfg.options.compile_backend, dynamic=False)
            with torch.inference_mode():
                err_compile = _rel_l2(compiled(**inputs), ref)
                for impl, fn in (("eager", case.eager), ("compile", compiled), ("fused", case.fused)):
                    med, p20, p80, how = _bench(lambda fn=fn, inputs=inputs: fn(**inputs), cfg.options.rep_ms, dev)
                    row.update({f"{impl} timing": how, f"{impl} us": med * 1e3, f"{impl} us p20": p20 * 1e3,
                                f"{impl} us p80": p80 * 1e3,
                                f"{impl} GB/s": nbytes / (med * 1e-3) / 1e9})
            row["rel_l2 compile"] = err_compile
            row["fused % of copy"] = 100 * row["fused GB/s"] / copy if copy == copy else math.nan
            row["fused vs compile"] = row["compile us"] / row["fused us"]
            row["fused vs eager"] = row["eager us"] / row["fused us"]
            torch._dynamo.reset()  # one compiled op sequence at a time
        rows.append(row)
        del inputs, ref, fused, eager
    df = pd.DataFrame(rows)
    df.attrs["copy_gbps"] = copy
    return df


def kernel_summary(tab: pd.DataFrame) -> pd.DataFrame:
    """The kernel table's headline columns: time (the kernel's with its spread) and GB/s of eager, compile and the
    kernel, share of copy bandwidth."""
    cols = ["kernel", "site", "shape", "dtype", "MB", "gate", "eager us", "compile us", "fused us", "fused us p20",
            "fused us p80", "eager GB/s", "compile GB/s", "fused GB/s", "fused % of copy", "fused vs compile",
            "fused vs eager", "rel_l2 eager", "rel_l2 fused"]
    return tab[[c for c in cols if c in tab.columns]]


def plot_kernels(tab: pd.DataFrame, title: str = ""):
    """One panel per call site (the Triton tutorials' benchmark style): GB/s of eager, torch.compile and the fused
    kernel, with the measured copy bandwidth as the roof."""
    import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

    if "fused GB/s" not in tab.columns:
        return None
    n = len(tab)
    cols = min(n, 4)
    fig, axes = plt.subplots(math.ceil(n / cols), cols, figsize=(3.3 * cols, 3.2 * math.ceil(n / cols)),
                             squeeze=False)
    copy = tab.attrs.get("copy_gbps", math.nan)
    impls = (("eager", "#999999"), ("compile", "#4c72b0"), ("fused", "#dd8452"))
    for ax, (_, r) in zip(axes.flat, tab.iterrows()):
        vals = [r[f"{i} GB/s"] for i, _ in impls]
        ax.bar(range(3), vals, color=[c for _, c in impls])
        for x, v in enumerate(vals):
            ax.annotate(f"{v:,.0f}", (x, v), ha="center", va="bottom", fontsize=8)
        if copy == copy:
            ax.axhline(copy, color="k", ls="--", lw=1)
            ax.annotate(f"copy {copy:,.0f} GB/s", (2.45, copy), ha="right", va="bottom", fontsize=7)
            ax.set_ylim(0, max(copy, max(vals)) * 1.15)
        ax.set_xticks(range(3), [i for i, _ in impls])
        ax.set_title(f"{r['kernel']}\n{r['shape']} {r['dtype']}", fontsize=8)
        ax.set_ylabel("GB/s (bytes the op must move)", fontsize=8)
    for ax in list(axes.flat)[n:]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


class _Quantiles:
    """A timing's quantiles in the shape results.make_row reads from a timing (summary())."""

    def __init__(self, median: float, p20: float, p80: float):
        self._s = {"median": float(median), "p20": float(p20), "p80": float(p80), "p95": math.nan, "n": math.nan}

    def summary(self) -> dict:
        return self._s


def kernel_rows(cfg: RunConfig, tab: pd.DataFrame) -> list[dict]:
    """Per call site and implementation: time (median, p20, p80) and GB/s, as results rows."""
    common = dict(notebook=cfg.notebook, workload=cfg.workload.name, preset=cfg.preset.name, params=cfg.params())
    out = []
    if "fused us" not in tab.columns:
        return out
    for _, r in tab.iterrows():
        variant = f"kernel:{r['kernel']} {r['shape']} {r['dtype']} ({r['site']})"
        for impl in ("eager", "compile", "fused"):
            timing = _Quantiles(r[f"{impl} us"], r[f"{impl} us p20"], r[f"{impl} us p80"])
            out.append(results_store.make_row(metric=f"{impl}_us", value=float(r[f"{impl} us"]), unit="us",
                                              variant=variant, gate=r["gate"], timing=timing,
                                              note=r.get(f"{impl} timing", ""), **common))
            out.append(results_store.make_row(metric=f"{impl}_gbps", value=float(r[f"{impl} GB/s"]), unit="GB/s",
                                              variant=variant, gate=r["gate"], **common))
    return out


# --- the ladder ------------------------------------------------------------------------------------------------------


def _low_precision(device) -> dict:
    """The low-precision rows and why each cannot run on `device` (None: it can)."""
    # fp8 GEMMs with static scales: torchao's dynamic ones (variant fp8, for `steps`) spent on their scale reductions
    # about what the fp8 GEMMs saved
    return {"attn-sage": sage_unavailable(device), "fp8-static": fp8_static_unavailable(device)}


def base_stack(cfg: RunConfig) -> list[Variant]:
    """The stack the kernel rows build on: `base`, or notebook 04's best."""
    return list(cfg.options.base) if cfg.options.base is not None else best_of_04(cfg)


def kernel_steps(cfg: RunConfig) -> list[Variant]:
    """The rows added to the base: `steps`, or triton-fused, norm-conv-bias (wma: a convolution's bias added by the
    GroupNorm + SiLU kernel after it), head-conv-gemm (wma: the heads' 1-D convolutions as GEMMs), upsample-fold
    (wma: the up path's upsampling + convolution as one transposed convolution), frames-norm-triton (wma: the
    temporal transformers' GroupNorm by the GroupNorm kernels), ffn-gelu-epilogue (mg2: the
    feed-forward's GELU in its GEMM's epilogue), action-norm-rope (mg2: the action modules' queries and keys
    normalized and rotated in one pass), fused-qkv (mg2: the self-attention's q/k/v projections as one GEMM),
    vae-triton-fused, vae-norm-conv-bias (wma), attn-sage (the quantized attention comparison row) and fp8-static
    (each low-precision row where it can run; the ladder is cumulative, so where both run the fp8 row keeps
    attn-sage's attention), then attn-triton (mg2: our Triton attention kernel for the block over its cached window
    in place of the attention of the rows above)."""
    if cfg.options.steps is not None:
        return list(cfg.options.steps)
    known = variants.known(cfg.workload)
    steps = [s for s in (*DENOISER_KERNELS, "fused-qkv", "vae-triton-fused", "vae-norm-conv-bias") if s in known]
    # the low-precision rows next: fp8-static's row is the slowest to build (its whole-denoiser compile takes minutes
    # at the real shapes), so a run cut there has the rows above stored
    steps += [s for s, why in _low_precision(cfg.device).items() if s in known and why is None]
    if "kv_cache" in cfg.workload.features:  # the DiT's attention: a block of queries over the cached window
        # last, so no row above runs on it: at mg2-universal on the H200 the kernel takes 1.2x cuDNN's time at the
        # window's length (tools/attn_bench.py, NOTES.md), and each row keeps the rows above it
        steps.append("attn-triton")
    return variants.resolve(steps, cfg.workload, cfg.device)


SAGE_ROUTES = ("attn-sage sends a call to SageAttention when its key length is a whole number of 64-key blocks and "
               "its head dim is 64, 96 or 128, with no mask; the rest run SDPA (sageattention 1.0.6 scores the "
               "zero-padded keys of a partial block). Calls inside compiled regions take the same routes (they depend "
               "on the shapes alone) but are not counted: a counter there made dynamo recompile on every call. At "
               "mg2-universal every self-attention call has 880 x frames keys, never a whole block, so that row "
               "measures SDPA.")


def sage_table() -> pd.DataFrame:
    """How the attention() calls outside compiled regions ran since attn-sage switched the backend (its ladder row:
    warm-up, gate and timing): SageAttention, or SDPA and why (SAGE_ROUTES); empty when every call ran compiled."""
    counts = sage_call_counts()
    total = sum(counts.values())
    rows = [{"kernel": k, "calls": n, "share": n / total} for k, n in sorted(counts.items(), key=lambda kv: -kv[1])]
    return pd.DataFrame(rows, columns=["kernel", "calls", "share"]).set_index("kernel")


def fp8_note(cfg: RunConfig) -> str:
    """Which low-precision rows (fp8 GEMMs, SageAttention) the ladder includes, and why any is left out."""
    return "; ".join(f"{name} row left out: {why}" if why else f"{name} row included"
                     for name, why in _low_precision(cfg.device).items())


def run_ladder(ref, cfg: RunConfig, ceilings: dict | None):
    """The base stack (one row), then each kernel step, gated against fp32 (the ladder of wmbook.variants); each row's
    results rows stored as soon as it is measured."""
    base = base_stack(cfg)
    o = cfg.options
    st = LadderSettings(seed=cfg.seed, warmup=cfg.warmup, repeats=cfg.repeats, e2e=e2e_size(cfg),
                        e2e_repeats=o.e2e_repeats, compile_backend=o.compile_backend, ceilings=ceilings, keep=False,
                        compile_ahead=o.compile_ahead)
    return _run(cfg.workload, cfg.preset, base + kernel_steps(cfg), device=cfg.device, settings=st, reference=ref,
                from_row=len(base), on_row=store_each_row(cfg))


def _launch_bound(first, r, before: str = "the base's") -> str:
    """A clause for a row that saves GPU time but not wall time because its forward is launch-bound (wall over 1.2x
    its GPU busy time, the row it is compared with or its own: the kernels' launches from inductor's generated code
    cost host time): the saving shows once the forward replays as a CUDA graph (notebook 06)."""
    fb, rb = first.gpu_busy_ms, r.gpu_busy_ms
    if not (fb == fb and rb == rb and rb < fb and r.forward.median >= first.forward.median
            and max(first.forward.median / fb, r.forward.median / rb) > 1.2):
        return ""
    more = (f", {r.launches - first.launches:+.0f} launches per forward"
            if r.launches == r.launches and first.launches == first.launches else "")
    return (f" It saves {fb - rb:.2f} ms of GPU time but not wall time{more}: its forward is launch-bound "
            f"(wall {r.forward.median / rb:.2f}x its GPU busy time; {before} {first.forward.median / fb:.2f}x), "
            f"so the saving shows when the forward replays as a CUDA graph (notebook 06's `+ triton-fused` row).")


def interpret(cfg: RunConfig, tab: pd.DataFrame | None, lad=None) -> str:
    """What the numbers say, from the numbers."""
    lines = []
    if tab is not None and len(tab):
        fails = tab[tab["gate"] != "pass"]
        lines.append(f"- **Correctness**: {len(tab) - len(fails)} of {len(tab)} call sites match the fp32 reference "
                     f"at least as closely as the eager op sequence" + (f"; failing: {', '.join(fails['kernel'])}"
                                                                       if len(fails) else "") + ".")
        if "fused GB/s" in tab.columns:
            for _, r in tab.iterrows():
                lines.append(f"- `{r['kernel']}` at {r['shape']} ({r['site']}): {r['fused GB/s']:,.0f} GB/s "
                             f"({r['fused % of copy']:.0f}% of copy), {r['fused vs compile']:.2f}x torch.compile, "
                             f"{r['fused vs eager']:.2f}x eager.")
        else:
            lines.append("- On a CPU the kernels ran in Triton's interpreter: correctness only, no speed.")
    if lad is not None:
        lines += [f"- {f}" for f in lad.failures()]
    if lad is not None and len(lad.rows) > 1:
        # the ladder is cumulative: each row against the last row that passed before it (the base first), so a
        # row is not credited with what an earlier row saved
        prev = lad.rows[1]
        for r in lad.rows[2:]:
            if r.gate == "error":  # said above (lad.failures)
                continue
            if r.gate != "pass":
                lines.append(f"- `{r.variant}` failed the gate ({r.gate}); its time does not count.")
                continue
            on_base = prev is lad.rows[1]
            on = "the base" if on_base else f"`{prev.variant}`"
            busy = (f"GPU busy {prev.gpu_busy_ms:.1f} -> {r.gpu_busy_ms:.1f} ms per forward"
                    if r.gpu_busy_ms == r.gpu_busy_ms and prev.gpu_busy_ms == prev.gpu_busy_ms else "")
            lines.append(f"- `{r.variant}` (on {on}): forward {prev.forward.median:.1f} -> {r.forward.median:.1f} ms"
                         + (f", {busy}" if busy else "") + f", {cfg.workload.metric.label} "
                         f"{prev.e2e_value:.3g} -> {r.e2e_value:.3g}."
                         + _launch_bound(prev, r, "the base's" if on_base else "the row before's"))
            prev = r
    return "\n".join(lines)


__all__ = ["NOTEBOOK", "SPEC", "base_stack", "fp8_note", "interpret", "kernel_rows",
           "kernel_steps", "kernel_summary", "kernel_table", "plot_kernels", "run_ladder", "validate"]
