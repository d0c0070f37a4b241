"""The training loop shared by both world models: seeded, resumable, time- or step-budgeted, bf16 autocast on CUDA.

`train(TrainConfig(...))` renders the episode bank, builds the preset's pipeline (frozen encoders from the preset's
encoder seed, the model from it too), trains `pipe.model` with its objective (wmbook.train.objectives) under AdamW
with warm-up and a cosine decay over the budget (the fraction of `steps`, or of `minutes` when only a time budget is
given: then the step count, not the update rule, depends on the machine's speed), keeps an EMA of the weights, writes
a checkpoint every `ckpt_every` steps (atomically: model, EMA, optimizer, generator state, loss history) and resumes
from it, logs the loss curve (CSV beside the weights), then stores the EMA weights (wmbook.world.weights) with a JSON
of provenance and a held-out evaluation against the copy-last-frame baseline.
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .. import workloads
from ..atomic import atomic_open
from ..models.checkpoint import CheckpointFileError, read_checkpoint_file
from ..paths import REPORTS_DIR, check_output_file, git_commit
from ..presets import ALL_PRESETS, resolve_device
from ..world import eval as weval
from ..world import weights
from ..world.eval import SHIPPING_RULE, shipping_failures
from ..world.weights import (
    build_world_pipeline,
    check_weights_file,
    is_world_preset,
    load_weights,
    save_weights,
    ship_weights,
    weights_path,
)
from .data import EpisodeBank, default_workers
from .objectives import check_episode_frames, window_frames

DEFAULT_DECISION_FRACTION = 0.5
COMPILE_BACKENDS = ("none", "inductor", "aot_eager")


def trainable_workloads() -> list[str]:
    """The workloads with a world model to train (the `world` feature), by name."""
    return [w.name for w in workloads.all_workloads() if "world" in w.features]


@dataclass
class TrainConfig:
    workload: str
    preset: str
    out: Path
    minutes: float | None = None  # training-time budget (rendering excluded)
    steps: int | None = None  # step budget (whichever of the two ends first)
    batch: int = 32
    lr: float = 3e-4
    warmup: int = 200
    data_seed: int = 0
    seed: int = 0
    episodes: int = 2000
    episode_frames: int = 97
    workers: int = 0  # rendering processes (0: half the CPUs, at most 8)
    device: str = "auto"
    ckpt_every: int = 500
    log_every: int = 25
    ema: float = 0.999
    change_weight: float = 0.0  # extra loss weight on latent positions that change between frames (objectives.py)
    agent_weight: float = 0.0  # extra loss weight on the latent cells where the agent is or was (objectives.py)
    sigma_min: float = 0.05  # the x0 losses' noise-level floor: their weight 1 / sigma^2 is capped at 1 / sigma_min^2
    # workloads with a decision pass (wma): the share of samples trained as one
    decision_fraction: float = DEFAULT_DECISION_FRACTION
    resume: bool = True
    compile: str = "none"  # torch.compile backend for the training forward + backward (none | inductor | aot_eager)
    eval_cases: int = 8  # held-out episodes scored at the end (0: none)
    ckpt: Path | None = None  # default: reports/train/<out stem>.ckpt
    # start from these world weights (a weights file of the same preset, e.g. the shipped one) instead of a fresh
    # initialisation: a longer run continued from an earlier one (its optimizer state is not in the file)
    init_weights: Path | None = None
    # replace the preset's shipped weights (data/weights/<preset>.pt) with the new ones, only when they pass the
    # shipping rule on the held-out episodes (wmbook.world.eval.shipping_failures); `out` stays the run's own file
    ship: bool = False
    progress: bool = True
    command: str = field(default_factory=lambda: " ".join(sys.argv))

    def check(self) -> "TrainConfig":
        """Every value checked before anything expensive runs (ValueError naming the parameter)."""
        if self.workload not in trainable_workloads():
            raise ValueError(f"workload={self.workload!r} is not allowed; allowed values: {trainable_workloads()}")
        wl = workloads.get(self.workload)
        allowed = [k for k, v in wl.presets.items() if is_world_preset(v)]
        if not isinstance(self.preset, str):  # a preset object (tests: a smaller world preset)
            if not is_world_preset(self.preset) or not wl.owns_preset(self.preset):
                raise ValueError(f"preset={getattr(self.preset, 'name', self.preset)!r} is not allowed for workload "
                                 f"{self.workload!r}; allowed values: {allowed} or a world preset object")
        elif self.preset not in allowed:
            raise ValueError(f"preset={self.preset!r} is not allowed for workload {self.workload!r}; allowed values: "
                             f"{allowed}")
        for name in ("minutes", "lr", "ema", "sigma_min", "change_weight", "agent_weight", "decision_fraction"):
            v = getattr(self, name)
            if isinstance(v, float) and not math.isfinite(v):
                raise ValueError(f"{name}={v!r} is not allowed: it is not finite; allowed values: a finite number")
        if self.minutes is None and self.steps is None:
            raise ValueError("minutes=None and steps=None: give a budget; allowed values: minutes > 0 and/or "
                             "steps >= 1")
        if self.minutes is not None and (isinstance(self.minutes, bool) or not isinstance(self.minutes, (int, float))
                                         or not 0 < self.minutes < 10_000):
            raise ValueError(f"minutes={self.minutes!r} is not allowed; allowed values: a number in (0, 10000)")
        for name, lo in (("steps", 1), ("batch", 1), ("warmup", 0), ("data_seed", 0), ("seed", 0), ("episodes", 1),
                         ("episode_frames", 2), ("workers", 0), ("ckpt_every", 1), ("log_every", 1),
                         ("eval_cases", 0)):
            v = getattr(self, name)
            if name == "steps" and v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name}={v!r} is not allowed; allowed values: an integer >= {lo}")
        if self.data_seed > 999:
            raise ValueError(f"data_seed={self.data_seed!r} is not allowed; allowed values: an integer in [0, 999]")
        for name, lo, hi in (("lr", 0.0, 1.0), ("ema", 0.0, 1.0)):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not lo <= v < hi or (name == "lr" and v == 0):
                raise ValueError(f"{name}={v!r} is not allowed; allowed values: a number in ({lo}, {hi})")
        if self.compile not in COMPILE_BACKENDS:
            raise ValueError(f"compile={self.compile!r} is not allowed; allowed values: {list(COMPILE_BACKENDS)}")
        v = self.sigma_min
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
            raise ValueError(f"sigma_min={v!r} is not allowed; allowed values: a number in (0, 1]")
        for name in ("change_weight", "agent_weight"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 100:
                raise ValueError(f"{name}={v!r} is not allowed; allowed values: a number in [0, 100]")
        v = self.decision_fraction
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            raise ValueError(f"decision_fraction={v!r} is not allowed; allowed values: a number in [0, 1]")
        if v != DEFAULT_DECISION_FRACTION and "decision_pass" not in workloads.get(self.workload).features:
            allowed = [w.name for w in workloads.all_workloads() if "decision_pass" in w.features]
            raise ValueError(f"decision_fraction={v!r} is not allowed for workload {self.workload!r} (it has no "
                             f"decision pass); allowed: the default {DEFAULT_DECISION_FRACTION} here, any fraction "
                             f"for {allowed}")
        self.out = Path(self.out)
        if self.out.suffix != ".pt":
            raise ValueError(f"out={str(self.out)!r} is not allowed; allowed values: a path ending in .pt")

        check_output_file(self.out, "out", "a path ending in .pt in a folder you can write to")
        if self.out.resolve().parent == weights.WEIGHTS_DIR.resolve():
            raise ValueError(f"out={str(self.out)!r} is not allowed: it is where the shipped weights live, and a "
                             f"training run never writes there; allowed values: any other .pt path (by default a new "
                             f"run folder, data/weights/{RUNS_DIR_NAME}/<date>-<preset>/). To replace the shipped "
                             f"weights, train with ship=True (--ship): they are copied there only when they pass the "
                             f"shipping rule")
        if self.ship and not isinstance(self.preset, str):
            raise ValueError("ship=True is not allowed for a preset object; allowed: a world preset's name, whose "
                             "shipped weights the run may replace")
        if self.ship and not self.eval_cases:
            raise ValueError("eval_cases=0 is not allowed with ship=True: the shipping rule compares the new weights "
                             "with copy-last on held-out episodes; allowed values: an integer >= 1")

        check_episode_frames(self.episode_frames, window_frames(
            ALL_PRESETS[self.preset] if isinstance(self.preset, str) else self.preset))
        self.ckpt = Path(self.ckpt) if self.ckpt is not None else REPORTS_DIR / "train" / f"{self.out.stem}.ckpt"
        check_output_file(self.ckpt, "ckpt", "a checkpoint path in a folder you can write to")
        if self.init_weights is not None:
            self.init_weights = Path(self.init_weights)
        if self.resume and self.ckpt.is_file():  # one that cannot be resumed is named now, not after rendering
            _check_resumable(self, _read_ckpt(self.ckpt, "cpu"))
        if self.init_weights is not None:
            name = self.preset if isinstance(self.preset, str) else self.preset.name
            try:
                check_weights_file(self.init_weights, self.preset, workloads.get(self.workload))
            except (FileNotFoundError, ValueError) as e:
                raise ValueError(f"init_weights={str(self.init_weights)!r} is not allowed ({e}); allowed values: a "
                                 f"world-weights .pt file of preset {name!r}") from None
        resolve_device(self.device)
        return self


RUNS_DIR_NAME = "runs"  # data/weights/runs/: one folder per training run; the shipped files sit above it


def default_out(preset: str) -> Path:
    """Where a run writes when no `out` is given: data/weights/runs/<UTC date>-<preset>[-N]/<preset>.pt, a folder of
    its own (the first N not taken), so that a run never replaces the shipped weights or another run's."""
    stem = f"{_dt.datetime.now(_dt.timezone.utc):%Y-%m-%d}-{preset}"
    runs = weights.WEIGHTS_DIR / RUNS_DIR_NAME
    n = 1
    while (runs / (stem if n == 1 else f"{stem}-{n}")).exists():
        n += 1
    return runs / (stem if n == 1 else f"{stem}-{n}") / f"{preset}.pt"


