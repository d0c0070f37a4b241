"""One run configuration: every notebook's parameters validated once, into objects that are passed down.

A notebook declares its parameters as a `NotebookSpec` (the common ones of wmbook.params, its workload's own,
and its own options). `validate(spec, **values)` checks all of them before any heavy work, in one place, with
errors that name the parameter and its allowed values (unknown names too), and returns a frozen `RunConfig`
holding the `Workload`, `Preset`, `torch.device` and `torch.dtype` objects, and each variant stack as its resolved
`Variant` objects (wmbook.studies.common.variant_stack): nothing downstream resolves a name again.

    from wmbook.studies import baseline
    cfg = baseline.validate(workload="wma", preset="tiny-wma", ddim_steps=3)
    cfg.workload, cfg.preset, cfg.device, cfg.dtype, cfg.options.ddim_steps
"""

from __future__ import annotations

import ast
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any, Callable

import torch

from . import hostload, paths, studies, workloads
from .params import Param, ParameterError
from .presets import dtype_name


def _workload(v, ctx):
    try:
        return workloads.get(v)
    except ValueError as e:
        raise ParameterError(str(e)) from None


WORKLOAD = Param("workload", "mg2", _workload, "mg2 (causal DiT + KV cache) | wma (video UNet + DDIM)")
# validated in this order (later checks see earlier values); the rest follow in the spec's order
_FIRST = ("workload", "device", "preset", "dtype", "vae_dtype")


@dataclass(frozen=True)
class NotebookSpec:
    """A notebook's name, its parameters (defaults = its parameters cell), the workload features it needs and an
    optional cross check."""

    name: str
    params: tuple[Param, ...]
    workload_params: bool = True  # the workload's own parameters (num_blocks, ddim_steps, ...) apply
    cross_check: Callable[["RunConfig"], None] | None = None
    # the workloads this notebook runs for: those with these features (the world-model notebooks need a denoiser)
    requires: frozenset[str] = frozenset({"denoiser"})
    # the published set (wmbook.regenerate): "one" GPU a run, or "all" of the host's (run alone, after the others)
    gpus: str = "one"
    # runs of the published set besides one per workload at its defaults: parameters each (a trained preset's run)
    set_runs: tuple[dict, ...] = ()
    # `wmbook run --profile quick`: the parameters that make a run short enough to step through (fewer repeats, the
    # costliest optional tables off); what is given explicitly wins. Its rows never join the published store.
    quick: Mapping[str, Any] = field(default_factory=dict)
    # notebooks whose stacks this one compiles again (its base is their best): in the published set its run of a
    # workload starts once theirs has ended, so that those compiles come from the set's cache
    builds_on: tuple[str, ...] = ()

    def supports(self, workload) -> bool:
        """Whether this notebook runs for `workload` (a Workload)."""
        return self.requires <= workload.features

    def workloads(self) -> list:
        """The workloads this notebook runs for."""
        return [wl for wl in workloads.all_workloads() if self.supports(wl)]

    def all_params(self, workload=None) -> dict[str, Param]:
        """Name -> Param, the workloads' own parameters included (those of every workload the notebook runs for when
        `workload` is None)."""
        out = {p.name: p for p in self.params}
        if self.workload_params:
            for wl in ([workload] if workload is not None else self.workloads()):
                for p in wl.params:
                    out.setdefault(p.name, p)
        return out

    def defaults(self) -> dict[str, Any]:
        return {k: p.default for k, p in self.all_params().items()}


class Options(Mapping):
    """Read-only validated options with attribute access (`cfg.options.num_blocks`)."""

    def __init__(self, values: dict):
        object.__setattr__(self, "_values", MappingProxyType(dict(values)))

    def __getitem__(self, key):
        return self._values[key]

    def __iter__(self):
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __getattr__(self, name):
        try:
            return self._values[name]
        except KeyError:
            raise AttributeError(f"no option {name!r}; options: {sorted(self._values)}") from None

    def __setattr__(self, name, value):
        raise AttributeError("options are read-only")

    def __repr__(self) -> str:
        return f"Options({dict(self._values)!r})"


