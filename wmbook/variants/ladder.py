"""The cumulative ladder: each row = the previous row + one variant, gated against the fp32 reference.

For one workload and preset the runner builds the fp32 eager reference once and records, on fixed seeded
inputs: one steady-state denoiser forward (the gate's reference output) and a short end-to-end run (frames
for PSNR). Each row then deep-copies the reference pipeline, applies its variants in order, and measures:

- the gate (wmbook.check.ladder_gate): the same forward against the fp32 reference, within the relative-L2
  budget of the loosest precision in effect and, for rows that do not change precision, no less accurate than
  the eager model at that precision (the seed's max/mean numbers against that eager output are reported);
  a row that fails is shown with its numbers but its time does not count (no speedup);
- forward time: median and p20/p80 over repeats after warm-up (CUDA events), against the FLOP floor;
- end to end: FPS of a streaming generation (mg2) or ms per DDIM step of a short iteration (wma), and the
  PSNR of its decoded frames against the reference's;
- peak memory, and for compiled rows the first-call time (the probe's setup and first forward, compilation
  included; wmbook.variants.compile.measure_compile_time gives cold and warm compile time proper) and the
  recompiles of the steady end-to-end runs.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import dataclass, field

import pandas as pd
import torch
from tqdm.auto import tqdm

from .. import check
from ..profiling.breakdown import CAST_OPS, kernel_summary, profile_calls
from ..bench import Timing, time_fn
from ..presets import get_preset, resolve_device
from . import GlobalFlags, VariantContext, resolve, tolerance_for

LADDER_COLUMNS = [
    "row", "variant", "stack", "gate", "tolerance", "rel_l2_vs_fp32", "allowed_rel_l2", "budget_rel_l2",
    "max_rel_same_precision",
    "mean_rel_same_precision", "forward_ms", "forward_p20", "forward_p80",
    "speedup", "x_floor", "gpu_busy_ms", "busy_x_floor", "e2e_metric", "e2e_value", "e2e_speedup", "psnr_db", "peak_memory_gib", "first_call_s",
    "recompiles", "graph_breaks", "note",
]  # fmt: skip


# --- workload probes ------------------------------------------------------------------------------------


@dataclass
class Probe:
    """A steady-state forward (0-arg callable returning the outputs the gate compares) and its FLOPs."""

    forward: object
    flops: float
    description: str


def build_reference(workload: str, preset: str, device, seed: int = 0):
    """The fp32 eager reference pipeline (fp32 VAE too): every ladder row starts from a copy of it."""
    dev = resolve_device(device) if isinstance(device, str) else device
    if workload == "mg2":
        from ..pipelines.causal import CausalStreamingPipeline

        return CausalStreamingPipeline(preset, device=str(dev), dtype="fp32", vae_dtype="fp32", seed=seed)
    from ..pipelines.ddim import WMAInteractionPipeline

    return WMAInteractionPipeline(preset, device=str(dev), dtype="fp32", vae_dtype="fp32", seed=seed)


def forward_probe(pipe, workload: str, seed: int = 0) -> Probe:
    """One steady denoiser forward on fixed seeded inputs, in the pipeline's current dtype and settings."""
    with torch.no_grad():
        if workload == "mg2":
            return _mg2_probe(pipe, seed)
        return _wma_probe(pipe, seed)


def _mg2_probe(pipe, seed: int) -> Probe:
    from ..models.flops import dit_forward_flops

    p = pipe.preset
    k = p.num_frame_per_block
    inp = pipe.prepare(2, seed=seed)
    cache = pipe.model.init_cache(1, pipe.device, pipe.dtype)
    if getattr(pipe, "prefill_cross", False):
        pipe.model.prefill_cross_cache(inp.context, cache)
    # block 0 fills the caches: its denoising steps and the cache refresh, as a generation does
    noisy = inp.noise[:, :, :k]
    x0 = noisy
    for t in pipe.timesteps:
        x0 = pipe.denoise(noisy, t, inp, cache, 0)
    pipe.denoise(x0, 0.0, inp, cache, 0)
    x1 = inp.noise[:, :, k:2 * k]
    tt = torch.full((1, k), float(pipe.timesteps[0]), device=pipe.device)
    cond = inp.cond_concat[:, :, k:2 * k] if inp.cond_concat is not None else None

    @torch.no_grad()  # inference everywhere it is called (a grad-mode change would also recompile)
    def forward():  # the first denoising forward of block 1: rewrites block 1's cache slots, so it repeats
        return pipe.model(x1, tt, inp.context, cond_concat=cond, actions=inp.actions, cache=cache, start_frame=k)

    return Probe(forward, dit_forward_flops(p, block_idx=1)["total"],
                 f"DiT forward on block 1 (t={pipe.timesteps[0]:.0f}, {k} latent frames, KV cache of block 0)")


