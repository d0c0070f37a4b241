"""Notebook 04 (compile and precision): precision, dtype/host-sync hygiene, attention backends, layout and
torch.compile, gated against the fp32 reference and stacked into a ladder.

Sections (each optional): `precision` (each precision variant alone against fp32), `vae` (the VAE decoder in
fp32/bf16/fp16, PSNR), `hygiene` (casts, copies and host reads per forward as each hygiene variant is added),
`attention` (backends on the shapes a forward runs, FlexAttention for a block-causal mask), `ladder` (the
cumulative ladder), `compile` (regional vs whole, dynamic, cold and warm compile time, recompiles over a warm
end-to-end run, graph breaks; the reference code and after the hygiene variants). Figures and the results
rows and interpretation: wmbook.studies.compile_report.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace

import pandas as pd
import torch

from .. import display as wd
from .. import variants
from ..params import (
    DEVICE,
    OUTPUT_DIR,
    PRESET,
    REPEATS,
    RESULTS_PATH,
    SEED,
    WARMUP,
    Param,
    ParameterError,
    integer,
    name_list,
    subset_or_all,
)
from ..profiling.breakdown import device_busy_ms
from ..runconfig import WORKLOAD, NotebookSpec, RunConfig
from ..runconfig import validate as _validate
from ..variants import GlobalFlags, Variant, hygiene_parts, resolve
from ..variants.attention import attention_backend_table, best_backend, flex_vs_dense_mask, record_attention_shapes
from ..variants.builtin import compile_variant, raise_recompile_limit_for_regions
from ..variants.compile import CompileSpec, measure_compile_time
from ..variants.compile_monitor import CompileMonitor
from ..variants.ladder import GateReference, LadderSettings, apply_stack, flop_floor_ms, measure
from ..variants.ladder import run_ladder as _run
from ..variants.tables import op_counts, variant_table
from ..variants.tables import vae_table as _vae
from ..workloads import E2ESize
from .common import compile_backend, e2e_blocks, variant_stack
from .compile_report import guard_groups, interpret, plot_compile_times, plot_forward_vs_floor, result_rows  # noqa: F401

NOTEBOOK = "04_compile_autocast"
SECTIONS = ("precision", "vae", "hygiene", "attention", "ladder", "compile")
COMPILE_MODES = ("default", "max-autotune-no-cudagraphs")
COMPILE_CONFIGS = ("reference", "hygiene", "dynamic", "whole", "max-autotune")
WORKING_DTYPE = "bf16"  # the precision the hygiene, attention and compile sections work in (what the pipelines run)


def _compile_modes(v, ctx):
    modes = name_list(v, ctx)
    bad = [m for m in modes if m not in COMPILE_MODES]
    if bad:
        raise ParameterError(f"compile_modes has {bad}; allowed values: a comma-separated subset of "
                             f"{list(COMPILE_MODES)} (reduce-overhead captures CUDA graphs: notebook 06)")
    return tuple(modes)


def _compile_table(v, ctx):
    """'auto': the workload's configurations (Workload.compile_table; every one when it names none); on a CPU
    (aot_eager at tiny shapes, a smoke run) without `dynamic`, whose symbolic tracing alone takes minutes there and
    says nothing about a GPU's dynamic compile."""
    if v == "auto":
        own = getattr(ctx.get("workload"), "compile_table", None) or COMPILE_CONFIGS
        return tuple(c for c in COMPILE_CONFIGS if c in own and (ctx["device"].type == "cuda" or c != "dynamic"))
    return subset_or_all(COMPILE_CONFIGS)(v, ctx)


def _cross_check(cfg: RunConfig) -> None:
    o = cfg.options
    for name, n in (("e2e_blocks", o.e2e_blocks), ("recompile_blocks", o.recompile_blocks)):
        cfg.workload.check_e2e(cfg.preset, name, E2ESize(blocks=n, ddim_steps=o.e2e_ddim_steps), cfg.device)