@dataclass(frozen=True)
class RunConfig:
    """A validated run: objects, not names (see the module docstring)."""

    notebook: str
    workload: Any  # wmbook.workloads.Workload
    preset: Any  # CausalWanPreset | WMAPreset
    device: torch.device
    dtype: torch.dtype
    vae_dtype: torch.dtype
    warmup: int
    repeats: int
    seed: int
    output_dir: Path
    results_path: Path
    options: Options = field(default_factory=lambda: Options({}))

    @property
    def tiny(self) -> bool:
        return self.preset.tiny

    def params(self) -> dict:
        """The run's parameters as plain values (a results row's `params` column)."""
        d = {"workload": self.workload.name, "preset": self.preset.name, "device": str(self.device),
             "dtype": dtype_name(self.dtype), "vae_dtype": dtype_name(self.vae_dtype), "seed": self.seed}
        for k, v in self.options.items():
            d[k] = ",".join(map(str, v)) if isinstance(v, (list, tuple)) else (str(v) if isinstance(v, Path) else v)
        return d

    def table(self):
        """The parameters as a one-column DataFrame (what the notebook shows after validating)."""
        import pandas as pd  # noqa: PLC0415  heavy: pandas, only for table()

        d = self.params() | {"warmup": self.warmup, "repeats": self.repeats, "output_dir": str(self.output_dir),
                             "results_path": str(self.results_path), "expected run time": self.expected_time(),
                             "host core speed": hostload.core_speed()}
        return pd.DataFrame({"value": {k: str(v) for k, v in d.items()}}).rename_axis("parameter")

    def expected_time(self) -> str:
        """How long this notebook took here before, in words (wmbook.runtimes: the recorded runs of this notebook,
        workload, preset, device and profile)."""
        from . import results, runtimes  # noqa: PLC0415  heavy: pandas (wmbook.results)

        name = results.environment_metadata()["device_name"]  # as the run's rows and its recorded time name it
        profile = os.environ.get(runtimes.PROFILE_ENV, "full")
        files = [runtimes.times_path(self.results_path), runtimes.times_path(default_results_path(self.preset.tiny))]
        try:
            return runtimes.describe(self.notebook, self.workload.name, self.preset.name, name,
                                     profile if profile in runtimes.PROFILES else "full", files)
        except OSError as e:  # an unreadable times file: the run goes on without the expectation
            return f"not known ({type(e).__name__})"

    def replace(self, **kw) -> "RunConfig":
        if "options" in kw and not isinstance(kw["options"], Options):
            kw["options"] = Options(dict(kw["options"]))
        return replace(self, **kw)