def _wma_probe(pipe, seed: int) -> Probe:
    from ..models.wma.flops import unet_forward_flops

    p = pipe.preset
    inp = pipe.prepare(seed=seed)
    gen = torch.Generator(pipe.device).manual_seed(seed + 1)
    cond = pipe.condition(inp, gen, guidance=False)
    g = torch.Generator("cpu").manual_seed(seed + 2)
    x = torch.randn((1, *p.latent_shape), generator=g).to(pipe.device)
    act = torch.randn((1, p.horizon, p.agent_action_dim), generator=g).to(pipe.device)
    st = torch.randn((1, p.horizon, p.agent_state_dim), generator=g).to(pipe.device)
    obs_i = inp.observation_images.to(pipe.dtype)
    obs_s = inp.observation_states.to(pipe.dtype)
    fs = torch.full((1,), p.default_fs, dtype=torch.long, device=pipe.device)
    t = p.num_train_timesteps // 2

    @torch.no_grad()
    def forward():
        return pipe._denoise(x, act, st, t, cond, cond.decision_context, obs_i, obs_s, fs)

    return Probe(forward, unet_forward_flops(p)["total"], f"UNet forward with both heads at t={t}")


def end_to_end(pipe, workload: str, seed: int = 0, *, num_blocks: int = 3, ddim_steps: int = 5) -> dict:
    """A short real run: frames (for PSNR) and the workload's speed metric (FPS or ms per DDIM step)."""
    with torch.no_grad():
        if workload == "mg2":
            out = pipe.generate(pipe.prepare(num_blocks, seed=seed), progress=False)
            m = out.metrics()
            return {"frames": out.frames, "latents": out.latents, "metric": "fps", "value": m["fps"],
                    "higher_is_better": True}
        import numpy as np

        out = pipe.run_iteration(pipe.prepare(seed=seed), ddim_steps=ddim_steps, progress=False)
        steps = out.decision.step_ms + out.world.step_ms
        return {"frames": out.world.frames, "latents": out.world.latents, "metric": "ddim_step_ms",
                "value": float(np.median(steps)), "higher_is_better": False}


# --- the runner ---------------------------------------------------------------------------------------


@dataclass
class Ladder:
    workload: str
    preset: str
    rows: list[dict] = field(default_factory=list)
    reference_note: str = ""
    floor_ms: float = float("nan")

    def table(self) -> pd.DataFrame:
        return pd.DataFrame(self.rows, columns=LADDER_COLUMNS).set_index("row")

    def categories(self) -> pd.DataFrame:
        """GPU kernel ms per forward by category (rows: ladder rows; empty off CUDA): which kernels each step
        removed and what is left between the row and the FLOP floor."""
        d = pd.DataFrame([r.get("_categories", {}) for r in self.rows],
                         index=[r["variant"] for r in self.rows]).fillna(0.0)
        if d.empty or not len(d.columns):
            return pd.DataFrame()
        return d[d.sum().sort_values(ascending=False).index]

    def plot_categories(self, ax=None):
        """Stacked bars of the categories() table with the FLOP floor as a line."""
        import matplotlib.pyplot as plt

        d = self.categories()
        if ax is None:
            _, ax = plt.subplots(figsize=(8, 0.45 * max(len(d), 1) + 1))
        if d.empty:
            ax.text(0.5, 0.5, "no GPU kernel times (CPU run)", ha="center", va="center", transform=ax.transAxes)
            return ax
        d[::-1].plot.barh(stacked=True, ax=ax, width=0.75, colormap="tab10")
        if self.floor_ms == self.floor_ms:
            ax.axvline(self.floor_ms, color="k", ls="--", lw=1, label=f"FLOP floor {self.floor_ms:.1f} ms")
        ax.set_xlabel("GPU kernel ms per forward (by category)")
        ax.legend(fontsize=7, loc="lower right")
        ax.set_title(f"Where the GPU time goes: {self.workload} / {self.preset}")
        return ax

    def plot(self, ax=None):
        """Speedup of each row over the eager fp32 reference (forward), failed rows hatched."""
        import matplotlib.pyplot as plt

        t = self.table()
        if ax is None:
            _, ax = plt.subplots(figsize=(8, 0.45 * len(t) + 1))
        ok = t["gate"] == "pass"
        sp = t["forward_ms"].iloc[0] / t["forward_ms"]
        ax.barh(t["variant"][::-1], sp[::-1], color=["#4477aa" if o else "#cccccc" for o in ok[::-1]],
                hatch=None)
        for y, (v, o) in enumerate(zip(sp[::-1], ok[::-1])):
            ax.text(v, y, f" {v:.2f}x" + ("" if o else " (gate failed)"), va="center", fontsize=8)
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_xlabel("forward speedup vs fp32 eager (cumulative: each row adds one variant)")
        ax.set_title(f"Ladder: {self.workload} / {self.preset}")
        return ax


