"""Notebook-01 logic for the UnifoLM-WMA workload: validated parameters, the eager baseline, tables, figures, prose.

Shape mirrors `wmbook.baseline` (the causal workload): validate -> build -> benchmark -> summary / tables /
result_rows / interpret / plots. One measured unit is an interaction iteration: conditioning, the decision
pass, the world-model pass (each DDIM sampling + per-frame VAE decode) and saving the results.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from .baseline import _int, check_common, closing_lines, default_results_path, summary_rows
from .bench import Timing
from .check import require_finite
from .device import floor_ms
from .models.wma.flops import unet_forward_flops
from .pipelines.ddim import WMAInputs, WMAInteractionPipeline, WMAOutput, check_run_params
from .presets import WMA_PRESETS, dtype_name, get_preset, resolve_dtype
from .profiling.sections import SectionTimer

REPO = Path(__file__).resolve().parent.parent
WORKLOAD = "wma"
# The seed's upstream profile (11 iterations, 22 samplings, DDIM 50, CFG 1.0, fp32 eager; GPU not named)
SEED_PROFILE = {"iteration_s": 76.07, "step_s": 0.712, "sampling_share": 0.93, "decode_s_per_pass": 0.566,
                "conditioning_s_per_pass": 0.133, "save_s": 3.52, "peak_gib": 17890.5 / 1024, "ddim_steps": 50}


@dataclass
class WMABaselineConfig:
    preset: str
    device: torch.device
    dtype: torch.dtype
    vae_dtype: torch.dtype
    ddim_steps: int
    guidance_scale: float
    warmup: int
    repeats: int
    profile: bool
    output_dir: Path
    seed: int
    results_path: Path
    workload: str = WORKLOAD

    @property
    def tiny(self) -> bool:
        return get_preset(self.preset).tiny

    def params(self) -> dict:
        return {"preset": self.preset, "device": str(self.device), "dtype": dtype_name(self.dtype),
                "vae_dtype": dtype_name(self.vae_dtype), "ddim_steps": self.ddim_steps,
                "guidance_scale": self.guidance_scale, "seed": self.seed, "profile": self.profile}

    def table(self) -> pd.DataFrame:
        d = self.params() | {"warmup": self.warmup, "repeats": self.repeats, "output_dir": str(self.output_dir),
                             "results_path": str(self.results_path)}
        return pd.DataFrame({"value": d}).rename_axis("parameter")


def validate(*, preset="auto", device="auto", dtype="auto", vae_dtype="auto", ddim_steps=0, guidance_scale=1.0,
             warmup=1, repeats=3, profile=True, output_dir="auto", seed=0, results_path="auto",
             workload=WORKLOAD) -> WMABaselineConfig:
    """Check every notebook parameter before any heavy work; errors name the parameter and allowed values.

    vae_dtype 'auto' is fp32 for this workload (upstream decodes in fp32); ddim_steps 0 = the preset's 50.
    """
    if workload != WORKLOAD:
        raise ValueError(f"workload={workload!r} is not allowed here; allowed values: [{WORKLOAD!r}]")
    ddim_steps = _int("ddim_steps", ddim_steps, 0)
    dev, name, p, warmup, repeats, seed = check_common(WMA_PRESETS, "wma", preset=preset, device=device,
                                                       dtype=dtype, vae_dtype=vae_dtype, warmup=warmup,
                                                       repeats=repeats, seed=seed, profile=profile)
    dt = resolve_dtype(dtype, dev)
    vdt = torch.float32 if vae_dtype == "auto" else resolve_dtype(vae_dtype, dev)
    for name_, d in (("dtype", dt), ("vae_dtype", vdt)):
        if dev.type == "cpu" and d == torch.float16:
            raise ValueError(f"{name_}='fp16' is not allowed on a CPU; allowed values there: ['auto', 'fp32', 'bf16']")
    steps, gs, _, _ = check_run_params(p, ddim_steps or p.default_steps, guidance_scale)
    artifacts = REPO / "reports" / "artifacts" / "01_baseline_profiling"
    out = Path(output_dir) if output_dir != "auto" else artifacts / f"{name}-{dev.type}"
    rp = default_results_path(p.tiny) if results_path == "auto" else Path(results_path)
    return WMABaselineConfig(preset=name, device=dev, dtype=dt, vae_dtype=vdt, ddim_steps=steps, guidance_scale=gs,
                             warmup=warmup, repeats=repeats, profile=profile, output_dir=out, seed=seed,
                             results_path=rp)


def build(cfg: WMABaselineConfig) -> tuple[WMAInteractionPipeline, WMAInputs]:
    pipe = WMAInteractionPipeline(cfg.preset, device=str(cfg.device), dtype=dtype_name(cfg.dtype),
                                  vae_dtype=dtype_name(cfg.vae_dtype), seed=cfg.seed)
    return pipe, pipe.prepare(seed=cfg.seed)


def run_callable(pipe: WMAInteractionPipeline, inputs: WMAInputs, cfg: WMABaselineConfig):
    """One labelled interaction iteration with its results saved under output_dir, as a 0-arg callable."""
    return lambda: pipe.run_iteration(inputs, ddim_steps=cfg.ddim_steps, guidance_scale=cfg.guidance_scale,
                                      save_dir=cfg.output_dir / "iteration", progress=False)


def generate_callable(pipe: WMAInteractionPipeline, inputs: WMAInputs, cfg: WMABaselineConfig):
    """One interaction iteration without saving (both passes, both decodes), as a 0-arg callable."""
    return lambda: pipe.run_iteration(inputs, ddim_steps=cfg.ddim_steps, guidance_scale=cfg.guidance_scale,
                                      progress=False)


def _numel(m: torch.nn.Module) -> int:
    return sum(t.numel() for t in m.parameters())


def model_table(pipe: WMAInteractionPipeline, inputs: WMAInputs, cfg: WMABaselineConfig) -> pd.DataFrame:
    """Sizes and shapes of the built pipeline."""
    p, dm = pipe.preset, pipe.model.diffusion_model
    heads = _numel(dm.action_unet) + _numel(dm.state_unet)
    cond = (_numel(pipe.clip) + _numel(pipe.text) + _numel(pipe.model.image_proj_model)
            + _numel(pipe.model.state_projector) + _numel(pipe.model.action_projector))
    fl = unet_forward_flops(p)
    rows = {
        "video UNet parameters (M)": (_numel(dm) - heads) / 1e6,
        "action + state head parameters (M)": heads / 1e6,
        "conditioning parameters (M): CLIP, text, resampler, projectors": cond / 1e6,
        "VAE decoder parameters (M)": (_numel(pipe.vae.decoder) + _numel(pipe.vae.post_quant_conv)) / 1e6,
        "frames x height x width": f"{p.frames} x {p.height} x {p.width}",
        "latent shape [C, T, h, w]": str(list(p.latent_shape)),
        "context tokens per frame (state+action+text+image)":
            p.n_obs_steps + p.horizon * p.num_stem_token + p.text_len + p.resampler_queries,
        "DDIM steps per pass": cfg.ddim_steps,
        "UNet forwards per step": 2 if cfg.guidance_scale != 1.0 else 1,
        "UNet forward TFLOP (one branch)": fl["total"] / 1e12,
        "n_obs_steps": p.n_obs_steps,
        "eta / guidance rescale": f"{p.ddim_eta} / {p.guidance_rescale}",
    }
    return pd.DataFrame({"value": rows}).rename_axis("quantity")


def _med(xs) -> float:
    return float(np.median(xs)) if len(xs) else float("nan")


@dataclass
class WMABaselineResult:
    runs: list[WMAOutput]
    preset: str
    ceilings: dict
    guidance_scale: float = 1.0
    sections: pd.DataFrame | None = None
    extra: dict = field(default_factory=dict)

    def run_table(self) -> pd.DataFrame:
        """One row per timed iteration (device events)."""
        rows = []
        for i, r in enumerate(self.runs):
            rows.append({"run": i, "iteration_s": r.iteration_ms / 1e3, "conditioning_ms": r.conditioning_ms,
                         "decision_sampling_ms": r.decision.sampling_ms, "decision_decode_ms": r.decision.decode_ms,
                         "world_sampling_ms": r.world.sampling_ms, "world_decode_ms": r.world.decode_ms,
                         "save_ms": r.save_ms,
                         "peak_memory_gib": r.peak_memory_bytes / 2**30 if r.peak_memory_bytes else np.nan})
        return pd.DataFrame(rows).set_index("run")

    def phase_table(self) -> pd.DataFrame:
        """Median ms per phase of the iteration and its share; 'other' = labels between phases, host gaps."""
        rt = self.run_table()
        ph = {"conditioning": rt["conditioning_ms"], "decision sampling": rt["decision_sampling_ms"],
              "decision decode": rt["decision_decode_ms"], "world-model sampling": rt["world_sampling_ms"],
              "world-model decode": rt["world_decode_ms"], "save": rt["save_ms"]}
        it = rt["iteration_s"] * 1e3
        ph["other"] = it - sum(ph.values())
        df = pd.DataFrame({"ms": {k: float(v.median()) for k, v in ph.items()}})
        df["share"] = df["ms"] / float(it.median())
        return df.rename_axis("phase")

    def step_table(self) -> pd.DataFrame:
        """Per pass and DDIM step (median over runs): step, UNet forward(s), scheduler update."""
        r0 = self.runs[0]
        rows = []
        for name, get in (("decision", lambda r: r.decision), ("world_model", lambda r: r.world)):
            for j, t in enumerate(r0.timesteps):
                rows.append({"pass": name, "step": j, "t": t,
                             "step_ms": _med([get(r).step_ms[j] for r in self.runs]),
                             "forward_ms": _med([get(r).forward_ms[j] for r in self.runs]),
                             "update_ms": _med([get(r).update_ms[j] for r in self.runs])})
        return pd.DataFrame(rows)

    def summary(self) -> dict:
        p = get_preset(self.preset)
        r0 = self.runs[0]
        fpp = r0.forwards_per_step
        passes = [x for r in self.runs for x in (r.decision, r.world)]
        step = Timing(times_ms=[ms for ps in passes for ms in ps.step_ms])
        fwd = Timing(times_ms=[ms / fpp for ps in passes for ms in ps.forward_ms])
        it_ms = [r.iteration_ms for r in self.runs]
        flops = unet_forward_flops(p)["total"]
        fl_ms = floor_ms(flops, self.ceilings)
        total = float(np.sum(it_ms))
        decoded = [ps for ps in passes if ps.frames is not None]
        frames_decoded = sum(ps.frames.shape[2] for ps in decoded)
        peaks = [r.peak_memory_bytes for r in self.runs if r.peak_memory_bytes]
        return {
            "iteration_s": Timing(times_ms=[ms / 1e3 for ms in it_ms]),
            "ddim_step_ms": step,
            "unet_forward_ms": fwd,
            "ddim_update_ms": _med([ms for ps in passes for ms in ps.update_ms]),
            "unet_forward_tflop": flops / 1e12,
            "unet_floor_ms": fl_ms,
            "unet_forward_over_floor": fwd.median / fl_ms,
            "achieved_tflops": flops / (fwd.median * 1e-3) / 1e12,
            "unet_forwards_per_iteration": float(r0.unet_forwards),
            "sampling_share": sum(ps.sampling_ms for ps in passes) / total,
            "vae_decode_share": sum(ps.decode_ms for ps in passes) / total,
            "vae_decode_ms_per_frame": sum(ps.decode_ms for ps in decoded) / max(frames_decoded, 1),
            "conditioning_share": sum(r.conditioning_ms for r in self.runs) / total,
            "save_share": sum(r.save_ms for r in self.runs) / total,
            "peak_memory_gib": max(peaks) / 2**30 if peaks else float("nan"),
        }

    def summary_table(self) -> pd.DataFrame:
        rows = []
        for k, v in self.summary().items():
            if isinstance(v, Timing):
                rows.append({"metric": k, "median": v.median, "p20": v.p20, "p80": v.p80, "n": v.n})
            else:
                rows.append({"metric": k, "median": v, "p20": np.nan, "p80": np.nan, "n": np.nan})
        return pd.DataFrame(rows).set_index("metric")

    def detail_tables(self) -> dict[str, pd.DataFrame]:
        """The workload's detail tables for notebook 01, by title."""
        out = {"Per phase of the iteration (median over runs)": self.phase_table(),
               "Per pass and DDIM step, ms (median over runs)":
                   self.step_table().pivot(index="step", columns="pass", values="step_ms")}
        if self.sections is not None:
            out["Nested section table of one iteration (count, total, mean, self vs total; device events)"] = \
                self.sections[["path", "count", "total_ms", "mean_ms", "self_ms", "share_of_parent"]]
        return out

    def section_table(self) -> pd.DataFrame:
        """The nested section table (count, total, mean, self vs total) of the sectioned iteration."""
        if self.sections is None:
            raise ValueError("no section table: run benchmark(..., sections=True)")
        return self.sections