def validate(spec: NotebookSpec, **values) -> RunConfig:
    """Check every parameter of `spec` (unknown names too) before any heavy work; returns the RunConfig."""
    known = spec.all_params()
    unknown = sorted(set(values) - set(known))
    if unknown:
        raise ParameterError(f"unknown parameter(s) {unknown} for notebook {spec.name}; allowed names: {sorted(known)}")
    injected = papermill_injected()
    if injected is not None:  # papermill run directly: it only warns about a name the notebook does not declare
        names, declared = injected
        unknown = sorted(names - declared - set(known))
        if unknown:
            raise ParameterError(f"unknown parameter(s) {unknown} given to notebook {spec.name} (papermill -p); "
                                 f"allowed names: {sorted(set(known) | declared)}")
    ctx: dict[str, Any] = {}
    given = {k: values.get(k, p.default) for k, p in known.items()}
    for name in [n for n in _FIRST if n in known]:
        ctx["_name"] = name
        allowed = [w.name for w in spec.workloads()]
        if name == "workload" and isinstance(given[name], str) and given[name] not in workloads.names():
            raise ParameterError(f"workload={given[name]!r} is not allowed; allowed values: {allowed}")
        ctx[name] = _checked(known[name], given[name], ctx)
        if name == "workload" and not spec.supports(ctx[name]):
            raise ParameterError(f"workload={ctx[name].name!r} is not allowed for notebook {spec.name}; allowed "
                                 f"values: {[w.name for w in spec.workloads()]}")
    wl = ctx["workload"]
    own = {q.name for q in spec.params} | {q.name for q in wl.params}
    for name, p in known.items():
        if name in _FIRST:
            continue
        if name not in own:  # another workload's parameter: only its default (it would be silently ignored)
            if given[name] != p.default:
                owners = [w.name for w in _workloads() if name in {q.name for q in w.params}]
                raise ParameterError(f"{name}={given[name]!r} applies to workload {owners} only; for workload "
                                     f"{wl.name!r} leave it at {p.default!r}")
            continue
        ctx["_name"] = name
        ctx[name] = _checked(p, given[name], ctx)
    ctx.pop("_name", None)
    preset, dev = ctx["preset"], ctx["device"]
    if ctx.get("weights") is not None:  # a world preset run on another weights file than the shipped one
        preset = preset.with_(weights=str(ctx["weights"].path))
    out = ctx.get("output_dir", "auto")
    out = Path(out) if out != "auto" else paths.artifacts_dir(spec.name, preset.name, dev.type)
    rp = ctx.get("results_path", "auto")
    rp = Path(rp) if rp != "auto" else default_results_path(preset.tiny)
    common = {"workload", "device", "preset", "dtype", "vae_dtype", "warmup", "repeats", "seed", "output_dir",
              "results_path"}
    options = {k: v for k, v in ctx.items() if k not in common}
    cfg = RunConfig(notebook=spec.name, workload=wl, preset=preset, device=dev,
                    dtype=ctx.get("dtype", torch.float32), vae_dtype=ctx.get("vae_dtype", torch.float32),
                    warmup=ctx.get("warmup", 0), repeats=ctx.get("repeats", 1), seed=ctx.get("seed", 0),
                    output_dir=out, results_path=rp, options=Options(options))
    wl.check_config(cfg)
    if spec.cross_check is not None:
        spec.cross_check(cfg)
    return cfg


PAPERMILL_CELL = "# Parameters\n"  # how papermill's injected-parameters cell begins (papermill.translators)


