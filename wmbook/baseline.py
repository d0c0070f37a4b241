"""Notebook 01 logic: validated parameters, the eager streaming baseline, its tables, figures and prose."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from tqdm.auto import tqdm

from . import results as results_store
from .bench import Timing
from .check import require_finite
from .device import floor_ms
from .models.flops import dit_forward_flops
from .pipelines.causal import CausalStreamingPipeline, StreamInputs, StreamOutput
from .presets import (DTYPES, PRESETS, dtype_name, get_preset, resolve_device, resolve_dtype, resolve_preset)

REPO = Path(__file__).resolve().parent.parent
WORKLOADS = ("mg2",)


@dataclass
class BaselineConfig:
    preset: str
    device: torch.device
    dtype: torch.dtype
    vae_dtype: torch.dtype
    num_blocks: int
    warmup: int
    repeats: int
    profile: bool
    output_dir: Path
    seed: int
    results_path: Path
    workload: str = "mg2"

    @property
    def tiny(self) -> bool:
        return get_preset(self.preset).tiny

    def params(self) -> dict:
        return {"preset": self.preset, "device": str(self.device), "dtype": dtype_name(self.dtype),
                "vae_dtype": dtype_name(self.vae_dtype), "num_blocks": self.num_blocks, "seed": self.seed,
                "profile": self.profile}

    def table(self) -> pd.DataFrame:
        d = self.params() | {"warmup": self.warmup, "repeats": self.repeats, "output_dir": str(self.output_dir),
                             "results_path": str(self.results_path)}
        return pd.DataFrame({"value": d}).rename_axis("parameter")


def default_results_path(tiny: bool) -> Path:
    """Real-shape rows go to the committed store; tiny-preset (CI, laptop) rows to a local, git-ignored one."""
    return REPO / "reports" / "results" / "results-tiny.csv" if tiny else results_store.default_path()


def _int(name: str, value, lo: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo:
        raise ValueError(f"{name}={value!r} is not allowed; allowed values: an integer >= {lo}")
    return int(value)


def check_common(presets: dict, real_default: str, *, preset, device, dtype, vae_dtype, warmup, repeats, seed,
                 profile):
    """The checks notebook 01's validators share, before any heavy work: preset (one of `presets`, real shapes
    only on a GPU), dtype names, warm-up/repeats/seed integers, the profile flag. Returns (device, preset name,
    preset, warmup, repeats, seed)."""
    if preset != "auto" and preset not in presets:
        raise ValueError(f"preset={preset!r} is not allowed; allowed values: {['auto', *presets]}")
    for name, v in (("dtype", dtype), ("vae_dtype", vae_dtype)):
        if v != "auto" and v not in DTYPES:
            raise ValueError(f"{name}={v!r} is not allowed; allowed values: {['auto', *DTYPES]}")
    warmup = _int("warmup", warmup, 0)
    repeats = _int("repeats", repeats, 1)
    seed = _int("seed", seed, 0)
    if not isinstance(profile, bool):
        raise ValueError(f"profile={profile!r} is not allowed; allowed values: [True, False]")
    dev = resolve_device(device)
    name = resolve_preset(preset, dev, real_default=real_default)
    p = get_preset(name)
    if dev.type == "cpu" and not p.tiny:
        raise ValueError(f"preset={name!r} is a real-shape preset and needs a GPU; on a CPU use one of "
                         f"{[k for k, v in presets.items() if v.tiny]} or 'auto'")
    return dev, name, p, warmup, repeats, seed


def validate(*, preset="auto", device="auto", dtype="auto", vae_dtype="auto", num_blocks=0, warmup=1,
             repeats=3, profile=True, output_dir="auto", seed=0, results_path="auto",
             workload="mg2") -> BaselineConfig:
    """Check every notebook parameter before any heavy work; errors name the parameter and allowed values."""
    if workload not in WORKLOADS:
        raise ValueError(f"workload={workload!r} is not allowed; allowed values: {list(WORKLOADS)}")
    num_blocks = _int("num_blocks", num_blocks, 0)
    dev, name, p, warmup, repeats, seed = check_common(PRESETS, "mg2-universal", preset=preset, device=device,
                                                       dtype=dtype, vae_dtype=vae_dtype, warmup=warmup,
                                                       repeats=repeats, seed=seed, profile=profile)
    dt = resolve_dtype(dtype, dev)
    if dev.type == "cpu" and dt == torch.float16:
        raise ValueError("dtype='fp16' is not allowed on a CPU; allowed values there: ['auto', 'fp32', 'bf16']")
    vdt = dt if vae_dtype == "auto" else resolve_dtype(vae_dtype, dev)
    blocks = num_blocks or p.default_blocks
    if p.local_attn_size == -1 and blocks * p.num_frame_per_block > p.max_latent_frames:
        raise ValueError(f"num_blocks={blocks} exceeds preset {name!r}: at most "
                         f"{p.max_latent_frames // p.num_frame_per_block} blocks fit its full-window KV cache")
    out = Path(output_dir) if output_dir != "auto" else REPO / "reports" / "artifacts" / "01_baseline_profiling" / f"{name}-{dev.type}"
    rp = default_results_path(p.tiny) if results_path == "auto" else Path(results_path)
    return BaselineConfig(preset=name, device=dev, dtype=dt, vae_dtype=vdt, num_blocks=blocks, warmup=warmup,
                          repeats=repeats, profile=profile, output_dir=out, seed=seed, results_path=rp,
                          workload=workload)


def build(cfg: BaselineConfig) -> tuple[CausalStreamingPipeline, StreamInputs]:
    pipe = CausalStreamingPipeline(cfg.preset, device=str(cfg.device), dtype=dtype_name(cfg.dtype),
                                   vae_dtype=dtype_name(cfg.vae_dtype), seed=cfg.seed)
    inputs = pipe.prepare(cfg.num_blocks, seed=cfg.seed)
    return pipe, inputs


def run_callable(pipe: CausalStreamingPipeline, inputs: StreamInputs, cfg: BaselineConfig):
    """The whole labelled pipeline once (data prep, blocks, post-processing, GIF export), as a 0-arg callable."""
    gif = cfg.output_dir / "video.gif"
    return lambda: pipe.run(inputs.num_blocks, seed=cfg.seed, export_path=gif, progress=False)


def generate_callable(pipe: CausalStreamingPipeline, inputs: StreamInputs, cfg: BaselineConfig):
    """One generation (all blocks, VAE decode included) as a 0-arg callable: what FPS measures."""
    return lambda: pipe.generate(inputs, progress=False)


def session_run(pipe: CausalStreamingPipeline, inputs: StreamInputs, cfg: BaselineConfig, session) -> None:
    """One labelled run inside a ProfilingSession: data prep, one timed generation (its blocks give FPS, BPS and
    first-frame latency), post-processing and export."""
    fresh = pipe.prepare(inputs.num_blocks, seed=cfg.seed)
    with session.generation():
        out = pipe.generate(fresh, progress=False)
    pipe.export(pipe.postprocess(out.frames), cfg.output_dir / "video.gif")
    session.set_block_frames(out)
    session.set_metrics(workload="mg2", preset=cfg.preset, dtype=dtype_name(cfg.dtype), blocks=inputs.num_blocks,
                        pipeline_fps=out.metrics()["fps"], pipeline_first_frame_ms=out.first_frame_ms)


def model_table(pipe: CausalStreamingPipeline, inputs: StreamInputs, cfg: BaselineConfig | None = None) -> pd.DataFrame:
    p = pipe.preset
    n_dit = sum(t.numel() for t in pipe.model.state_dict().values())
    n_vae = sum(t.numel() for t in pipe.vae.decoder.parameters())
    cache = pipe.model.init_cache(inputs.noise.shape[0], pipe.device, pipe.dtype)
    rows = {
        "DiT parameters (M)": n_dit / 1e6,
        "VAE decoder parameters (M)": n_vae / 1e6,
        "latent frames per block": p.num_frame_per_block,
        "tokens per latent frame": p.frame_seqlen,
        "query tokens per forward": p.frame_seqlen * p.num_frame_per_block,
        "attention window (latent frames)": p.kv_capacity_frames(),
        "forwards per block (steps + refresh)": p.forwards_per_block,
        "warped timesteps": ", ".join(f"{t:.1f}" for t in pipe.timesteps),
        "KV caches (MiB, all layers)": cache.nbytes() / 2**20,
        "blocks generated": inputs.num_blocks,
    }
    del cache
    return pd.DataFrame({"value": rows}).rename_axis("quantity")


@dataclass
class BaselineResult:
    runs: list[StreamOutput]
    preset: str
    ceilings: dict
    steady_from: int = 1
    extra: dict = field(default_factory=dict)

    def run_table(self) -> pd.DataFrame:
        rows = []
        for i, r in enumerate(self.runs):
            m = r.metrics(self.steady_from)
            rows.append({"run": i, "fps": m["fps"], "bps": m["bps"], "first_frame_ms": r.first_frame_ms,
                         "block_ms_median": m["block_ms_median"], "total_ms": r.total_ms,
                         "peak_memory_gib": (r.peak_memory_bytes or 0) / 2**30 if r.peak_memory_bytes else np.nan})
        return pd.DataFrame(rows).set_index("run")

    def block_table(self) -> pd.DataFrame:
        """Per block (median over runs): forwards, cache refresh, VAE decode, total, frames."""
        p = get_preset(self.preset)
        n = p.forwards_per_block
        rows = []
        for bi in range(len(self.runs[0].block_ms)):
            fw = np.array([r.forward_ms[bi] for r in self.runs])  # [runs, n]
            rows.append({"block": bi,
                         "denoise_ms": float(np.median(fw[:, : n - 1].sum(1))),
                         "cache_refresh_ms": float(np.median(fw[:, n - 1])),
                         "vae_decode_ms": float(np.median([r.decode_ms[bi] for r in self.runs])),
                         "block_ms": float(np.median([r.block_ms[bi] for r in self.runs])),
                         "pixel_frames": self.runs[0].frames_per_block[bi]})
        return pd.DataFrame(rows).set_index("block")

    def step_table(self) -> pd.DataFrame:
        """Per block and forward (median over runs); the last forward of a block is the cache refresh."""
        p = get_preset(self.preset)
        ts = list(self.extra.get("timesteps", [])) + [0.0]
        rows = []
        for bi in range(len(self.runs[0].block_ms)):
            for j in range(p.forwards_per_block):
                vals = [r.forward_ms[bi][j] for r in self.runs]
                rows.append({"block": bi, "forward": j, "kind": "refresh" if j == p.forwards_per_block - 1 else "denoise",
                             "t": ts[j] if j < len(ts) else np.nan, "ms": float(np.median(vals))})
        return pd.DataFrame(rows)

    def forward_timing(self) -> Timing:
        """Every steady-state DiT forward of every run (blocks >= steady_from)."""
        vals = [ms for r in self.runs for bi, fw in enumerate(r.forward_ms) if bi >= min(self.steady_from, len(r.forward_ms) - 1)
                for ms in fw]
        return Timing(times_ms=vals)

    def summary(self) -> dict:
        p = get_preset(self.preset)
        fps = [r.metrics(self.steady_from)["fps"] for r in self.runs]
        bps = [r.metrics(self.steady_from)["bps"] for r in self.runs]
        ff = [r.first_frame_ms for r in self.runs]
        blocks = self.block_table()
        steady = blocks.iloc[min(self.steady_from, len(blocks) - 1):]
        fwd = self.forward_timing()
        flops = dit_forward_flops(p, block_idx=max(1, self.steady_from))["total"]
        fl_ms = floor_ms(flops, self.ceilings)
        vae_share = float(steady["vae_decode_ms"].sum() / steady["block_ms"].sum())
        peaks = [r.peak_memory_bytes for r in self.runs if r.peak_memory_bytes]
        return {
            "fps": Timing(times_ms=fps), "bps": Timing(times_ms=bps), "first_frame_ms": Timing(times_ms=ff),
            "dit_forward_ms": fwd, "dit_forward_tflop": flops / 1e12, "dit_floor_ms": fl_ms,
            "dit_forward_over_floor": fwd.median / fl_ms, "achieved_tflops": flops / (fwd.median * 1e-3) / 1e12,
            "vae_decode_ms_per_block": float(steady["vae_decode_ms"].median()),
            "vae_share": vae_share, "block_ms": float(steady["block_ms"].median()),
            "peak_memory_gib": max(peaks) / 2**30 if peaks else float("nan"),
        }

    def detail_tables(self) -> dict[str, pd.DataFrame]:
        """The workload's detail tables for notebook 01, by title."""
        return {"Per block (median over runs)": self.block_table(),
                "Per block and forward, ms (median over runs; the last forward is the cache refresh)":
                    self.step_table().pivot(index="block", columns="forward", values="ms")}

    def summary_table(self) -> pd.DataFrame:
        s = self.summary()
        rows = []
        for k, v in s.items():
            if isinstance(v, Timing):
                rows.append({"metric": k, "median": v.median, "p20": v.p20, "p80": v.p80, "n": v.n})
            else:
                rows.append({"metric": k, "median": v, "p20": np.nan, "p80": np.nan, "n": np.nan})
        return pd.DataFrame(rows).set_index("metric")


