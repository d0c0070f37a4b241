"""torch.compile applied from outside (whole model or the repeated blocks), and its compile time measured.

    spec = CompileSpec(scope="regional", mode="default", dynamic=False)
    record = apply_compile(model, spec, regions=list(model.blocks))   # in place; twice is an error
    measure_compile_time(make_model, run_once, spec, regions=...)     # cold vs warm on-disk cache

What compiled and why it recompiled: wmbook.variants.compile_monitor. Compile time is host work: it is timed
with the wall clock around a synchronized first call. CUDA graphs (mode="reduce-overhead") belong to notebook 06
and are refused here.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import inspect
import os
import shutil
import tempfile
import time
import warnings
from collections import Counter
from dataclasses import dataclass, field

import torch
import torch._dynamo

from ..bench import time_fn, time_once
from ..presets import resolve_device
from .compile_monitor import CompileMonitor

SCOPES = ("regional", "whole")
MODES = ("default", "max-autotune-no-cudagraphs", "reduce-overhead")  # reduce-overhead: inductor's CUDA graphs (nb 06)
BACKENDS = ("inductor", "aot_eager", "eager")
_CUDAGRAPH_MODES = ("max-autotune",)  # also captures CUDA graphs: refused, so that one mode says it does
_MARK = "_wmbook_compiled"  # set on every module this file compiled (value: the spec name)
_RECORD = "_wmbook_compile_record"  # set on the root model


# --- spec ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CompileSpec:
    """How to compile: scope (regional | whole), mode, dynamic, backend, fullgraph; validated here."""

    scope: str = "regional"
    mode: str = "default"
    dynamic: bool | None = False
    backend: str = "inductor"
    fullgraph: bool = False

    def __post_init__(self):
        if self.scope not in SCOPES:
            raise ValueError(f"scope={self.scope!r} is not allowed; allowed values: {list(SCOPES)}")
        if isinstance(self.mode, str) and self.mode not in MODES and (
                self.mode in _CUDAGRAPH_MODES or "cudagraph" in self.mode):
            raise ValueError(f"mode={self.mode!r} also captures CUDA graphs; use 'reduce-overhead' for torch.compile's "
                             f"CUDA graphs (notebook 06) or 'max-autotune-no-cudagraphs'. Allowed modes: {list(MODES)}")
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r} is not allowed; allowed values: {list(MODES)}")
        if not (self.dynamic is None or isinstance(self.dynamic, bool)):
            raise ValueError(f"dynamic={self.dynamic!r} is not allowed; allowed values: [False, True, None]")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r} is not allowed; allowed values: {list(BACKENDS)}")
        if self.mode != "default" and self.backend != "inductor":
            raise ValueError(f"mode={self.mode!r} needs backend='inductor', got backend={self.backend!r}")
        if not isinstance(self.fullgraph, bool):
            raise ValueError(f"fullgraph={self.fullgraph!r} is not allowed; allowed values: [False, True]")

    @property
    def name(self) -> str:
        """Short label, e.g. `regional-default-static` (dynamic: static | dynamic | auto)."""
        dyn = {False: "static", True: "dynamic", None: "auto"}[self.dynamic]
        s = f"{self.scope}-{self.mode}-{dyn}"
        if self.backend != "inductor":
            s += f"-{self.backend}"
        return s + ("-fullgraph" if self.fullgraph else "")

    def compile_kwargs(self) -> dict:
        """Keyword arguments for torch.compile / nn.Module.compile."""
        kw = {"backend": self.backend, "dynamic": self.dynamic, "fullgraph": self.fullgraph}
        if self.mode != "default":
            kw["mode"] = self.mode
        return kw

    def to_dict(self) -> dict:
        return {"scope": self.scope, "mode": self.mode, "dynamic": self.dynamic, "backend": self.backend,
                "fullgraph": self.fullgraph}


# --- apply ------------------------------------------------------------------------------------------------


@dataclass
class CompileRecord:
    """What apply_compile compiled: qualified names, classes, and how (Module.compile or forward)."""

    spec: CompileSpec
    targets: list[str]  # qualified module names; "" is the root model
    classes: dict[str, int]  # class name -> how many targets
    methods: list[str]  # per target: "Module.compile" or "forward" (torch-defined forwards, see below)
    shares_code: bool  # regional: one compiled code per block class (inline_inbuilt_nn_modules)
    torch_version: str = torch.__version__
    _modules: list = field(default_factory=list, repr=False)

    @property
    def n_targets(self) -> int:
        return len(self.targets)

    def summary(self) -> dict:
        return {"name": self.spec.name, **self.spec.to_dict(), "n_targets": self.n_targets,
                "classes": dict(self.classes), "methods": dict(Counter(self.methods)),
                "shares_code": self.shares_code, "torch": self.torch_version}


def _inline_inbuilt_nn_modules() -> bool:
    # always True on 2.13 (reading the flag warns that it is deprecated); a real flag on older versions
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return bool(getattr(torch._dynamo.config, "inline_inbuilt_nn_modules", True))


def _forward_owner(module: torch.nn.Module) -> str:
    for klass in type(module).__mro__:
        if "forward" in klass.__dict__:
            return klass.__module__ or ""
    return ""


def _is_compiled(module: torch.nn.Module) -> bool:
    return (_MARK in module.__dict__ or getattr(module, "_compiled_call_impl", None) is not None
            or "forward" in module.__dict__)


def _resolve_regions(model: torch.nn.Module, regions) -> list[torch.nn.Module]:
    """regions: list/ModuleList of modules, a callable (model) -> modules or () -> modules, or an
    attribute path of `model` such as "blocks"."""
    if isinstance(regions, str):
        obj = model
        for part in regions.split("."):
            if not hasattr(obj, part):
                raise ValueError(f"regions={regions!r}: {type(obj).__name__} has no attribute {part!r}")
            obj = getattr(obj, part)
        regions = obj
    elif callable(regions) and not isinstance(regions, torch.nn.Module):
        try:
            n_params = len(inspect.signature(regions).parameters)
        except (TypeError, ValueError):
            n_params = 1
        regions = regions(model) if n_params >= 1 else regions()
    if isinstance(regions, torch.nn.Module) and not isinstance(regions, (torch.nn.ModuleList, torch.nn.Sequential)):
        regions = [regions]
    try:
        out = list(regions)
    except TypeError:
        raise ValueError(f"regions must be a list of modules, a callable returning them or an attribute name, "
                         f"got {type(regions).__name__}") from None
    bad = [type(m).__name__ for m in out if not isinstance(m, torch.nn.Module)]
    if bad:
        raise ValueError(f"regions must all be torch.nn.Module, got {bad[:3]}")
    if not out:
        raise ValueError("regions is empty: a regional compile needs at least one module to compile")
    if len({id(m) for m in out}) != len(out):
        raise ValueError("regions lists the same module more than once")
    return out


def apply_compile(model: torch.nn.Module, spec: CompileSpec, regions=None) -> CompileRecord:
    """Compile `model` in place: the whole forward, or every module of `regions` (scope="regional").

    regions: a list of modules (e.g. `list(model.blocks)`), a callable returning them, or an
    attribute path such as "blocks". Blocks of one class share compiled code (dynamo inlines
    nn.Module calls and guards on the class, not the instance). Modules whose forward is defined
    inside torch (nn.Sequential, nn.Linear, ...) get `forward` replaced by a compiled one, because
    `nn.Module.compile()` silently compiles nothing for them. Applying twice raises.
    """
    if not isinstance(spec, CompileSpec):
        raise ValueError(f"spec must be a CompileSpec, got {type(spec).__name__}")
    if not isinstance(model, torch.nn.Module):
        raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    if _RECORD in model.__dict__:
        raise RuntimeError(f"model is already compiled ({model.__dict__[_RECORD].spec.name}); build a fresh "
                           f"model or call remove_compile(model) first")
    names = {id(m): n for n, m in model.named_modules()}
    if spec.scope == "whole":
        if regions is not None:
            raise ValueError("regions is only for scope='regional'; scope='whole' compiles the model's forward")
        targets = [model]
    else:
        if regions is None:
            raise ValueError("scope='regional' needs regions= (e.g. list(model.blocks) or 'blocks')")
        targets = _resolve_regions(model, regions)
        outside = [type(m).__name__ for m in targets if id(m) not in names]
        if outside:
            raise ValueError(f"regions must be submodules of the model; not found in it: {outside[:3]}")
        ids = {id(m) for m in targets}
        for m in targets:
            nested = [names[id(s)] for s in m.modules() if s is not m and id(s) in ids]
            if nested:
                raise ValueError(f"region {names[id(m)] or type(m).__name__!r} contains other regions {nested[:3]}; "
                                 f"nested compiled regions are not allowed")
    already = [names.get(id(m), "?") or "<model>" for m in model.modules() if _is_compiled(m)]
    if already:
        raise RuntimeError(f"modules already compiled (or forward overridden): {already[:5]}; build a fresh "
                           f"model or call remove_compile(model) first")

    shares = _inline_inbuilt_nn_modules()
    if spec.scope == "regional" and not shares and len(targets) > 1:
        warnings.warn("torch._dynamo.config.inline_inbuilt_nn_modules is False: every block instance compiles "
                      "its own graph (and may hit the recompile limit); set it to True", stacklevel=2)
    kw = spec.compile_kwargs()
    methods = []
    for m in targets:
        if _forward_owner(m).startswith("torch."):
            m.forward = torch.compile(m.forward, **kw)  # instance attribute; hooks stay eager
            methods.append("forward")
        else:
            m.compile(**kw)
            methods.append("Module.compile")
        m.__dict__[_MARK] = spec.name
    record = CompileRecord(spec=spec, targets=[names[id(m)] for m in targets],
                           classes=dict(Counter(type(m).__name__ for m in targets)), methods=methods,
                           shares_code=shares, _modules=list(targets))
    model.__dict__[_RECORD] = record
    return record


def remove_compile(model: torch.nn.Module) -> CompileRecord:
    """Undo apply_compile on `model` (back to eager); returns the record it removed."""
    record = model.__dict__.pop(_RECORD, None)
    if record is None:
        raise RuntimeError("model was not compiled by apply_compile")
    for m, how in zip(record._modules, record.methods):
        if how == "forward":
            m.__dict__.pop("forward", None)
        else:
            m._compiled_call_impl = None
        m.__dict__.pop(_MARK, None)
    return record


# --- config and caches ------------------------------------------------------------------------------------


def recompile_limit_name() -> str:
    """The dynamo config holding the per-code recompile limit: recompile_limit (new) or cache_size_limit."""
    cfg = torch._dynamo.config
    return "recompile_limit" if hasattr(cfg, "recompile_limit") else "cache_size_limit"


def get_recompile_limit() -> int:
    return int(getattr(torch._dynamo.config, recompile_limit_name()))


@contextlib.contextmanager
def set_recompile_limit(n: int):
    """Temporarily set dynamo's per-function recompile limit to `n`; yields the old value."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"recompile limit must be an int >= 1, got {n!r}")
    name = recompile_limit_name()
    old = getattr(torch._dynamo.config, name)
    setattr(torch._dynamo.config, name, n)
    try:
        yield old
    finally:
        setattr(torch._dynamo.config, name, old)