def run_ladder(workload: str, preset: str, steps: list[str], *, device=None, seed: int = 0, warmup: int = 3,
               repeats: int = 10, e2e_blocks: int = 3, e2e_ddim_steps: int = 5, e2e_repeats: int = 2,
               ceilings: dict | None = None, compile_backend: str = "inductor", reference=None) -> Ladder:
    """Row 0 is the fp32 eager reference; row i applies steps[:i] (all names checked before any work)."""
    dev = resolve_device(device) if not isinstance(device, torch.device) else device
    vs = resolve(steps, workload, dev)
    get_preset(preset)
    for name, v, lo in (("warmup", warmup, 0), ("repeats", repeats, 1), ("e2e_blocks", e2e_blocks, 1),
                        ("e2e_ddim_steps", e2e_ddim_steps, 1), ("e2e_repeats", e2e_repeats, 1)):
        if isinstance(v, bool) or not isinstance(v, int) or v < lo:
            raise ValueError(f"{name}={v!r} is not allowed; allowed values: an integer >= {lo}")
    flags = GlobalFlags()
    ref = reference if reference is not None else build_reference(workload, preset, dev, seed)
    lad = Ladder(workload, preset)
    ref_out = ref_frames = anchor = None
    anchor_err = 0.0  # the eager model's error against fp32 at the precision in effect
    base_ms = base_e2e = None
    try:
        for i in tqdm(range(len(vs) + 1), desc=f"ladder {workload}", leave=False):
            flags.restore()
            stack = vs[:i]
            changes_precision = i > 0 and _changes_precision(stack[-1])
            row, out, frames = _measure_row(ref, workload, stack, dev, seed, warmup, repeats, e2e_blocks,
                                            e2e_ddim_steps, e2e_repeats, ref_out, ref_frames, compile_backend,
                                            same_ref=None if changes_precision else anchor,
                                            anchor_rel_l2=None if changes_precision else anchor_err)
            if i == 0:
                outs = _outputs(out)
                outs = outs if isinstance(outs, list) else [outs]
                check.require_finite({**{f"forward output {k}": o for k, o in enumerate(outs)}, "frames": frames},
                                     f"the fp32 reference ({workload}, {preset})")
                ref_out, ref_frames, anchor = out, frames, out
                base_ms, base_e2e = row["forward_ms"], row["e2e_value"]
                row["gate"] = "reference"
            elif changes_precision:
                anchor, anchor_err = out, row["rel_l2_vs_fp32"]  # later rows: no less accurate than this eager
            row["row"] = i
            row["variant"] = "fp32 eager (reference)" if i == 0 else "+ " + stack[-1].name
            row["stack"] = " + ".join(v.name for v in effective(stack)) or "-"
            counts = row["gate"] in ("pass", "reference")
            row["speedup"] = base_ms / row["forward_ms"] if counts else float("nan")
            if counts and base_e2e:
                hib = workload == "mg2"
                row["e2e_speedup"] = row["e2e_value"] / base_e2e if hib else base_e2e / row["e2e_value"]
            else:
                row["e2e_speedup"] = float("nan")
            floor = flop_floor_ms(row.pop("_flops"), ceilings)
            if floor == floor:
                lad.floor_ms = floor
            row["x_floor"], row["busy_x_floor"] = row["forward_ms"] / floor, row["gpu_busy_ms"] / floor
            lad.rows.append(row)
            del out
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    finally:
        flags.restore()
    return lad