def benchmark(pipe: CausalStreamingPipeline, inputs: StreamInputs, *, warmup: int, repeats: int, ceilings: dict,
              steady_from: int = 1) -> BaselineResult:
    """Eager streaming baseline: `warmup` untimed generations, then `repeats` timed ones (device events)."""
    for _ in tqdm(range(warmup), desc="warm-up", leave=False):
        pipe.generate(inputs, progress=False)
    runs = [pipe.generate(inputs, progress=False) for _ in tqdm(range(repeats), desc="timed runs", leave=False)]
    require_finite({"latents": runs[-1].latents, "frames": runs[-1].frames}, f"the eager pipeline ({pipe.preset.name})")
    return BaselineResult(runs=runs, preset=pipe.preset.name, ceilings=ceilings, steady_from=steady_from,
                          extra={"timesteps": pipe.timesteps})


def run_benchmark(pipe: CausalStreamingPipeline, inputs: StreamInputs, cfg: BaselineConfig,
                  ceilings: dict) -> BaselineResult:
    """benchmark() with the notebook's validated settings."""
    return benchmark(pipe, inputs, warmup=cfg.warmup, repeats=cfg.repeats, ceilings=ceilings)


def floor_table(pipe: CausalStreamingPipeline, cfg: BaselineConfig, ceilings: dict) -> pd.DataFrame:
    """Analytic FLOPs of one steady DiT forward by part, and each part's floor at the measured GEMM ceiling."""
    parts = dit_forward_flops(pipe.preset, block_idx=1)
    df = pd.DataFrame({"GFLOP": {k: v / 1e9 for k, v in parts.items()}})
    df["floor_ms"] = [floor_ms(v, ceilings) for v in parts.values()]
    return df.rename_axis("part")