_CACHE_ENV = ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")


def clear_inmemory_compile_caches() -> None:
    """Forget inductor's in-process code caches (loaded modules stay alive where still referenced)."""
    try:
        import torch._inductor.utils as iu  # noqa: PLC0415  optional: inductor internal
    except Exception:
        return
    fn = getattr(iu, "clear_caches", None) or getattr(iu, "clear_inductor_caches", None)
    if fn is not None:
        fn()


def reset_compile_state() -> None:
    """Fresh process-level compile state: torch._dynamo.reset() plus inductor's in-memory caches."""
    torch._dynamo.reset()
    clear_inmemory_compile_caches()


@contextlib.contextmanager
def inductor_cache_dir(path=None, keep: bool | None = None):
    """Point the on-disk compile caches at `path` (None: a fresh temporary directory); yields the path.

    TORCHINDUCTOR_CACHE_DIR holds the FX-graph cache (fxgraph/), the AOTAutograd cache (aotautograd/),
    C++/Triton kernel sources and binaries, autotune results and dynamo's PGO profiles (dynamo/);
    TRITON_CACHE_DIR (<path>/triton) holds Triton's compiled kernels. In-memory caches are cleared on
    entry and exit; the environment is restored on exit. A temporary directory is deleted on exit
    unless keep=True; a given path is kept unless keep=False.
    """
    created = path is None
    d = tempfile.mkdtemp(prefix="wmbook_inductor_") if created else os.path.abspath(os.fspath(path))
    os.makedirs(d, exist_ok=True)
    keep = (not created) if keep is None else bool(keep)
    old = {k: os.environ.get(k) for k in _CACHE_ENV}
    clear_inmemory_compile_caches()
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = d
    os.environ["TRITON_CACHE_DIR"] = os.path.join(d, "triton")
    try:
        yield d
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        clear_inmemory_compile_caches()
        if not keep:
            shutil.rmtree(d, ignore_errors=True)