def _read_ckpt(path: Path, device) -> dict:
    """A training checkpoint, read safely (weights_only); a file that is not one names itself and says how to start
    over instead."""
    try:
        ck = read_checkpoint_file(path, map_location=device)
    except CheckpointFileError as e:
        raise ValueError(f"ckpt: {e}; or pass resume=False (--no-resume) to start over, replacing it") from None
    keys = {"model", "opt", "ema", "gen", "step", "elapsed", "rows", "config"}
    if not isinstance(ck, dict) or not keys <= set(ck):
        raise ValueError(f"ckpt={str(path)!r} is not allowed: it is not a wmbook training checkpoint (it lacks "
                         f"{sorted(keys - set(ck) if isinstance(ck, dict) else keys)}); pass resume=False "
                         f"(--no-resume) to start over, replacing it")
    return ck


def _check_resumable(cfg: TrainConfig, ck: dict) -> None:
    """ValueError when checkpoint `ck` was made with another configuration than `cfg` (resuming would mix runs)."""
    same = {k: ck["config"].get(k, {"change_weight": 0.0, "agent_weight": 0.0, "sigma_min": 0.05,
                                    "decision_fraction": DEFAULT_DECISION_FRACTION}.get(k))
            for k in ("workload", "preset", "data_seed", "seed", "episodes", "episode_frames", "batch",
                      "change_weight", "agent_weight", "sigma_min", "decision_fraction", "init_weights")}
    want = {k: getattr(cfg, k) for k in same}
    want["preset"] = cfg.preset if isinstance(cfg.preset, str) else cfg.preset.name
    want["init_weights"] = None if cfg.init_weights is None else str(cfg.init_weights)
    if same != want:
        raise ValueError(f"checkpoint {str(cfg.ckpt)!r} was made with {same}, not {want}; pass resume=False "
                         f"(--no-resume) to start over")