def benchmark(pipe: WMAInteractionPipeline, inputs: WMAInputs, *, warmup: int, repeats: int, ceilings: dict,
              ddim_steps: int | None = None, guidance_scale: float = 1.0, save_dir=None,
              sections: bool = True) -> WMABaselineResult:
    """Eager baseline: `warmup` untimed iterations, `repeats` timed ones (device events), then one more with a
    SectionTimer attached for the nested section table (kept out of the timed runs)."""
    kw = dict(ddim_steps=ddim_steps, guidance_scale=guidance_scale, save_dir=save_dir, progress=False)
    check_run_params(pipe.preset, ddim_steps, guidance_scale)  # fail before the first iteration
    for _ in tqdm(range(warmup), desc="warm-up", leave=False):
        pipe.run_iteration(inputs, **kw)
    runs = [pipe.run_iteration(inputs, **kw) for _ in tqdm(range(repeats), desc="timed iterations", leave=False)]
    require_finite(runs[-1].reference(), f"the eager pipeline ({pipe.preset.name})")
    table = None
    if sections:
        timer = SectionTimer(pipe.device)
        with timer.attached():
            pipe.run_iteration(inputs, **kw)
        table = timer.table()
    return WMABaselineResult(runs=runs, preset=pipe.preset.name, ceilings=ceilings, guidance_scale=guidance_scale,
                             sections=table)