def profile_stages(pipe: CausalStreamingPipeline, inputs: StreamInputs, cfg: BaselineConfig):
    """One torch.profiler trace of the whole labelled pipeline: (stage table, trace path, label table)."""
    from .profiling import label_table, profile, stage_table

    prof = profile(run_callable(pipe, inputs, cfg), wait=0, warmup=1, active=1, out_dir=cfg.output_dir,
                   name="01_baseline_trace")
    labels = label_table(prof.trace_path)
    return stage_table(labels).set_index("label"), prof.trace_path, labels


def plot_overview(res: BaselineResult):
    """Time split per block and the timeline of one run, side by side."""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 3.4), gridspec_kw={"width_ratios": [1, 1.6]})
    plot_time_split(res, ax=axes[0])
    plot_timeline(res, ax=axes[1])
    fig.tight_layout()
    return fig


_UNITS = {"fps": "frames/s", "bps": "blocks/s", "first_frame_ms": "ms", "dit_forward_ms": "ms",
          "dit_floor_ms": "ms", "dit_forward_over_floor": "x", "achieved_tflops": "TFLOP/s",
          "vae_decode_ms_per_block": "ms", "vae_share": "fraction", "block_ms": "ms",
          "peak_memory_gib": "GiB", "dit_forward_tflop": "TFLOP"}