def _lr(cfg: TrainConfig, step: int, elapsed: float) -> float:
    warm = min(1.0, (step + 1) / cfg.warmup) if cfg.warmup else 1.0
    fracs = []
    if cfg.steps is not None:
        fracs.append(step / cfg.steps)
    if cfg.minutes is not None:
        fracs.append(elapsed / (60 * cfg.minutes))
    frac = min(1.0, max(fracs))
    return cfg.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))


def build_training(cfg: TrainConfig, device: torch.device, bank=None):
    """(pipeline, objective) for cfg; the pipeline is fp32 with its model trainable."""
    p = ALL_PRESETS[cfg.preset] if isinstance(cfg.preset, str) else cfg.preset
    if bank is None:  # rendered first: the worker processes fork before CUDA is initialised
        bank = EpisodeBank(cfg.data_seed, cfg.episodes, cfg.episode_frames, device=device,
                           workers=cfg.workers or _default_workers(), progress=cfg.progress)
    wl = workloads.get(cfg.workload)
    pipe = build_world_pipeline(wl, p, device=device, dtype=torch.float32, vae_dtype=torch.float32,
                                weights=False)
    pipe.model.train().requires_grad_(True)
    if cfg.compile != "none":
        compile_for_training(wl, pipe, cfg.compile)
    options = dict(change_weight=cfg.change_weight, sigma_min=cfg.sigma_min, agent_weight=cfg.agent_weight)
    if "decision_pass" in wl.features:
        options["decision_fraction"] = cfg.decision_fraction
    obj = wl.training_objective(pipe, bank, **options)
    if cfg.init_weights is not None:  # after the objective, whose output-conv zero-init is for fresh models only
        load_weights(pipe, wl, cfg.init_weights)  # in place: the model stays trainable
    return pipe, obj