def _dir_bytes(path: str) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):
                total += os.path.getsize(os.path.join(root, f))
    return total


def cpp_compiler_available() -> bool:
    """Whether inductor's CPU backend can find a C++ compiler (needed for backend='inductor' on CPU)."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler  # noqa: PLC0415  optional: inductor internal

        get_cpp_compiler()
        return True
    except Exception:
        return any(shutil.which(c) for c in ("g++", "c++", "clang++"))


# --- compile time -----------------------------------------------------------------------------------------


def _import_backend(backend: str) -> float:
    """Import the backend's modules now (s), so neither cold nor warm pays the import."""
    t0 = time.perf_counter()
    if backend == "inductor":
        importlib.import_module("torch._inductor.compile_fx")
    elif backend == "aot_eager":
        importlib.import_module("torch._functorch.aot_autograd")
    return time.perf_counter() - t0


def _phase_cols(phase: str, first_s: float, s: dict) -> dict:
    return {f"{phase}_s": first_s, f"{phase}_compile_s": s["compile_s"], f"{phase}_dynamo_s": s["dynamo_s"],
            f"{phase}_backend_s": s["backend_s"], f"{phase}_inductor_s": s["inductor_s"],
            f"{phase}_graphs": s["graphs"], f"{phase}_recompiles": s["recompiles"],
            f"{phase}_graph_breaks": s["graph_breaks"], f"{phase}_fx_cache_hits": s["fx_cache_hits"],
            f"{phase}_fx_cache_misses": s["fx_cache_misses"], f"{phase}_aot_cache_hits": s["aot_cache_hits"]}