def flop_floor_ms(flops: float, ceilings: dict | None) -> float:
    """The FLOP floor at the measured bf16 GEMM ceiling (NaN without ceilings): what `x_floor` divides by."""
    from ..device import floor_ms

    return floor_ms(flops, ceilings) if ceilings and ceilings.get("gemm_tflops") else float("nan")


def effective(stack: list) -> list:
    """The variants a row applies: a later compile variant replaces an earlier one (one compile per model)."""
    last = max((i for i, v in enumerate(stack) if v.family == "compile"), default=None)
    return [v for i, v in enumerate(stack) if v.family != "compile" or i == last]


def apply_stack(ref, workload: str, stack, device, compile_backend: str | None = None):
    """A deep copy of the reference pipeline with a stack of variants (names or Variants) applied in order, the
    effective compile only: (pipeline, VariantContext)."""
    vs = resolve(stack, workload, device) if stack and isinstance(stack[0], str) else list(stack)
    pipe = copy.deepcopy(ref)
    notes = {} if compile_backend is None else {"compile_backend": compile_backend}
    ctx = VariantContext(workload=workload, device=device, notes=notes)
    for v in effective(vs):
        v.apply(pipe, ctx)
    return pipe, ctx


def _changes_precision(v) -> bool:
    return v.family == "precision" and v.tolerance is not None