def result_rows(cfg: BaselineConfig, res: BaselineResult, stages: pd.DataFrame | None = None,
                notebook: str = "01_baseline_profiling", variant: str = "eager") -> list[dict]:
    return summary_rows(cfg, res, _UNITS, stages, notebook, variant)


def summary_rows(cfg, res, units: dict, stages: pd.DataFrame | None = None, notebook: str = "01_baseline_profiling",
                 variant: str = "eager") -> list[dict]:
    """Results rows of notebook 01 for either workload: each summary metric (Timing ones with their spread),
    the GEMM ceiling it was judged against, and the stage shares."""
    s = res.summary()
    common = dict(notebook=notebook, workload=cfg.workload, preset=cfg.preset, variant=variant,
                  params=cfg.params(), warmup=cfg.warmup, repeats=cfg.repeats)
    rows = []
    for k, unit in units.items():
        v = s[k]
        if isinstance(v, Timing):
            rows.append(results_store.make_row(metric=k, value=v.median, unit=unit, timing=v, **common))
        else:
            rows.append(results_store.make_row(metric=k, value=v, unit=unit, **common))
    rows.append(results_store.make_row(metric="gemm_ceiling_tflops", value=res.ceilings.get("gemm_tflops"),
                                       unit="TFLOP/s", **common))
    if stages is not None:
        for name, r in stages.iterrows():
            rows.append(results_store.make_row(metric=f"stage_share:{name}", value=float(r["share"]),
                                               unit="fraction", **common))
    return rows


