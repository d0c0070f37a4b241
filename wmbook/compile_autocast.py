"""Notebook 04 logic: precision, dtype hygiene, attention backends, layout and torch.compile, gated and stacked.

Sections (each optional): `precision` (each precision variant alone against fp32), `vae` (the VAE decoder
in fp32/bf16/fp16, PSNR), `hygiene` (casts, copies and host reads per forward before/after), `attention`
(backends on the shapes a forward runs, which kernel `auto` picks, FlexAttention for the block-causal mask),
`ladder` (the cumulative ladder), `compile` (regional vs whole, dynamic, cold and warm compile time,
recompiles over a warm end-to-end run, graph breaks; before and after the recompile fix).
"""

from __future__ import annotations

import importlib.util
import math
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import torch

from . import results as results_store
from .baseline import _int, default_results_path
from .presets import ALL_PRESETS, TINY_FOR, get_preset, resolve_device, resolve_preset
from .workloads import WORKLOADS

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = "04_compile_autocast"
SECTIONS = ("precision", "vae", "hygiene", "attention", "ladder", "compile")
COMPILE_MODES = {"default": "compile-regional", "max-autotune-no-cudagraphs": "compile-regional-max-autotune"}
COMPILE_BACKENDS = ("auto", "inductor", "aot_eager", "eager")
# goals of the issue (H100, bf16): DiT forward within 1.5x its floor with compile; regional cold compile under
# 60 s; zero recompiles across a 10-block run; WMA UNet at least 2x per DDIM step over fp32 eager
WORKING_DTYPE = "bf16"  # the precision the hygiene, attention and compile sections work in (what the pipelines run)
GOALS = {"dit_x_floor": 1.5, "regional_cold_s": 60.0, "recompiles": 0, "wma_step_speedup": 2.0}


@dataclass
class CompileConfig:
    workload: str
    preset: str
    device: torch.device
    ladder: list[str] | None  # None: the workload's default ladder (attention backend from the attention section)
    sections: tuple[str, ...]
    compile_modes: tuple[str, ...]
    compile_backend: str
    compile_table: tuple[str, ...]
    warmup: int
    repeats: int
    e2e_blocks: int
    recompile_blocks: int
    e2e_ddim_steps: int
    e2e_repeats: int
    output_dir: Path
    results_path: Path
    seed: int

    @property
    def tiny(self) -> bool:
        return get_preset(self.preset).tiny

    def params(self) -> dict:
        return {"workload": self.workload, "preset": self.preset, "device": str(self.device),
                "ladder": ",".join(self.ladder) if self.ladder else "auto", "sections": ",".join(self.sections),
                "compile_modes": ",".join(self.compile_modes), "compile_backend": self.compile_backend,
                "compile_table": ",".join(self.compile_table),
                "e2e_blocks": self.e2e_blocks, "recompile_blocks": self.recompile_blocks,
                "e2e_ddim_steps": self.e2e_ddim_steps, "seed": self.seed}

    def table(self) -> pd.DataFrame:
        d = self.params() | {"warmup": self.warmup, "repeats": self.repeats, "e2e_repeats": self.e2e_repeats,
                             "output_dir": str(self.output_dir), "results_path": str(self.results_path)}
        return pd.DataFrame({"value": {k: str(v) for k, v in d.items()}}).rename_axis("parameter")


def _split(name: str, value) -> list[str]:
    if isinstance(value, (list, tuple)):
        items = [str(v).strip() for v in value]
    elif isinstance(value, str):
        items = [v.strip() for v in value.split(",") if v.strip()]
    else:
        raise ValueError(f"{name}={value!r} is not allowed; allowed values: a comma-separated string or a list")
    return items