SPEC = NotebookSpec(NOTEBOOK, (
    WORKLOAD, PRESET, DEVICE,
    Param("ladder", "auto", variant_stack(), "auto: the workload's default ladder; or comma-separated variant names"),
    Param("sections", "all", subset_or_all(SECTIONS), f"all, or a comma-separated subset of {list(SECTIONS)}"),
    Param("compile_modes", "default", _compile_modes, "modes in the ladder and the compile table"),
    Param("compile_backend", "auto", compile_backend, "auto: inductor on a GPU, aot_eager on a CPU"),
    Param("compile_table", "auto", _compile_table, "configurations of the compile table; auto: the workload's (mg2: "
          "all; wma: hygiene, whole), without `dynamic` on a CPU; all: every one"),
    WARMUP.with_default(3), REPEATS.with_default(10),
    Param("e2e_blocks", 0, e2e_blocks, "blocks per end-to-end ladder run (causal DiT); 0: 4 on a GPU, 3 on a CPU"),
    Param("recompile_blocks", 10, integer(2), "blocks of the warm run whose recompiles the compile table counts"),
    Param("e2e_ddim_steps", 5, integer(1), "DDIM steps per pass in the end-to-end run (UNet)"),
    Param("e2e_repeats", 2, integer(1), "timed end-to-end runs per row"),
    OUTPUT_DIR, RESULTS_PATH, SEED), workload_params=False, cross_check=_cross_check,
    # the compile table's whole-model and dynamic cold compiles are minutes each at the real shapes
    quick={"compile_table": "reference,hygiene", "warmup": 2, "repeats": 5, "e2e_repeats": 1, "recompile_blocks": 4})


def validate(**params) -> RunConfig:
    """Check every notebook-04 parameter before any heavy work; errors name the parameter and allowed values."""
    return _validate(SPEC, **params)


def e2e_size(cfg: RunConfig) -> E2ESize:
    return E2ESize(blocks=cfg.options.e2e_blocks, ddim_steps=cfg.options.e2e_ddim_steps)


def settings(cfg: RunConfig, ceilings: dict | None = None):
    """The ladder's measurement settings from the notebook's parameters."""
    o = cfg.options
    return LadderSettings(seed=cfg.seed, warmup=cfg.warmup, repeats=cfg.repeats, e2e=e2e_size(cfg),
                          e2e_repeats=o.e2e_repeats, compile_backend=o.compile_backend, ceilings=ceilings)


def reference(cfg: RunConfig):
    """The fp32 eager reference pipeline every table and ladder row starts from (a deep copy per row)."""
    return cfg.workload.reference_pipeline(cfg.preset, cfg.device, cfg.seed)


def precision_names(cfg: RunConfig) -> list[str]:
    names = ["tf32", "bf16", "autocast-bf16"]
    if cfg.device.type == "cuda":
        names.insert(2, "fp16")
    return names


def precision_table(ref, cfg: RunConfig, ceilings: dict | None = None) -> pd.DataFrame:
    """Each precision variant alone against fp32: gate, forward time, speedup, distance to the floor."""
    return variant_table(ref, cfg.workload, precision_names(cfg), device=cfg.device, settings=settings(cfg, ceilings))


def vae_table(ref, cfg: RunConfig) -> pd.DataFrame:
    gpu = cfg.device.type == "cuda"
    return _vae(ref, cfg.workload, ("fp32", "bf16", "fp16") if gpu else ("fp32", "bf16"), device=cfg.device,
                seed=cfg.seed, repeats=3 if gpu else 1, layouts=(False, True) if gpu else (False,))


def hygiene_table(ref, cfg: RunConfig) -> pd.DataFrame:
    """Casts, copies and host reads per forward at the working dtype, as each hygiene variant is added."""
    d = WORKING_DTYPE
    stacks, stack = {f"{d} eager": [d]}, [d]
    for part in hygiene_parts(cfg.workload):
        stack = stack + [part]
        stacks[f"+ {part}"] = stack
    return op_counts(ref, cfg.workload, stacks, device=cfg.device, seed=cfg.seed)