def interpret(cfg: BaselineConfig, res: BaselineResult, stages: pd.DataFrame | None = None,
              target_fps: float = 25.0) -> str:
    """Sentences computed from the measured numbers."""
    s = res.summary()
    p = get_preset(cfg.preset)
    dev = res.ceilings.get("device_name", str(cfg.device))
    fps = s["fps"].median
    lines = [
        f"On {dev}, `{cfg.preset}` ({dtype_name(cfg.dtype)}) streams at {fps:.2f} FPS "
        f"(p20 {s['fps'].p20:.2f}, p80 {s['fps'].p80:.2f}; {s['bps'].median:.2f} blocks/s); "
        f"the first frame arrives after {s['first_frame_ms'].median:.0f} ms.",
        f"A steady block takes {s['block_ms']:.1f} ms: {p.forwards_per_block} DiT forwards and a VAE decode that "
        f"alone takes {s['vae_decode_ms_per_block']:.1f} ms ({s['vae_share']:.0%} of the block).",
        f"One DiT forward takes {s['dit_forward_ms'].median:.2f} ms, {s['dit_forward_over_floor']:.1f}x its FLOP floor "
        f"of {s['dit_floor_ms']:.3g} ms ({s['dit_forward_tflop']:.3g} TFLOP at the measured "
        f"{res.ceilings.get('gemm_tflops', float('nan')):.3g} TFLOP/s GEMM ceiling); achieved "
        f"{s['achieved_tflops']:.3g} TFLOP/s.",
    ]
    need = p.num_frame_per_block * 4 / target_fps * 1e3
    if fps >= target_fps:
        lines.append(f"That is above the {target_fps:.0f} FPS real-time mark.")
    else:
        lines.append(f"Real time at {target_fps:.0f} FPS needs a steady block in {need:.0f} ms, "
                     f"{s['block_ms'] / need:.1f}x faster than now.")
    return " ".join(lines + closing_lines(stages, p.tiny))


def closing_lines(stages: pd.DataFrame | None, tiny: bool) -> list[str]:
    """The last sentences of notebook 01's interpretation, shared by both workloads."""
    lines = []
    if stages is not None and len(stages):
        top = stages["share"].idxmax()
        lines.append(f"In the profiled run, `{top}` holds {stages.loc[top, 'share']:.0%} of the labelled time.")
    if tiny:
        lines.append("These are tiny-preset CPU numbers: they check the code paths, not the speed of the real model.")
    return lines


def plot_time_split(res: BaselineResult, ax=None):
    """Stacked bars per block: denoising forwards, cache refresh, VAE decode (median over runs)."""
    import matplotlib.pyplot as plt

    bt = res.block_table()
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.2))
    bottom = np.zeros(len(bt))
    for col, color in (("denoise_ms", "#4477aa"), ("cache_refresh_ms", "#66ccee"), ("vae_decode_ms", "#ee6677")):
        ax.bar(bt.index, bt[col], bottom=bottom, label=col.replace("_ms", "").replace("_", " "), color=color)
        bottom += bt[col].to_numpy()
    ax.set_xlabel("block")
    ax.set_ylabel("ms")
    ax.set_title("Time per block (median over runs)")
    ax.legend(fontsize=8)
    return ax


def plot_timeline(res: BaselineResult, ax=None):
    """One run's forwards and decodes on a time axis (device events)."""
    import matplotlib.pyplot as plt

    r = res.runs[len(res.runs) // 2]
    if ax is None:
        _, ax = plt.subplots(figsize=(9, 2.2))
    t = 0.0
    p = get_preset(res.preset)
    for bi, fw in enumerate(r.forward_ms):
        for j, ms in enumerate(fw):
            ax.barh(0, ms, left=t, color="#66ccee" if j == p.forwards_per_block - 1 else "#4477aa", edgecolor="white")
            t += ms
        ax.barh(0, r.decode_ms[bi], left=t, color="#ee6677", edgecolor="white")
        ax.text(t - sum(fw) / 2, 0.45, f"block {bi}", ha="center", fontsize=7)
        t += r.decode_ms[bi]
    ax.axvline(r.first_frame_ms, color="k", ls="--", lw=1)
    ax.text(r.first_frame_ms, -0.55, " first frame", fontsize=7)
    ax.set_yticks([])
    ax.set_xlabel("ms since generation start")
    ax.set_title("Timeline of one run: DiT forwards (blue), cache refresh (light), VAE decode (red)")
    return ax


def plot_stage_shares(stages: pd.DataFrame, ax=None):
    import matplotlib.pyplot as plt

    if ax is None:
        _, ax = plt.subplots(figsize=(6, 2.4))
    ax.barh(stages.index[::-1], stages["share"][::-1] * 100, color="#228833")
    ax.set_xlabel("% of labelled time")
    ax.set_title("Top-level stages (profiled run)")
    return ax