def validate(*, workload="mg2", preset="auto", device="auto", ladder="auto", sections="all",
             compile_modes="default", compile_backend="auto", compile_table="all",
             warmup=3, repeats=10,
             e2e_blocks=0, recompile_blocks=10, e2e_ddim_steps=5, e2e_repeats=2, output_dir="auto",
             results_path="auto", seed=0) -> CompileConfig:
    """Check every notebook-04 parameter before any heavy work; errors name the parameter and allowed values."""
    from . import variants

    if workload not in WORKLOADS:
        raise ValueError(f"workload={workload!r} is not allowed; allowed values: {list(WORKLOADS)}")
    dev = resolve_device(device)
    real = "mg2-universal" if workload == "mg2" else "wma"
    ok = [n for n in ALL_PRESETS if (n in ("wma", "tiny-wma")) == (workload == "wma")]
    if preset != "auto" and preset not in ok:
        raise ValueError(f"preset={preset!r} is not allowed for workload {workload!r}; allowed values: "
                         f"{['auto', *ok]}")
    name = (real if dev.type == "cuda" else TINY_FOR[real]) if preset == "auto" else resolve_preset(preset, dev)
    if dev.type == "cpu" and not get_preset(name).tiny:
        raise ValueError(f"preset={name!r} is a real-shape preset and needs a GPU; on a CPU use 'auto' or "
                         f"{[n for n in ok if get_preset(n).tiny]}")
    secs = list(SECTIONS) if sections == "all" else _split("sections", sections)
    bad = [s for s in secs if s not in SECTIONS]
    if bad or not secs:
        raise ValueError(f"sections={sections!r} is not allowed; allowed values: 'all' or a comma-separated subset "
                         f"of {list(SECTIONS)}")
    modes = _split("compile_modes", compile_modes)
    bad = [m for m in modes if m not in COMPILE_MODES]
    if bad:
        raise ValueError(f"compile_modes has {bad}; allowed values: a comma-separated subset of {list(COMPILE_MODES)} "
                         f"(reduce-overhead captures CUDA graphs: notebook 06)")
    if compile_backend not in COMPILE_BACKENDS:
        raise ValueError(f"compile_backend={compile_backend!r} is not allowed; allowed values: {list(COMPILE_BACKENDS)}")
    backend = compile_backend if compile_backend != "auto" else ("inductor" if dev.type == "cuda" else "aot_eager")
    ctable = list(COMPILE_CONFIG_KEYS) if compile_table == "all" else _split("compile_table", compile_table)
    bad = [k for k in ctable if k not in COMPILE_CONFIG_KEYS]
    if bad or not ctable:
        raise ValueError(f"compile_table={compile_table!r} is not allowed; allowed values: 'all' or a comma-separated "
                         f"subset of {list(COMPILE_CONFIG_KEYS)}")
    steps = None
    if ladder != "auto":
        steps = _split("ladder", ladder)
        variants.resolve(steps, workload, dev)  # unknown names list the known ones
    warmup, repeats = _int("warmup", warmup, 0), _int("repeats", repeats, 1)
    e2e_blocks = _int("e2e_blocks", e2e_blocks, 0) or (4 if dev.type == "cuda" else 3)
    recompile_blocks = _int("recompile_blocks", recompile_blocks, 2)
    e2e_ddim_steps, e2e_repeats = _int("e2e_ddim_steps", e2e_ddim_steps, 1), _int("e2e_repeats", e2e_repeats, 1)
    seed = _int("seed", seed, 0)
    p = get_preset(name)
    for pname, nb in (("e2e_blocks", e2e_blocks), ("recompile_blocks", recompile_blocks)):
        if workload == "mg2" and p.local_attn_size == -1 and nb * p.num_frame_per_block > p.max_latent_frames:
            raise ValueError(f"{pname}={nb} is not allowed for preset {name!r}: at most "
                             f"{p.max_latent_frames // p.num_frame_per_block} blocks fit its full-window KV cache")
    out = Path(output_dir) if output_dir != "auto" else REPO / "reports" / "artifacts" / NOTEBOOK / f"{name}-{dev.type}"
    rp = default_results_path(p.tiny) if results_path == "auto" else Path(results_path)
    return CompileConfig(workload=workload, preset=name, device=dev, ladder=steps, sections=tuple(secs),
                         compile_modes=tuple(modes), compile_backend=backend, compile_table=tuple(ctable),
                         warmup=warmup, repeats=repeats,
                         e2e_blocks=e2e_blocks, recompile_blocks=recompile_blocks, e2e_ddim_steps=e2e_ddim_steps,
                         e2e_repeats=e2e_repeats,
                         output_dir=out, results_path=rp, seed=seed)


# --- the pieces -----------------------------------------------------------------------------------------


def reference(cfg: CompileConfig):
    """The fp32 eager reference pipeline every table and ladder row starts from (a deep copy per row)."""
    from .variants.ladder import build_reference

    return build_reference(cfg.workload, cfg.preset, cfg.device, cfg.seed)