def attention_section(ref, cfg: RunConfig):
    """(shapes of one forward, backend table, best backend, FlexAttention vs dense block-causal mask or None)."""
    wl = cfg.workload
    pipe, _ = apply_stack(ref, wl, variants.resolve([WORKING_DTYPE], wl, cfg.device), cfg.device)
    probe = wl.forward_probe(pipe, cfg.seed)
    with torch.no_grad(), record_attention_shapes(wl.denoiser(pipe), forwards=1) as rec:
        probe.forward()
    shapes = rec.table()
    del pipe, probe
    gpu = cfg.device.type == "cuda"
    # flex is measured where it matters, on a block-causal mask (flex_vs_dense_mask): per shape it would
    # compile once for each of a forward's shapes
    backends = ["auto", "math", "efficient", "flash", "cudnn"] if gpu else ["auto", "math", "flash"]
    if importlib.util.find_spec("flash_attn") is not None:
        backends.append("flash_attn")
    table = attention_backend_table(shapes, backends=backends, device=cfg.device, dtype=WORKING_DTYPE,
                                    warmup=cfg.warmup, repeats=cfg.repeats)
    best = best_backend(table)
    flex = None
    if "block_causal_attention" in wl.features:
        kw = {} if not cfg.tiny else {"frames": 9, "frame_seqlen": 32, "heads": 2, "head_dim": 16}
        flex = flex_vs_dense_mask(device=cfg.device, dtype=WORKING_DTYPE, **kw)
    return shapes, table, best, flex


def default_ladder(cfg: RunConfig, attention: str | None = None) -> list[Variant]:
    """The workload's ladder up to compile [with the attention backend that won], then the compile rows in the
    workload's scope (the DiT compiles its repeated block, the UNet whole)."""
    attn = None
    if attention and attention != "auto":
        v = variants.get(f"attn-{attention}")  # on a CPU the timed winner can be a kernel only CUDA runs
        if cfg.device.type == "cuda" or not v.gpu_only:
            attn = v.name
    modes = cfg.options.compile_modes if cfg.device.type == "cuda" else ("default",)  # no autotuning off a GPU
    names = cfg.workload.default_ladder(cfg.device, attn) + [compile_variant(cfg.workload.compile_scope, m)
                                                             for m in modes]
    return variants.resolve(names, cfg.workload, cfg.device)


def run_ladder(ref, cfg: RunConfig, steps: list[Variant], ceilings: dict | None):
    return _run(cfg.workload, cfg.preset, steps, device=cfg.device, settings=settings(cfg, ceilings), reference=ref)


def compile_configs(cfg: RunConfig) -> list[tuple[str, list[Variant], object]]:
    """(label, variants applied before compiling, CompileSpec) for the compile table: the regional compile of
    the reference code first (what recompiles and why), then after the hygiene variants, dynamic, whole model,
    modes."""
    b = cfg.options.compile_backend
    d = variants.resolve([WORKING_DTYPE], cfg.workload, cfg.device)
    h = variants.resolve([WORKING_DTYPE, "hygiene"], cfg.workload, cfg.device)
    rows = {"reference": ("regional, reference code", d, CompileSpec("regional", "default", False, b)),
            "hygiene": ("regional, after hygiene", h, CompileSpec("regional", "default", False, b)),
            "dynamic": ("regional, dynamic=True", h, CompileSpec("regional", "default", True, b)),
            "whole": ("whole model", h, CompileSpec("whole", "default", False, b))}
    if "max-autotune-no-cudagraphs" in cfg.options.compile_modes and b == "inductor":
        rows["max-autotune"] = ("regional, max-autotune-no-cudagraphs", h,
                                CompileSpec("regional", "max-autotune-no-cudagraphs", False, b))
    return [rows[k] for k in cfg.options.compile_table if k in rows]