def run_benchmark(pipe: WMAInteractionPipeline, inputs: WMAInputs, cfg: WMABaselineConfig,
                  ceilings: dict) -> WMABaselineResult:
    """benchmark() with the notebook's validated settings."""
    return benchmark(pipe, inputs, warmup=cfg.warmup, repeats=cfg.repeats, ceilings=ceilings,
                     ddim_steps=cfg.ddim_steps, guidance_scale=cfg.guidance_scale)


def floor_table(pipe: WMAInteractionPipeline, cfg: WMABaselineConfig, ceilings: dict) -> pd.DataFrame:
    """Analytic FLOPs of one UNet forward (one guidance branch) by part, and each part's floor."""
    parts = unet_forward_flops(pipe.preset)
    df = pd.DataFrame({"GFLOP": {k: v / 1e9 for k, v in parts.items()}})
    df["floor_ms"] = [floor_ms(v, ceilings) for v in parts.values()]
    return df.rename_axis("part")


def profile_stages(pipe: WMAInteractionPipeline, inputs: WMAInputs, cfg: WMABaselineConfig,
                   trace_steps: int = 3):
    """Stage table of one full iteration from device-event sections (exact and cheap at 50 steps), and a
    torch.profiler trace of a short iteration (`trace_steps` DDIM steps per pass) to open in Perfetto:
    (stage table, trace path, section table)."""
    from .profiling import profile

    timer = SectionTimer(pipe.device)
    with timer.attached():
        pipe.run_iteration(inputs, ddim_steps=cfg.ddim_steps, guidance_scale=cfg.guidance_scale,
                           save_dir=cfg.output_dir / "iteration", progress=False)
    sec = timer.table()
    top = sec[sec["depth"] == 1].copy()  # the phases under the iteration label
    top["label"] = top["section"]
    stages = top.set_index("label")[["total_ms"]].rename(columns={"total_ms": "ms"})
    stages["source"] = "device events"
    stages["share"] = stages["ms"] / float(sec.loc[sec["depth"] == 0, "total_ms"].sum())
    steps = min(trace_steps, cfg.ddim_steps)
    prof = profile(lambda: pipe.run_iteration(inputs, ddim_steps=steps, guidance_scale=cfg.guidance_scale,
                                              progress=False), wait=0, warmup=1, active=1,
                   out_dir=cfg.output_dir, name=f"01_baseline_trace_{steps}steps")
    return stages, prof.trace_path, sec