def precision_names(cfg: CompileConfig) -> list[str]:
    names = ["tf32", "bf16", "autocast-bf16"]
    if cfg.device.type == "cuda":
        names.insert(2, "fp16")
    return names


def precision_table(ref, cfg: CompileConfig, ceilings: dict | None = None) -> pd.DataFrame:
    from .variants.ladder import variant_table

    return variant_table(ref, cfg.workload, precision_names(cfg), device=cfg.device, seed=cfg.seed,
                         warmup=cfg.warmup, repeats=cfg.repeats, ceilings=ceilings)


def vae_table(ref, cfg: CompileConfig) -> pd.DataFrame:
    from .variants.ladder import vae_table as _vae

    gpu = cfg.device.type == "cuda"
    return _vae(ref, cfg.workload, ("fp32", "bf16", "fp16") if gpu else ("fp32", "bf16"), device=cfg.device,
                seed=cfg.seed, repeats=3 if gpu else 1, layouts=(False, True) if gpu else (False,))


def hygiene_table(ref, cfg: CompileConfig) -> pd.DataFrame:
    from .variants.ladder import op_counts

    d = WORKING_DTYPE
    return op_counts(ref, cfg.workload, {f"{d} eager": [d], f"{d} + hygiene": [d, "hygiene"]}, device=cfg.device,
                     seed=cfg.seed)


def attention_section(ref, cfg: CompileConfig):
    """(shapes of one forward, backend table, best backend, FlexAttention vs dense block-causal mask)."""
    from .variants.attention import attention_backend_table, best_backend, flex_vs_dense_mask, record_attention_shapes
    from .variants.ladder import apply_stack, forward_probe

    pipe, _ = apply_stack(ref, cfg.workload, [WORKING_DTYPE], cfg.device)
    probe = forward_probe(pipe, cfg.workload, cfg.seed)
    with torch.no_grad(), record_attention_shapes(pipe.model, forwards=1) as rec:
        probe.forward()
    shapes = rec.table()
    del pipe, probe
    gpu = cfg.device.type == "cuda"
    # flex is measured where it matters, on the block-causal mask (flex_vs_dense_mask): per shape it would
    # compile once for each of a forward's shapes
    backends = ["auto", "math", "efficient", "flash", "cudnn"] if gpu else ["auto", "math", "flash"]
    if importlib.util.find_spec("flash_attn") is not None:
        backends.append("flash_attn")
    table = attention_backend_table(shapes, backends=backends, device=cfg.device, dtype=WORKING_DTYPE,
                                    warmup=cfg.warmup, repeats=cfg.repeats)
    best = best_backend(table)
    flex = None
    if cfg.workload == "mg2":
        kw = {} if not cfg.tiny else {"frames": 9, "frame_seqlen": 32, "heads": 2, "head_dim": 16}
        flex = flex_vs_dense_mask(device=cfg.device, dtype=WORKING_DTYPE, **kw)
    return shapes, table, best, flex


def default_ladder(cfg: CompileConfig, attention: str | None = None) -> list[str]:
    """tf32 -> bf16 -> dtype hygiene [-> channels-last -> cuDNN benchmark] [-> attention] [-> mg2: fused action
    attention] -> compile modes."""
    steps = ["tf32", WORKING_DTYPE, "hygiene"]
    if cfg.workload == "wma":
        steps += ["channels-last"] + (["cudnn-benchmark"] if cfg.device.type == "cuda" else [])
    if attention and attention != "auto":
        from . import variants

        v = variants.get(f"attn-{attention}")  # on a CPU the timed winner can be a kernel only CUDA runs as a variant
        if cfg.device.type == "cuda" or not v.gpu_only:
            steps.append(v.name)
    if cfg.workload == "mg2":
        # the action modules' tiny attentions as fusable math: written for the compiled row that follows (H100,
        # compiled: SDPA spent 6.8 of 28.7 ms of GPU time per forward on them, padding 3x6 problems to 64x128 tiles)
        steps.append("action-attn-fused")
    # the DiT compiles its repeated block (regional); the UNet compiles whole: regionally its ~20 distinct
    # blocks cost more host time per forward than they save (H100: 128 ms regional vs 89 ms whole, same kernels
    # within 10%; on a CPU with the tracing-only backend regional adds 7% to a tiny forward, whole nothing),
    # and it has no per-block Python ints to recompile on
    steps += [COMPILE_MODES[m].replace("regional", "whole") if cfg.workload == "wma" else COMPILE_MODES[m]
              for m in cfg.compile_modes]
    if cfg.device.type != "cuda":
        steps = [s for s in steps if not s.endswith("-max-autotune")]  # autotuning means nothing off a GPU
    return steps