def compile_section(ref, cfg: RunConfig, configs=None, ceilings: dict | None = None):
    """One row per configuration: cold and warm compile time (empty vs filled on-disk cache), graphs, graph
    breaks, steady forward ms, and the recompiles of a warm end-to-end run (recompile_blocks blocks or one
    iteration) after a first, warming one, then the warm model's steady forward (median, p20-p80 over `repeats`),
    its GPU busy time and both against the FLOP floor (with `ceilings`). Also the graph-break report of the
    reference code's regional compile."""
    wl = cfg.workload
    size = E2ESize(blocks=cfg.options.recompile_blocks, ddim_steps=cfg.options.e2e_ddim_steps)
    flags = GlobalFlags()
    rows, breaks, reasons = [], None, None
    for label, names, spec in configs or compile_configs(cfg):
        state = {}

        def make_model(names=names, spec=spec):
            flags.restore()
            if spec.scope == "regional":  # as the compile variants do
                raise_recompile_limit_for_regions()
            pipe, _ = apply_stack(ref, wl, names, cfg.device)
            state["pipe"], state["probe"] = pipe, wl.forward_probe(pipe, cfg.seed)
            return wl.compile_target(pipe)

        def regions(model):
            return wl.compile_regions(state["pipe"])

        def after_warm(model):
            # on the warm model (on-disk cache filled): one end-to-end run compiles the shapes the probe did not
            # see, the next one is counted (the steady-state recompiles the goal is about)
            pipe = state["pipe"]
            with CompileMonitor() as warm:
                wl.end_to_end(pipe, cfg.seed, size)
            with CompileMonitor() as steady:
                e2e = wl.end_to_end(pipe, cfg.seed, size)
            probe = state["probe"]  # built before compiling; its forward runs the compiled model
            with torch.no_grad():
                busy = device_busy_ms(probe.forward, cfg.device)
            state.update(warm=warm, steady=steady, e2e=e2e, busy=busy, flops=probe.flops)

        try:  # the steady forward: `repeats` timed calls of the warm model, right after its compile
            row = measure_compile_time(make_model, lambda m: state["probe"].forward(), spec,
                                       regions=regions if spec.scope == "regional" else None, device=cfg.device,
                                       steady_repeats=cfg.repeats, after_warm=after_warm)
        except Exception as e:  # a configuration that cannot compile here is a finding, not a crash
            rows.append({"config": label, "error": f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"})
            state.clear()
            flags.restore()
            continue
        warm, steady, e2e, busy = (state[k] for k in ("warm", "steady", "e2e", "busy"))
        if breaks is None and label.startswith("regional, reference"):
            breaks, reasons = warm.graph_breaks, warm.recompiles
        floor = flop_floor_ms(state["flops"], ceilings)
        rows.append({"config": label, "variants": " + ".join(map(str, names)), "scope": spec.scope, "mode": spec.mode,
                     "dynamic": spec.dynamic, "cold_s": row.get("cold_s"), "warm_s": row.get("warm_s"),
                     "steady_forward_ms": row["steady_ms"], "steady_p20": row["steady_p20"],
                     "steady_p80": row["steady_p80"], "x_floor": row["steady_ms"] / floor, "gpu_busy_ms": busy,
                     "busy_x_floor": busy / floor, "graphs": row.get("cold_graphs"),
                     "graph_breaks": row.get("graph_breaks"),
                     "warmup_run_recompiles": warm.summary()["recompiles"],
                     "steady_run_recompiles": steady.summary()["recompiles"],
                     "recompile_reasons": _reason_summary(warm.recompiles),
                     "e2e_metric": e2e.metric.name, "e2e_value": e2e.value, "e2e_run": wl.e2e_description(size)})
        state.clear()  # the pipeline copy and its probe: freed before the next configuration
        flags.restore()
        if cfg.device.type == "cuda":
            torch.cuda.empty_cache()
    return pd.DataFrame(rows), breaks, reasons


def _reason_summary(recompiles: pd.DataFrame, top: int = 4) -> str:
    """The most frequent failed guards of a run, shortened: 'start_frame == 0 (x4); ...'."""
    if recompiles is None or not len(recompiles):
        return ""
    g = recompiles["guard"].astype(str).str.replace(r"\s+#.*$", "", regex=True).str.slice(0, 70)
    vc = g.value_counts().head(top)
    return "; ".join(f"{k} (x{v})" for k, v in vc.items())


def variants_table(cfg: RunConfig) -> pd.DataFrame:
    """The variants this workload can use: family, gate tolerance, GPU only, what each does."""
    rows = []
    for n in variants.known(cfg.workload):
        v = variants.get(n)
        rows.append({"variant": n, "family": v.family, "gate tolerance": v.tolerance or "unchanged",
                     "GPU only": v.gpu_only, "what it does": v.description})
    out = pd.DataFrame(rows).set_index("variant")
    out.attrs["groups"] = {g: " + ".join(v.name for v in variants.resolve([g], cfg.workload)) for g in variants.GROUPS}
    return out


# --- the variant-stack picker (display only: a trial measurement, never a results row) ----------------------------


class StackTrial:
    """Apply a chosen stack of variants to a copy of the reference, gate it against fp32, time its forward as the
    ladder does (the notebook's warm-up calls, then its repeats: median and p20-p80, wmbook.bench) and one
    end-to-end run; show the row and its frames against the reference's (notebook 04's picker). Nothing is appended
    to the results: ladder and compile rows are the measurements of record."""

    KEY = ("variant", "gate", "rel_l2_vs_fp32", "allowed_rel_l2", "forward_ms", "speedup", "x_floor", "e2e_value",
           "e2e_speedup", "psnr_db", "peak_memory_gib", "first_call_s")

    def __init__(self, ref, cfg, ceilings: dict | None):
        self.ref, self.cfg, self.ceilings = ref, cfg, ceilings
        # timed as the ladder times (warm-up, then repeats: median and spread), with at most 2 warm-up calls and 5
        # repeats: a trial answers "is this stack faster", the ladder's rows are the measurements of record
        self.settings = replace(settings(cfg, ceilings), warmup=max(1, min(cfg.warmup, 2)),
                                repeats=max(3, min(cfg.repeats, 5)), e2e_repeats=1)
        self._measure = measure
        self.gate_ref = None  # the fp32 reference's outputs, measured at the first trial (not before: a report that
        # never runs a trial spends nothing on it)

    def _reference(self) -> None:
        row, out, frames = self._measure(self.ref, self.cfg.workload, [], self.cfg.device, self.settings, None)
        self.gate_ref = GateReference(forward=out, frames=frames)
        self.frames = frames
        self.base_ms, self.base_e2e = row.forward.median, row.e2e_value
        self.floor = flop_floor_ms(row.flops, self.ceilings)

    def __call__(self, stack: list[str]):
        from IPython.display import display  # noqa: PLC0415  optional: IPython

        if self.gate_ref is None:
            self._reference()
        vs = resolve(list(stack), self.cfg.workload, self.cfg.device)
        row, out, frames = self._measure(self.ref, self.cfg.workload, vs, self.cfg.device, self.settings,
                                         self.gate_ref)
        row.variant = " + ".join(stack) or "fp32 eager (reference)"
        row.finish(self.floor, self.base_ms, self.base_e2e, self.cfg.workload.metric)
        rec = pd.DataFrame([row.record()]).set_index("row")
        display(wd.table(rec, columns=self.KEY, strict=False,
                         rename={"e2e_value": f"{row.e2e_metric or 'end to end'} ({self.cfg.workload.metric.unit})"},
                         caption=f"The picked stack: forward median (p20-p80) of {self.settings.repeats} calls after "
                                 f"{self.settings.warmup} warm-up calls (a trial: not a results row)"))
        if frames is not None and self.frames is not None:
            wd.frame_comparer(self.frames, frames, labels=("fp32 reference", row.variant))
        return row