def plot_overview(res: WMABaselineResult):
    """Time split of an iteration and the per-step times, side by side."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(13, 3.4), gridspec_kw={"width_ratios": [1.2, 1]})
    plot_time_split(res, ax=axes[0])
    plot_step_times(res, ax=axes[1])
    fig.tight_layout()
    return fig


def session_run(pipe: WMAInteractionPipeline, inputs: WMAInputs, cfg: WMABaselineConfig, session) -> None:
    """One labelled interaction iteration inside a ProfilingSession (no blocks: FPS does not apply; the
    iteration's own device-event timings go into the session metrics)."""
    out = pipe.run_iteration(inputs, ddim_steps=cfg.ddim_steps, guidance_scale=cfg.guidance_scale,
                             save_dir=cfg.output_dir / "iteration", progress=False)
    steps = out.decision.step_ms + out.world.step_ms
    session.set_metrics(workload="wma", preset=cfg.preset, dtype=dtype_name(cfg.dtype), ddim_steps=cfg.ddim_steps,
                        guidance_scale=cfg.guidance_scale, iteration_s=out.iteration_ms / 1e3,
                        ddim_step_ms_median=float(np.median(steps)), unet_forwards=out.unet_forwards)


_UNITS = {"iteration_s": "s", "ddim_step_ms": "ms", "unet_forward_ms": "ms", "ddim_update_ms": "ms",
          "unet_forward_tflop": "TFLOP", "unet_floor_ms": "ms", "unet_forward_over_floor": "x",
          "achieved_tflops": "TFLOP/s", "unet_forwards_per_iteration": "count", "sampling_share": "fraction",
          "vae_decode_share": "fraction", "vae_decode_ms_per_frame": "ms", "conditioning_share": "fraction",
          "save_share": "fraction", "peak_memory_gib": "GiB"}


def result_rows(cfg: WMABaselineConfig, res: WMABaselineResult, stages: pd.DataFrame | None = None,
                notebook: str = "01_baseline_profiling", variant: str = "eager") -> list[dict]:
    return summary_rows(cfg, res, _UNITS, stages, notebook, variant)


def interpret(cfg: WMABaselineConfig, res: WMABaselineResult, stages: pd.DataFrame | None = None) -> str:
    """Sentences computed from the measured numbers, with the seed's upstream profile beside them."""
    s = res.summary()
    p = get_preset(cfg.preset)
    dev = res.ceilings.get("device_name", str(cfg.device))
    it = s["iteration_s"]
    r0 = res.runs[0]
    n_fwd = r0.unet_forwards
    lines = [
        f"On {dev}, `{cfg.preset}` ({dtype_name(cfg.dtype)} model, {dtype_name(cfg.vae_dtype)} VAE) runs one "
        f"interaction iteration (2 passes x {cfg.ddim_steps} DDIM steps = {n_fwd} UNet forwards, "
        f"{2 * p.frames} frames decoded) in {it.median:.3g} s (p20 {it.p20:.3g}, p80 {it.p80:.3g}).",
        f"A DDIM step takes {s['ddim_step_ms'].median:.3g} ms; one UNet forward takes "
        f"{s['unet_forward_ms'].median:.3g} ms, {s['unet_forward_over_floor']:.1f}x its FLOP floor of "
        f"{s['unet_floor_ms']:.3g} ms ({s['unet_forward_tflop']:.3g} TFLOP at the measured "
        f"{res.ceilings.get('gemm_tflops', float('nan')):.3g} TFLOP/s GEMM ceiling), so it achieves "
        f"{s['achieved_tflops']:.3g} TFLOP/s; the three scheduler updates add {s['ddim_update_ms']:.3g} ms per step.",
        f"DDIM sampling holds {s['sampling_share']:.0%} of the iteration, VAE decoding {s['vae_decode_share']:.0%} "
        f"({s['vae_decode_ms_per_frame']:.3g} ms per frame), conditioning {s['conditioning_share']:.0%} and saving "
        f"{s['save_share']:.0%}.",
    ]
    seed = SEED_PROFILE
    line = (f"The seed's upstream profile (fp32 eager, DDIM {seed['ddim_steps']}, GPU not named) reported "
            f"{seed['iteration_s']:.0f} s per iteration, {seed['step_s']:.2f} s per step and "
            f"{seed['sampling_share']:.0%} in sampling; we measure {it.median:.3g} s, "
            f"{s['ddim_step_ms'].median / 1e3:.3g} s per step and {s['sampling_share']:.0%} in sampling")
    if cfg.ddim_steps != seed["ddim_steps"]:
        line += f", with {cfg.ddim_steps} steps per pass instead of {seed['ddim_steps']}"
    if not p.tiny:
        ratio = it.median / seed["iteration_s"]
        line += f" ({1 / ratio:.1f}x faster per iteration)" if ratio < 1 else f" ({ratio:.1f}x slower per iteration)"
    lines.append(line + ".")
    if not math.isnan(s["peak_memory_gib"]):
        lines.append(f"Peak device memory is {s['peak_memory_gib']:.1f} GiB (seed: {seed['peak_gib']:.1f} GiB).")
    floor_it = n_fwd * s["unet_floor_ms"] / 1e3
    lines.append(f"At the FLOP floor the {n_fwd} forwards would take {floor_it:.3g} s, "
                 f"{floor_it / it.median:.1%} of today's iteration.")
    return " ".join(lines + closing_lines(stages, p.tiny))


def plot_time_split(res: WMABaselineResult, ax=None):
    """One stacked bar: where an iteration's time goes (median over runs)."""
    import matplotlib.pyplot as plt

    pt = res.phase_table()
    if ax is None:
        _, ax = plt.subplots(figsize=(8, 2.2))
    colors = ["#228833", "#4477aa", "#aa3377", "#66ccee", "#ee6677", "#ccbb44", "#bbbbbb"]
    left = 0.0
    for (name, row), c in zip(pt.iterrows(), colors):
        ms = max(float(row["ms"]), 0.0)
        ax.barh(0, ms, left=left, color=c, label=f"{name} ({row['share']:.0%})")
        left += ms
    ax.set_yticks([])
    ax.set_xlabel("ms per interaction iteration")
    ax.set_title("Time split of one iteration (median over runs)")
    ax.legend(fontsize=7, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.45))
    return ax


def plot_step_times(res: WMABaselineResult, ax=None):
    """ms per DDIM step in each pass (median over runs), with the UNet forward(s)' FLOP floor."""
    import matplotlib.pyplot as plt

    st = res.step_table()
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3))
    for name, g in st.groupby("pass", sort=False):
        ax.plot(g["step"], g["step_ms"], marker=".", label=f"{name}: step")
        ax.plot(g["step"], g["forward_ms"], ls="--", lw=1, label=f"{name}: UNet forward(s)")
    s = res.summary()
    ax.axhline(s["unet_floor_ms"] * res.runs[0].forwards_per_step, color="k", lw=1, ls=":", label="FLOP floor")
    ax.set_xlabel("DDIM step")
    ax.set_ylabel("ms")
    ax.set_title("DDIM step times")
    ax.legend(fontsize=7)
    return ax