def run_ladder(ref, cfg: CompileConfig, steps: list[str], ceilings: dict | None):
    from .variants.ladder import run_ladder as _run

    return _run(cfg.workload, cfg.preset, steps, device=cfg.device, seed=cfg.seed, warmup=cfg.warmup,
                repeats=cfg.repeats, e2e_blocks=cfg.e2e_blocks, e2e_ddim_steps=cfg.e2e_ddim_steps,
                e2e_repeats=cfg.e2e_repeats, ceilings=ceilings, compile_backend=cfg.compile_backend, reference=ref)


COMPILE_CONFIG_KEYS = ("reference", "hygiene", "dynamic", "whole", "max-autotune")


def compile_configs(cfg: CompileConfig) -> list[tuple[str, list[str], object]]:
    """(label, variants applied before compiling, CompileSpec) for the compile table: the regional compile of
    the reference code first (what recompiles and why), then after the fix, dynamic, whole model, modes."""
    from .variants.compile import CompileSpec

    d, b = WORKING_DTYPE, cfg.compile_backend
    rows = {"reference": ("regional, reference code", [d], CompileSpec("regional", "default", False, b)),
            "hygiene": ("regional, after hygiene", [d, "hygiene"], CompileSpec("regional", "default", False, b)),
            "dynamic": ("regional, dynamic=True", [d, "hygiene"], CompileSpec("regional", "default", True, b)),
            "whole": ("whole model", [d, "hygiene"], CompileSpec("whole", "default", False, b))}
    if "max-autotune-no-cudagraphs" in cfg.compile_modes and b == "inductor":
        rows["max-autotune"] = ("regional, max-autotune-no-cudagraphs", [d, "hygiene"],
                                CompileSpec("regional", "max-autotune-no-cudagraphs", False, b))
    return [rows[k] for k in cfg.compile_table if k in rows]


def compile_section(ref, cfg: CompileConfig, configs=None, ceilings: dict | None = None):
    """One row per configuration: cold and warm compile time (empty vs filled on-disk cache), graphs, graph
    breaks, steady forward ms, and the recompiles of a warm end-to-end run (e2e_blocks blocks or one
    iteration) after a first, warming one, then the warm model's steady forward (median, p20-p80 over `repeats`),
    its GPU busy time and both against the FLOP floor (with `ceilings`). Also the graph-break report of the
    reference code's regional compile."""
    from .profiling.breakdown import device_busy_ms
    from .variants import GlobalFlags
    from .variants.builtin import compile_regions, raise_recompile_limit_for_regions
    from .variants.compile import CompileMonitor, measure_compile_time
    from .variants.ladder import apply_stack, end_to_end, flop_floor_ms, forward_probe

    flags = GlobalFlags()
    rows, breaks, reasons = [], None, None
    for label, names, spec in configs or compile_configs(cfg):
        state = {}

        def make_model(names=names, spec=spec):
            flags.restore()
            if spec.scope == "regional":  # as the compile variants do
                raise_recompile_limit_for_regions()
            pipe, _ = apply_stack(ref, cfg.workload, names, cfg.device)
            state["pipe"], state["probe"] = pipe, forward_probe(pipe, cfg.workload, cfg.seed)
            return pipe.model if cfg.workload == "mg2" else pipe.model.diffusion_model

        def regions(model):
            return compile_regions(state["pipe"], cfg.workload)

        def after_warm(model):
            # on the warm model (on-disk cache filled): one end-to-end run compiles the shapes the probe did not
            # see, the next one is counted (the steady-state recompiles the goal is about)
            pipe = state["pipe"]
            with CompileMonitor() as warm:
                end_to_end(pipe, cfg.workload, cfg.seed, num_blocks=cfg.recompile_blocks,
                           ddim_steps=cfg.e2e_ddim_steps)
            with CompileMonitor() as steady:
                e2e = end_to_end(pipe, cfg.workload, cfg.seed, num_blocks=cfg.recompile_blocks,
                                 ddim_steps=cfg.e2e_ddim_steps)
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
        rows.append({"config": label, "variants": " + ".join(names), "scope": spec.scope, "mode": spec.mode,
                     "dynamic": spec.dynamic, "cold_s": row.get("cold_s"), "warm_s": row.get("warm_s"),
                     "steady_forward_ms": row["steady_ms"], "steady_p20": row["steady_p20"],
                     "steady_p80": row["steady_p80"], "x_floor": row["steady_ms"] / floor, "gpu_busy_ms": busy, "busy_x_floor": busy / floor,
                     "graphs": row.get("cold_graphs"),
                     "graph_breaks": row.get("graph_breaks"),
                     "warmup_run_recompiles": warm.summary()["recompiles"],
                     "steady_run_recompiles": steady.summary()["recompiles"],
                     "recompile_reasons": _reason_summary(warm.recompiles),
                     "e2e_metric": e2e["metric"], "e2e_value": e2e["value"], "e2e_unit_count":
                         cfg.recompile_blocks if cfg.workload == "mg2" else cfg.e2e_ddim_steps})
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