def _check_cache_dir(cache_dir) -> None:
    if cache_dir is not None and os.path.isdir(cache_dir) and os.listdir(cache_dir):
        raise ValueError(f"cache_dir={cache_dir!r} is not empty: the cold measurement needs an empty cache "
                         f"directory (pass a new path, or None for a temporary one)")


def measure_compile_time(make_model, run_once, spec: CompileSpec, regions=None, device=None, *, cache_dir=None,
                         steady_repeats: int = 3, eager_first: bool = True, after_warm=None) -> dict:
    """Compile time of `spec` cold (empty on-disk cache) and warm (cache filled by the cold run).

    Only inductor keeps an on-disk cache: for the other backends (aot_eager, eager: the CPU smoke runs) a second
    compile would only repeat the first, so the warm phase reuses the cold model (warm_s, cold_over_warm NaN).

    make_model(): a fresh model (called once per phase); run_once(model): one unit of work (e.g. a
    forward). regions: as in apply_compile, but an attribute path ("blocks") or a callable (model)
    -> modules, since each phase builds its own model. Each phase: reset_compile_state(), build,
    apply_compile, wall time of the first synchronized run_once (compile + one run); then the warm
    model's steady time (median of `steady_repeats`). Returns one flat row (seconds unless `_ms`).

    In-process limits: warm here still has torch/inductor imported, the compile worker pool running
    and the CUDA context up; a new process pays those again. eager_first runs one eager call first so
    that CUDA context / cuBLAS / lazy-init costs land in neither phase.
    after_warm(model): called in-process with the warm compiled model after its steady timing (e.g. to run
    more measurements on it without compiling again).
    """
    if not isinstance(spec, CompileSpec):
        raise ValueError(f"spec must be a CompileSpec, got {type(spec).__name__}")
    if not isinstance(steady_repeats, int) or steady_repeats < 1:
        raise ValueError(f"steady_repeats must be an int >= 1, got {steady_repeats!r}")
    if regions is not None and not (isinstance(regions, str) or callable(regions)):
        raise ValueError("regions must be an attribute path such as 'blocks' or a callable (model) -> modules: "
                         "each phase builds its own model")
    _check_cache_dir(cache_dir)
    dev = resolve_device(device)
    row = {"name": spec.name, **spec.to_dict(), "device": str(dev), "torch": torch.__version__,
           "method": "in-process"}
    if eager_first:
        model = make_model()
        row["eager_first_s"] = time_once(lambda model=model: run_once(model), dev) / 1e3
        del model
    row["backend_import_s"] = _import_backend(spec.backend)
    phases = ("cold", "warm") if spec.backend == "inductor" else ("cold",)
    with inductor_cache_dir(cache_dir) as d:
        for phase in phases:
            reset_compile_state()
            gc.collect()
            model = make_model()
            record = apply_compile(model, spec, regions=regions)
            with CompileMonitor() as mon:
                first_ms = time_once(lambda model=model: run_once(model), dev)
            row.update(_phase_cols(phase, first_ms / 1e3, mon.summary()))
            if phase == "cold":
                row["graph_breaks"] = mon.summary()["graph_breaks"]
                if len(phases) > 1:
                    del model
        with CompileMonitor() as smon:
            t = time_fn(lambda model=model: run_once(model), warmup=1, repeats=steady_repeats, device=dev)
        row.update(steady_ms=t.median, steady_p20=t.p20, steady_p80=t.p80)
        row["steady_recompiles"] = smon.summary()["recompiles"]
        row["n_targets"] = record.n_targets
        row["cache_mb"] = _dir_bytes(d) / 2**20
        if after_warm is not None:
            after_warm(model)
        del model
    warm = row.get("warm_s", float("nan"))
    row.setdefault("warm_s", warm)
    row["cold_over_warm"] = row["cold_s"] / warm if warm > 0 else float("nan")
    return row


__all__ = ["BACKENDS", "CompileRecord", "CompileSpec", "MODES", "SCOPES", "apply_compile",
           "clear_inmemory_compile_caches", "cpp_compiler_available", "get_recompile_limit", "inductor_cache_dir",
           "measure_compile_time", "recompile_limit_name", "remove_compile", "reset_compile_state",
           "set_recompile_limit"]