def _assigned_names(source: str) -> set[str]:
    """The names a cell's top-level assignments bind (a parameters cell's parameters)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    names = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def papermill_injected() -> tuple[set[str], set[str]] | None:
    """In a kernel that papermill executes: (the names its injected-parameters cell assigns, the names the cell run
    before it, the notebook's parameters cell, declares); None elsewhere. Papermill only warns about a name the
    parameters cell lacks and runs on with the defaults; validate() refuses it instead."""
    try:
        from IPython import get_ipython  # noqa: PLC0415  optional: IPython
    except ImportError:
        return None
    shell = get_ipython()
    history = list(getattr(shell, "user_ns", {}).get("_ih") or []) if shell is not None else []
    for i in range(len(history) - 1, 0, -1):
        if history[i].startswith(PAPERMILL_CELL):
            return _assigned_names(history[i]), _assigned_names(history[i - 1])
    return None


def _checked(p: Param, value, ctx: dict):
    """p.check(value), any ValueError it raises (an unknown variant, a preset that does not fit) turned into a
    ParameterError that names the parameter."""
    try:
        return p.check(value, ctx)
    except ParameterError:
        raise
    except ValueError as e:
        raise ParameterError(f"{p.name}={value!r} is not allowed: {e}") from None


def _workloads():
    return workloads.all_workloads()


def notebook_parameters(paths, params: dict, workloads=None, profile: str = "full"
                        ) -> list[tuple[Path, str | None, dict]]:
    """The runs a batch makes and the parameters each gets, checked before any kernel starts (wmbook run calls it).

    Names: every name in `params` must be declared by the parameters cell (papermill.inspect_notebook) of at least
    one of the notebooks; each notebook gets the names it declares. `workloads` (names, or None): a notebook that
    declares `workload` runs once per workload it supports (NotebookSpec.requires); one that supports none of them is
    left out, and so is one that would run with its own default workload when `preset` names a preset of a workload it
    does not run for (`wmbook run --preset tiny` runs the mg2 notebooks, not notebook 07); an error only when nothing
    is left to run. Values: a notebook with a NotebookSpec (wmbook.studies)
    validates each run's parameters with the validator the notebook itself calls, so a bad value is refused here, in
    seconds, instead of in a kernel. `profile` "quick": each notebook's NotebookSpec.quick parameters under the
    given ones. Returns [(path, workload or None, parameters)] in notebook order; raises ParameterError naming the
    notebook, the parameter and the allowed names or values.
    """
    from . import runtimes  # noqa: PLC0415

    if profile not in runtimes.PROFILES:
        raise ParameterError(f"profile={profile!r} is not allowed; allowed values: {list(runtimes.PROFILES)}")
    declared = {Path(p): set(_declared_parameters(p)) for p in paths}
    known = set().union(*declared.values()) if declared else set()
    unknown = sorted(set(params) - known)
    if unknown:
        names = ", ".join(Path(p).stem for p in declared)
        raise ParameterError(f"unknown parameter(s) {unknown} for notebook(s) {names}; allowed names: {sorted(known)}")
    if workloads is not None:
        if "workload" in params:
            raise ParameterError("workload is given twice (a parameter and the list of workloads to run): give one")
        for w in workloads:
            _workload(w, {"_name": "workload"})
    by_preset = _preset_workload(params.get("preset")) if "workload" not in params else None
    runs = []
    for path, names in declared.items():
        mine = {k: v for k, v in params.items() if k in names}
        spec = studies.spec_for(path.stem)
        if profile == "quick" and spec is not None:
            mine = {k: v for k, v in spec.quick.items() if k in names} | mine
        each = workloads if workloads is not None and "workload" in names else [None]
        if spec is not None and each != [None]:
            each = [w for w in each if spec.supports(_workload(w, {"_name": "workload"}))]
        elif spec is not None and "workload" in names and by_preset is not None and not spec.supports(by_preset):
            continue
        for w in each:
            p = mine if w is None else mine | {"workload": w}
            if spec is not None:
                try:
                    validate(spec, **p)
                except ParameterError as e:
                    raise ParameterError(f"{path.stem}{'' if w is None else f' ({w})'}: {e}") from None
            runs.append((path, w, p))
    if not runs and declared:
        specs = {p.stem: studies.spec_for(p.stem) for p in declared}
        allowed = {n: [w.name for w in s.workloads()] for n, s in specs.items() if s is not None}
        asked = (f"workload(s) {list(workloads)}" if workloads is not None else
                 f"preset {params.get('preset')!r} (workload {by_preset.name!r})")
        raise ParameterError(f"none of notebook(s) {', '.join(specs)} runs for {asked}; they run for {allowed}")
    return runs


def _preset_workload(preset):
    """The workload a preset name belongs to (None for 'auto', no preset, or a name no workload knows)."""
    if not isinstance(preset, str) or preset == "auto":
        return None
    try:
        return workloads.for_preset(preset)
    except ValueError:
        return None


def _declared_parameters(path) -> dict:
    """papermill.inspect_notebook of a notebook; one without a kernelspec (papermill then cannot tell its language)
    is inspected as a Python notebook, which is how the runner executes it. A file that is not a notebook raises
    ParameterError naming it."""
    import nbformat  # noqa: PLC0415  heavy: nbformat, only to inspect notebooks
    import papermill as pm  # noqa: PLC0415  heavy: papermill, only to inspect notebooks

    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as e:  # noqa: BLE001  (nbformat raises JSON, schema and decoding errors of many types)
        raise ParameterError(f"notebook {str(path)!r} is not allowed: it is not a readable Jupyter notebook "
                             f"({type(e).__name__}: {' '.join(str(e).split())[:200]}); allowed values: an .ipynb "
                             f"notebook with a cell tagged 'parameters', e.g. one of notebooks/NN_*.ipynb") from None
    if nb.metadata.get("kernelspec", {}).get("name"):
        return pm.inspect_notebook(str(path))
    nb.metadata["kernelspec"] = {"name": "python3", "language": "python", "display_name": "Python 3"}
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / Path(path).name
        nbformat.write(nb, copy)
        return pm.inspect_notebook(str(copy))


def default_results_path(tiny: bool) -> Path:
    """Where a run's rows go when its results_path is `auto` (wmbook.results.default_results_path)."""
    from . import results  # noqa: PLC0415  heavy: pandas (wmbook.results), only when a run is configured

    return results.default_results_path(tiny)