# --- figures, rows, interpretation ---------------------------------------------------------------------


def plot_forward_vs_floor(ladder, ax=None):
    """Time per forward of each ladder row against the FLOP floor (measured GEMM ceiling)."""
    import matplotlib.pyplot as plt

    t = ladder.table()
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.45 * len(t) + 1))
    ok = t["gate"].isin(["pass", "reference"])
    ax.barh(t["variant"][::-1], t["forward_ms"][::-1], xerr=[(t["forward_ms"] - t["forward_p20"])[::-1],
                                                            (t["forward_p80"] - t["forward_ms"])[::-1]],
            color=["#4477aa" if o else "#cccccc" for o in ok[::-1]], capsize=2)
    if ladder.floor_ms == ladder.floor_ms:
        ax.axvline(ladder.floor_ms, color="k", ls="--", lw=1, label=f"FLOP floor {ladder.floor_ms:.3g} ms")
        ax.axvline(GOALS["dit_x_floor"] * ladder.floor_ms, color="#ee6677", ls=":", lw=1,
                   label=f"{GOALS['dit_x_floor']}x floor")
        ax.legend(fontsize=7)
    ax.set_xscale("log")
    ax.set_xlabel("ms per forward (median, p20-p80 bars; log scale)")
    ax.set_title("Time per forward vs FLOP floor")
    return ax


def plot_compile_times(df: pd.DataFrame, ax=None):
    import matplotlib.pyplot as plt

    d = df.dropna(subset=["cold_s"]) if "cold_s" in df else df.iloc[0:0]
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 0.5 * max(len(d), 1) + 1))
    y = range(len(d))
    ax.barh([i + 0.2 for i in y], d["cold_s"], height=0.4, label="cold (empty cache)", color="#ee6677")
    ax.barh([i - 0.2 for i in y], d["warm_s"], height=0.4, label="warm (on-disk cache)", color="#66ccee")
    ax.set_yticks(list(y), d["config"])
    ax.axvline(GOALS["regional_cold_s"], color="k", ls=":", lw=1, label=f"{GOALS['regional_cold_s']:.0f} s goal")
    ax.set_xlabel("compile time: first call, s")
    ax.set_title("Compile time")
    ax.legend(fontsize=7)
    return ax