def compile_for_training(wl, pipe, backend: str) -> list[torch.nn.Module]:
    """Compile the denoiser in place (nn.Module.compile: the state dict keeps its keys, so checkpoints and shipped
    weights are the same either way), as the workload's notebooks compile it (regionally or whole). A tiny world model
    runs tens of thousands of small ops per training step; fused, the step stops being bound by their launches."""
    mods = wl.compile_regions(pipe) if wl.compile_scope == "regional" else [wl.compile_target(pipe)]
    for m in mods:
        m.compile(backend=backend, dynamic=False)
    return mods


def _default_workers() -> int:
    return default_workers()


def _write_csv(path: Path, rows: list[dict]) -> None:
    if not rows:
        return
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=list(rows[0]))
    w.writeheader()
    w.writerows(rows)
    with atomic_open(path, "w", encoding="utf-8", newline="") as f:
        f.write(buf.getvalue())


def train(cfg: TrainConfig, bank=None) -> dict:
    """Train one world model; returns the JSON metadata written beside the weights."""
    cfg.check()
    dev = resolve_device(cfg.device)
    torch.manual_seed(cfg.seed)
    t0 = time.perf_counter()
    pipe, obj = build_training(cfg, dev, bank)
    render_s = time.perf_counter() - t0
    model = pipe.model
    params = [q for q in model.parameters() if q.requires_grad]
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.99), weight_decay=0.01)
    ema = [q.detach().clone() for q in params]
    gen = torch.Generator(dev).manual_seed(cfg.seed + 1)
    step, elapsed, rows = 0, 0.0, []
    loss_csv = cfg.out.with_suffix(".loss.csv")
    if cfg.resume and cfg.ckpt.is_file():
        ck = _read_ckpt(cfg.ckpt, dev)
        _check_resumable(cfg, ck)
        have, need = set(ck["model"]), set(model.state_dict())
        if have != need:  # the preset's architecture changed since (e.g. WMAPreset.action_embedding)
            raise ValueError(f"checkpoint {str(cfg.ckpt)!r} holds other weights than the model (missing: "
                             f"{sorted(need - have)[:4]}, unexpected: {sorted(have - need)[:4]}); pass resume=False "
                             f"(--no-resume) to start over")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["opt"])
        for e, s in zip(ema, ck["ema"]):
            e.copy_(s)
        gen.set_state(ck["gen"].cpu())
        step, elapsed, rows = ck["step"], ck["elapsed"], ck["rows"]

    def save_ckpt():
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "ema": ema, "gen": gen.get_state(),
                 "step": step, "elapsed": elapsed, "rows": rows,
                 "config": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()
                               if k != "preset"}, "preset": pipe.preset.name}}
        with atomic_open(cfg.ckpt, "wb") as f:
            torch.save(state, f)
        _write_csv(loss_csv, rows)

    def done() -> bool:
        return (cfg.steps is not None and step >= cfg.steps) or (cfg.minutes is not None
                                                                 and elapsed >= 60 * cfg.minutes)

    use_amp = dev.type == "cuda"
    if use_amp:  # fixed shapes every step: let cuDNN pick its fastest convolutions (the UNet's 3D / 1D convs)
        torch.backends.cudnn.benchmark = True
    compile_s = _compile_warmup(cfg, obj, opt, dev, use_amp) if cfg.compile != "none" else 0.0
    acc, acc_n = {}, 0
    bar = tqdm(total=cfg.steps, initial=step, desc=f"train {pipe.preset.name}", disable=not cfg.progress)
    last = time.perf_counter()
    while not done():
        lr = _lr(cfg, step, elapsed)
        for g in opt.param_groups:
            g["lr"] = lr
        batch = obj.sample_batch(gen, cfg.batch)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_amp):
            loss, parts = obj.loss(batch, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        d = min(cfg.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            torch._foreach_lerp_(ema, [q.detach() for q in params], 1 - d)
        step += 1
        acc["loss"] = acc.get("loss", 0.0) + loss.detach()
        for k, v in parts.items():
            acc[k] = acc.get(k, 0.0) + v
        acc_n += 1
        if step % cfg.log_every == 0 or done():
            now = time.perf_counter()
            row = {"step": step, **{k: float(v) / acc_n for k, v in acc.items()}, "lr": lr}
            elapsed += now - last  # float() above synchronised the device
            last = now
            row["elapsed_s"] = round(elapsed, 2)
            if not math.isfinite(row["loss"]):
                raise FloatingPointError(f"training loss is {row['loss']} at step {step}; stopping")
            rows.append(row)
            acc, acc_n = {}, 0
            bar.set_postfix(loss=f"{row['loss']:.4f}")
        bar.update(1)
        if step % cfg.ckpt_every == 0:
            save_ckpt()
            last = time.perf_counter()  # checkpoint writing is not training time
    bar.close()
    save_ckpt()

    # the EMA weights are the shipped ones
    with torch.no_grad():
        for q, e in zip(params, ema):
            q.copy_(e)
    model.eval().requires_grad_(False)

    meta = {
        "preset": pipe.preset.name, "workload": cfg.workload, "git_commit": git_commit(), "data_seed": cfg.data_seed,
        "frame_stride": getattr(pipe.preset, "frame_stride", 1),
        "seed": cfg.seed, "episodes": cfg.episodes, "episode_frames": cfg.episode_frames, "batch": cfg.batch,
        "lr": cfg.lr, "ema": cfg.ema, "change_weight": cfg.change_weight, "agent_weight": cfg.agent_weight,
        "decision_fraction": cfg.decision_fraction, "compile": cfg.compile,
        "sigma_min": cfg.sigma_min, "steps": step, "train_minutes": round(elapsed / 60, 3),
        "compile_seconds": round(compile_s, 1),
        "render_and_build_seconds": round(render_s, 1), "device": _device_name(dev), "torch": torch.__version__,
        "final_loss": _final_loss(rows), "loss_csv": loss_csv.name, "command": cfg.command,
        "parameters": sum(q.numel() for q in model.parameters()),
    }
    if cfg.init_weights is not None:
        src = cfg.init_weights.with_name(cfg.init_weights.name + ".json")
        prev = json.loads(src.read_text()) if src.is_file() else {}
        meta["init_weights"] = {"file": cfg.init_weights.name, "git_commit": prev.get("git_commit"),
                                "steps": prev.get("steps"), "train_minutes": prev.get("train_minutes")}
    if cfg.eval_cases:
        meta["eval"] = evaluate(cfg.workload, pipe, cfg.eval_cases, progress=cfg.progress)

        fails = shipping_failures(meta["eval"]["model"], meta["eval"]["copy_last"])
        meta["shipping_rule"] = {"rule": SHIPPING_RULE, "passes": not fails, "fails": fails}
    save_weights(pipe, workloads.get(cfg.workload), cfg.out, meta)
    if cfg.ship:
        if meta["shipping_rule"]["passes"]:
            meta["shipped"] = [str(p) for p in ship_weights(cfg.out, weights_path(cfg.preset))]
        else:
            meta["shipped"] = []
    return meta


def _compile_warmup(cfg: TrainConfig, obj, opt, dev: torch.device, use_amp: bool) -> float:
    """Seconds spent compiling: two forward + backward passes on batches from a generator of their own (the training
    draws stay those of an eager run), gradients dropped, no optimizer step, so the weights do not move. The training
    budget and its learning-rate schedule start after it: counted in the budget, inductor's compile of the UNet
    (about 450 s on an H100) would take a large part of a short run and leave the cosine schedule near its end
    before training had begun."""
    t0 = time.perf_counter()
    gen = torch.Generator(dev).manual_seed(cfg.seed + 7919)
    for _ in range(2):  # the second call checks that nothing recompiles on the next batch
        batch = obj.sample_batch(gen, cfg.batch)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=use_amp):
            loss, _ = obj.loss(batch, gen)
        loss.backward()
        opt.zero_grad(set_to_none=True)
    float(loss.detach())  # synchronises the device
    return time.perf_counter() - t0


def _final_loss(rows: list[dict]) -> float | None:
    tail = rows[-4:]
    return round(sum(r["loss"] for r in tail) / len(tail), 6) if tail else None


def _device_name(dev: torch.device) -> str:
    return torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"


def evaluate(workload, pipe, cases: int, seeds=None, progress: bool = False) -> dict:
    """Mean scores of the model and of the copy-last-frame baseline over `cases` held-out episodes (0, 1, ...)
    (workload: a Workload or its name)."""
    workload = workloads.get(workload)
    seeds = list(range(cases)) if seeds is None else list(seeds)
    model, base = [], []
    for s in tqdm(seeds, desc="held-out evaluation", disable=not progress, leave=False):
        case = weval.heldout_case(workload, pipe, s)
        model.append(weval.score(weval.predict(workload, pipe, case), case))
        base.append(weval.score(weval.copy_last(case), case))

    def mean(rows, k):
        vals = [r[k] for r in rows if r[k] == r[k]]
        return round(sum(vals) / len(vals), 4) if vals else None

    keys = ("psnr", "ssim", "agent_err_px")
    return {"heldout_seeds": seeds, "model": {k: mean(model, k) for k in keys},
            "copy_last": {k: mean(base, k) for k in keys}}