def _measure_row(ref, workload, stack, dev, seed, warmup, repeats, e2e_blocks, e2e_ddim_steps, e2e_repeats,
                 ref_out, ref_frames, compile_backend, e2e: bool = True, same_ref=None, anchor_rel_l2=None):
    m0 = torch.cuda.memory_allocated(dev) if dev.type == "cuda" else 0  # the kept reference is not this row's
    compiled = any(v.family == "compile" for v in stack)
    if compiled:  # compiled code is cached per code object, across copies: start every compiled row afresh
        from .compile import reset_compile_state

        reset_compile_state()
    pipe, ctx = apply_stack(ref, workload, stack, dev, compile_backend)
    tol = tolerance_for(stack)
    mon = _monitor() if compiled else None  # from the first compiled call on
    t0 = time.perf_counter()  # compiled rows: the probe's setup (block 0's forwards for mg2) compiles first
    try:
        probe = forward_probe(pipe, workload, seed)
    except BaseException:
        if mon is not None:
            mon.__exit__(None, None, None)
        raise
    note = "; ".join(str(n) for k, n in ctx.notes.items() if k not in ("compile_backend", "compile_spec")
                     and not k.startswith("compile:"))
    row = {"tolerance": tol, "note": note, "_flops": probe.flops}
    try:
        with torch.no_grad():
            out = probe.forward()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        row["first_call_s"] = time.perf_counter() - t0 if compiled else float("nan")
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats(dev)
        with torch.no_grad():
            tm: Timing = time_fn(probe.forward, warmup=warmup, repeats=repeats, device=dev)
        row["peak_memory_gib"] = ((torch.cuda.max_memory_allocated(dev) - m0) / 2**30 if dev.type == "cuda"
                                  else float("nan"))  # this row's weights, caches and activations
        row.update(forward_ms=tm.median, forward_p20=tm.p20, forward_p80=tm.p80)
        with torch.no_grad():  # kernels alone: the rest of the wall time is host and launch overhead
            trace = profile_calls(probe.forward, dev)
        row["gpu_busy_ms"] = float("nan")
        if trace is not None:  # and kernel time per category (sums overlaps, unlike busy): where the rest goes
            cats = kernel_summary(trace)["categories"]
            row["gpu_busy_ms"] = cats.attrs["busy_ms"]
            row["_categories"] = dict(zip(cats["category"], cats["ms"]))
        del trace
        runs = []
        if e2e:
            # end to end: one warm-up run (compiles the shapes the probe did not see), then the timed runs,
            # whose recompiles a second monitor counts (the steady-state count the compile goal is about)
            end_to_end(pipe, workload, seed, num_blocks=e2e_blocks, ddim_steps=e2e_ddim_steps)
            steady = _monitor() if compiled else None
            try:
                runs = [end_to_end(pipe, workload, seed, num_blocks=e2e_blocks, ddim_steps=e2e_ddim_steps)
                        for _ in range(e2e_repeats)]
            finally:
                if steady is not None:
                    steady.__exit__(None, None, None)
    finally:
        if mon is not None:
            mon.__exit__(None, None, None)
    if runs:
        vals = sorted(r["value"] for r in runs)
        row["e2e_metric"] = runs[0]["metric"]
        row["e2e_value"] = vals[len(vals) // 2]
        frames = runs[-1]["frames"]
    else:
        row["e2e_metric"], row["e2e_value"], frames = "", float("nan"), None
    if mon is not None:
        row["graph_breaks"] = _count(mon, "graph_breaks")
        row["recompiles"] = _count(steady, "recompiles") if runs else _count(mon, "recompiles")
    else:
        row["recompiles"] = row["graph_breaks"] = float("nan")
    if ref_out is not None:
        res = check.ladder_gate(_outputs(out), _outputs(ref_out), dtype=tol,
                                same_precision_ref=None if same_ref is None else _outputs(same_ref),
                                anchor_rel_l2=anchor_rel_l2)
        row.update(gate="pass" if res.passed else "FAIL", rel_l2_vs_fp32=res.vs_fp32.rel_l2,
                   budget_rel_l2=res.budget_rel_l2, allowed_rel_l2=res.allowed_rel_l2)
        if res.vs_same_precision is not None:
            row.update(max_rel_same_precision=res.vs_same_precision.max_rel,
                       mean_rel_same_precision=res.vs_same_precision.mean_rel)
        if frames is not None and ref_frames is not None:
            row["psnr_db"] = check.compare(frames.float(), ref_frames.float(), dtype="fp32", frames=True).psnr
        else:
            row["psnr_db"] = float("nan")
    else:
        row.update(rel_l2_vs_fp32=0.0, budget_rel_l2=float("nan"), psnr_db=math.inf)
    return row, _detach(out), frames


def _monitor():
    """An entered CompileMonitor (wmbook.variants.compile)."""
    from .compile import CompileMonitor

    m = CompileMonitor()
    m.__enter__()
    return m


def _count(mon, key: str) -> int:
    return int(mon.summary().get(key, 0) or 0)


def _outputs(out):
    """The tensors the gate compares, in fp32 (a forward returns one tensor, or the UNet's (video, action, state))."""
    if isinstance(out, (tuple, list)):
        return [o.float() for o in out]
    return out.float()


def _detach(out):
    if isinstance(out, (tuple, list)):
        return type(out)(o.detach().clone() for o in out)
    return out.detach().clone()


# --- side tables -------------------------------------------------------------------------------------


def variant_table(ref, workload: str, names: list[str], *, device=None, seed: int = 0, warmup: int = 3,
                  repeats: int = 10, compile_backend: str = "inductor", ceilings: dict | None = None) -> pd.DataFrame:
    """Each variant alone on the fp32 reference (not stacked): gate, forward time, speedup, x floor."""
    dev = resolve_device(device) if not isinstance(device, torch.device) else device
    vs = resolve(names, workload, dev)
    flags = GlobalFlags()
    rows = []
    ref_out = None
    base = None
    try:
        for v in tqdm([None, *vs], desc="variants", leave=False):
            flags.restore()
            stack = [] if v is None else [v]
            same = None if (v is None or _changes_precision(v)) else ref_out  # alone: its precision is fp32
            row, out, _ = _measure_row(ref, workload, stack, dev, seed, warmup, repeats, 1, 1, 1, ref_out, None,
                                       compile_backend, e2e=False, same_ref=same,
                                       anchor_rel_l2=None if same is None else 0.0)
            if v is None:
                ref_out, base, row["gate"] = out, row["forward_ms"], "reference"
            flops = row.pop("_flops")
            row["variant"] = "fp32 eager (reference)" if v is None else v.name
            row["speedup"] = base / row["forward_ms"] if row["gate"] in ("pass", "reference") else float("nan")
            floor = flop_floor_ms(flops, ceilings)
            row["x_floor"], row["busy_x_floor"] = row["forward_ms"] / floor, row["gpu_busy_ms"] / floor
            rows.append(row)
    finally:
        flags.restore()
    cols = ["variant", "gate", "tolerance", "rel_l2_vs_fp32", "allowed_rel_l2", "budget_rel_l2", "max_rel_same_precision",
            "mean_rel_same_precision", "forward_ms", "forward_p20", "forward_p80", "speedup", "x_floor",
            "gpu_busy_ms", "busy_x_floor", "peak_memory_gib", "first_call_s", "graph_breaks", "note"]
    return pd.DataFrame(rows).reindex(columns=cols).set_index("variant")


def _decode(pipe, workload: str, latents: torch.Tensor) -> torch.Tensor:
    if workload == "mg2":
        k = pipe.preset.num_frame_per_block
        pipe.decoder.reset()
        return torch.cat([pipe.decoder.decode_block(latents[:, :, i:i + k]) for i in range(0, latents.shape[2], k)],
                         dim=2)
    return pipe.decode(latents)


def vae_table(ref, workload: str, dtypes=("fp32", "bf16", "fp16"), *, device=None, seed: int = 0, repeats: int = 3,
              num_blocks: int = 2, ddim_steps: int = 3, layouts=(False,)) -> pd.DataFrame:
    """The reference's latents decoded by the VAE in each dtype (and layout): PSNR against the fp32 decode, time.

    The quality column is what matters here: a bf16 VAE has cost a competition team 12 dB PSNR.
    """
    from ..presets import DTYPES

    dev = resolve_device(device) if not isinstance(device, torch.device) else device
    for d in dtypes:
        if d not in DTYPES:
            raise ValueError(f"dtype {d!r} is not allowed; allowed values: {list(DTYPES)}")
        if d == "fp16" and dev.type != "cuda":
            raise ValueError("dtype 'fp16' needs a CUDA device for the VAE table; leave it out on a CPU")
    latents = end_to_end(ref, workload, seed, num_blocks=num_blocks, ddim_steps=ddim_steps)["latents"]
    rows, ref_frames = [], None
    for d in dtypes:
        for cl in layouts:
            pipe = copy.copy(ref)  # shares the denoiser; only the VAE is replaced
            pipe.vae = copy.deepcopy(ref.vae).to(DTYPES[d])
            pipe.vae_dtype = DTYPES[d]
            from .builtin import to_memory_format

            if workload == "mg2":
                from ..models.vae import StreamingWanDecoder

                if cl:
                    to_memory_format(pipe.vae, torch.channels_last_3d)
                pipe.decoder = StreamingWanDecoder(pipe.vae)
            elif cl:
                to_memory_format(pipe.vae, torch.channels_last)
            with torch.no_grad():
                frames = _decode(pipe, workload, latents).float()
                tm = time_fn(lambda: _decode(pipe, workload, latents), warmup=1, repeats=repeats, device=dev)
            if ref_frames is None:
                ref_frames = frames
            q = check.compare(frames, ref_frames, dtype="fp32", frames=True)
            rows.append({"vae_dtype": d, "channels_last": cl, "decode_ms": tm.median, "p20": tm.p20, "p80": tm.p80,
                         "frames": int(frames.shape[2]), "ms_per_frame": tm.median / frames.shape[2],
                         "psnr_db": q.psnr, "max_abs": q.max_abs})
            del pipe
    return pd.DataFrame(rows)


def op_counts(ref, workload: str, stacks: dict[str, list[str]], *, device=None, seed: int = 0) -> pd.DataFrame:
    """aten ops per forward that cast or copy, host reads (syncs) and kernel launches, for each stack of variants.

    Counted with torch.profiler on one warm forward of the probe (what the dtype-hygiene variant is about).
    """
    from torch.profiler import ProfilerActivity, profile

    dev = resolve_device(device) if not isinstance(device, torch.device) else device
    flags = GlobalFlags()
    rows = []
    try:
        for name, names in stacks.items():
            flags.restore()
            pipe, _ = apply_stack(ref, workload, names, dev)
            probe = forward_probe(pipe, workload, seed)
            with torch.no_grad():
                probe.forward()
                acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev.type == "cuda" else [])
                with profile(activities=acts) as prof:
                    probe.forward()
                    if dev.type == "cuda":
                        torch.cuda.synchronize(dev)
            ka = {e.key: e.count for e in prof.key_averages()}
            row = {"stack": name, "variants": " + ".join(names) or "-"}
            for op in CAST_OPS:
                row[op] = ka.get(op, 0)
            row["host reads (aten::_local_scalar_dense)"] = ka.get("aten::_local_scalar_dense", 0)
            row["aten ops"] = sum(c for k, c in ka.items() if k.startswith("aten::"))
            if dev.type == "cuda":
                row["kernels"] = sum(1 for e in prof.events() if getattr(e, "device_type", None) is not None
                                     and str(e.device_type).endswith("CUDA") and e.name and not e.name.startswith("aten::"))
            rows.append(row)
            del pipe
    finally:
        flags.restore()
    return pd.DataFrame(rows).set_index("stack")