def result_rows(cfg: CompileConfig, ladder=None, compile_df=None, attention_best=None) -> list[dict]:
    common = dict(notebook=NOTEBOOK, workload=cfg.workload, preset=cfg.preset, params=cfg.params(),
                  warmup=cfg.warmup, repeats=cfg.repeats)
    rows = []
    if ladder is not None:
        for _, r in ladder.table().iterrows():
            v = r["stack"] if r["stack"] != "-" else "fp32-eager"
            extra = dict(gate=r["gate"], rel_l2_vs_fp32=r["rel_l2_vs_fp32"])
            rows.append(results_store.make_row(metric="forward_ms", value=r["forward_ms"], unit="ms", variant=v,
                                               **common, **extra) | {"p20": r["forward_p20"], "p80": r["forward_p80"],
                                                                      "median": r["forward_ms"], "n": cfg.repeats})
            for m, unit in (("speedup", "x"), ("x_floor", "x"), ("gpu_busy_ms", "ms"), ("busy_x_floor", "x"),
                            ("e2e_value", r["e2e_metric"]), ("psnr_db", "dB"),
                            ("peak_memory_gib", "GiB"), ("first_call_s", "s"), ("recompiles", "count")):
                val = r[m]
                if val is not None and not (isinstance(val, float) and math.isnan(val)):
                    name = r["e2e_metric"] if m == "e2e_value" else m
                    rows.append(results_store.make_row(metric=name, value=float(val), unit=unit, variant=v, **common,
                                                       **extra))
    if compile_df is not None and len(compile_df) and "cold_s" in compile_df:
        for _, r in compile_df.dropna(subset=["cold_s"]).iterrows():
            v = f"compile:{r['config']}"
            for m, unit in (("cold_s", "s"), ("warm_s", "s"), ("steady_forward_ms", "ms"), ("x_floor", "x"),
                            ("gpu_busy_ms", "ms"), ("busy_x_floor", "x"),
                            ("steady_run_recompiles", "count"), ("graph_breaks", "count")):
                if r.get(m) is not None and r[m] == r[m]:
                    spread = ({"median": r[m], "p20": r["steady_p20"], "p80": r["steady_p80"], "n": cfg.repeats}
                              if m == "steady_forward_ms" and "steady_p20" in r else {})
                    rows.append(results_store.make_row(metric=m, value=float(r[m]), unit=unit, variant=v, **common)
                                | spread)
    if attention_best:
        rows.append(results_store.make_row(metric="attention_best_backend", value=float("nan"), unit=attention_best,
                                           variant="attention", **common))
    return rows


def interpret(cfg: CompileConfig, ladder=None, compile_df=None, vae=None, hygiene=None) -> str:
    """Sentences computed from the measurements, checked against the issue's goals."""
    lines = []
    if ladder is not None:
        t = ladder.table()
        last_ok = t[t["gate"].isin(["pass", "reference"])].iloc[-1]
        failed = t[t["gate"] == "FAIL"]["variant"].tolist()
        lines.append(f"The ladder takes one {('DiT' if cfg.workload == 'mg2' else 'UNet')} forward from "
                     f"{t['forward_ms'].iloc[0]:.3g} ms (fp32 eager) to {last_ok['forward_ms']:.3g} ms with "
                     f"`{last_ok['stack']}`, {last_ok['speedup']:.2f}x, every counted row within its correctness gate"
                     + (f"; rows that failed it (not counted): {failed}" if failed else "") + ".")
        if last_ok["x_floor"] == last_ok["x_floor"]:
            goal = GOALS["dit_x_floor"]
            busy = last_ok.get("gpu_busy_ms", float("nan"))
            lines.append(f"That is {last_ok['x_floor']:.2f}x the FLOP floor of {ladder.floor_ms:.3g} ms"
                         + (f" (the DiT goal of {goal}x: {'met' if last_ok['x_floor'] <= goal else 'missed'})"
                            if cfg.workload == "mg2" else "")
                         + (f"; its kernels alone keep the GPU busy {busy:.3g} ms ({last_ok['busy_x_floor']:.2f}x)"
                            if busy == busy else "") + ".")
        best = t.loc[t["speedup"].idxmax()] if t["speedup"].notna().any() else None
        if best is not None and best.name != last_ok.name:
            lines.append(f"The fastest counted forward is row {best.name} (`{best['stack']}`): {best['forward_ms']:.3g} ms, "
                         f"{best['speedup']:.2f}x; later rows are slower, so they do not pay off at this shape.")
        e2e = t["e2e_speedup"].dropna()
        if len(e2e) > 1:
            unit = "FPS" if cfg.workload == "mg2" else "per DDIM step"
            top = t.loc[e2e.idxmax()]
            line = f"End to end ({t['e2e_metric'].iloc[0]}): {e2e.iloc[-1]:.2f}x {unit} over fp32 eager for the last row"
            if e2e.idxmax() != e2e.index[-1]:
                line += f", {e2e.max():.2f}x at best (row {top.name}, `{top['stack']}`)"
            if cfg.workload == "wma":
                line += (f"; the goal of {GOALS['wma_step_speedup']}x per DDIM step "
                         f"{'is met' if e2e.max() >= GOALS['wma_step_speedup'] else 'is missed'}")
            lines.append(line + ". End-to-end numbers are medians of few runs: see the table for the forward spread.")
        psnr = last_ok["psnr_db"]
        if psnr == psnr and not math.isinf(psnr):
            lines.append(f"Decoded frames of that row are {psnr:.1f} dB PSNR from the fp32 reference's.")
    if compile_df is not None and len(compile_df) and "cold_s" in compile_df:
        c = compile_df.set_index("config")
        if "regional, reference code" in c.index:
            r0 = c.loc["regional, reference code"]
            lines.append(f"Compiling the reference code regionally gives {int(r0['graph_breaks'] or 0)} graph breaks "
                         f"and {int(r0['warmup_run_recompiles'])} recompiles in its first end-to-end run "
                         f"({int(r0['steady_run_recompiles'])} in the next).")
        if "regional, after hygiene" in c.index:
            r1 = c.loc["regional, after hygiene"]
            cold_ok = r1["cold_s"] < GOALS["regional_cold_s"]
            lines.append(f"After the fix (no host reads, no Python ints or lazily filled caches inside a block): "
                         f"{int(r1['graph_breaks'] or 0)} graph breaks, {int(r1['warmup_run_recompiles'])} recompiles "
                         f"while the first run warms its shapes and {int(r1['steady_run_recompiles'])} across the next "
                         f"{'%d-block' % cfg.recompile_blocks if cfg.workload == 'mg2' else 'iteration'} run (goal: 0); cold "
                         f"compile {r1['cold_s']:.1f} s, warm {r1['warm_s']:.1f} s"
                         + (f" (goal under {GOALS['regional_cold_s']:.0f} s cold: {'met' if cold_ok else 'missed'})"
                            if cfg.workload == "mg2" else "") + ".")
        if "x_floor" in c and c["x_floor"].notna().any():
            b = c.loc[c["x_floor"].idxmin()]
            lines.append(f"The fastest compiled forward is `{b.name}` at {b['steady_forward_ms']:.3g} ms "
                         f"(p20-p80 {b['steady_p20']:.3g}-{b['steady_p80']:.3g}), {b['x_floor']:.2f}x the FLOP floor"
                         + (f" (goal {GOALS['dit_x_floor']}x: {'met' if b['x_floor'] <= GOALS['dit_x_floor'] else 'missed'})"
                            if cfg.workload == "mg2" else "")
                         + (f"; its kernels alone keep the GPU busy {b['gpu_busy_ms']:.3g} ms "
                            f"({b['busy_x_floor']:.2f}x the floor), the remaining "
                            f"{max(0.0, 1 - b['gpu_busy_ms'] / b['steady_forward_ms']):.0%} of the wall time is host "
                            f"and launch overhead that CUDA graphs (notebook 06) target" if b["gpu_busy_ms"] == b["gpu_busy_ms"]
                            else "") + ".")
        if "whole model" in c.index and "regional, after hygiene" in c.index:
            w, r1 = c.loc["whole model"], c.loc["regional, after hygiene"]
            if w["cold_s"] == w["cold_s"]:
                lines.append(f"Whole-model compile takes {w['cold_s']:.1f} s cold vs {r1['cold_s']:.1f} s regional, "
                             f"for a steady forward of {w['steady_forward_ms']:.3g} vs {r1['steady_forward_ms']:.3g} ms.")
    if vae is not None and len(vae):
        v = vae[~vae["channels_last"]].set_index("vae_dtype")
        worst = v["psnr_db"].replace(math.inf, float("nan")).idxmin() if len(v) > 1 else None
        if worst is not None and worst == worst:
            lines.append(f"The VAE in {worst} decodes at {v.loc[worst, 'psnr_db']:.1f} dB PSNR against fp32 "
                         f"({v.loc[worst, 'ms_per_frame']:.3g} vs {v.loc['fp32', 'ms_per_frame']:.3g} ms per frame).")
    if hygiene is not None and len(hygiene) == 2:
        a, b = hygiene.iloc[0], hygiene.iloc[1]
        casts = lambda r: int(r["aten::to"] + r["aten::_to_copy"] + r["aten::copy_"])  # noqa: E731
        lines.append(f"Dtype hygiene takes a forward from {casts(a)} to {casts(b)} cast/copy ops and from "
                     f"{int(a['host reads (aten::_local_scalar_dense)'])} to "
                     f"{int(b['host reads (aten::_local_scalar_dense)'])} host reads.")
    if cfg.tiny:
        lines.append("Tiny-preset CPU numbers (compile backend %s): they check the transforms and the gate, not the "
                     "speed of the real model." % cfg.compile_backend)
    return " ".join(lines)
