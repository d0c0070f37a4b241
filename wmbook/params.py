"""The vocabulary of notebook parameters: `Param` (a name, the default its parameters cell holds, a check),
the checks, and the parameters every notebook shares. wmbook.runconfig validates a notebook's parameters with
them into one RunConfig; workloads declare their own parameters with them.

A check is `check(value, ctx) -> normalized value`; `ctx` holds the parameters validated before it (the
workload, device and preset objects first) and `ctx["_name"]` the parameter's name; a bad value raises a
ParameterError that names the parameter and its allowed values.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from . import paths
from .errors import InputError, number_error, number_range  # noqa: F401  (re-exported)
from .presets import DTYPES, resolve_device
from .world.weights import check_weights_file, file_sha256, is_world_preset

Check = Callable[[Any, dict], Any]  # (value, already validated values) -> normalized value, or ValueError


class ParameterError(InputError):
    """A notebook parameter with a value that is not allowed (the message names it and the allowed values)."""


@dataclass(frozen=True)
class Param:
    """One notebook parameter: its default (what the notebook's parameters cell holds) and its check."""

    name: str
    default: Any
    check: Check
    doc: str = ""

    def with_default(self, default) -> "Param":
        return Param(self.name, default, self.check, self.doc)


def _err(name: str, value, allowed: str) -> ParameterError:
    return ParameterError(f"{name}={value!r} is not allowed; allowed values: {allowed}")


# --- checks -------------------------------------------------------------------------------------------------


def integer(lo: int, hi: int | None = None) -> Check:
    """An int (not a bool) in [lo, hi]."""

    def check(v, ctx):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < lo or (hi is not None and v > hi):
            raise _err(ctx["_name"], v, f"an integer >= {lo}" + (f" and <= {hi}" if hi is not None else ""))
        return int(v)

    return check


def number(lo: float, hi: float = math.inf) -> Check:
    """A finite int or float in [lo, hi]."""

    def check(v, ctx):
        why = number_error(ctx["_name"], v, lo, hi)
        if why:
            raise ParameterError(why)
        return float(v)

    return check


def boolean(v, ctx):
    if not isinstance(v, (bool, np.bool_)):
        raise _err(ctx["_name"], v, "[True, False]")
    return bool(v)


def choice(*values) -> Check:
    def check(v, ctx):
        if v not in values:
            raise _err(ctx["_name"], v, str(list(values)))
        return v

    return check


def path_or_auto(v, ctx):
    if not isinstance(v, (str, Path)) or not str(v):
        raise _err(ctx["_name"], v, "'auto' or a path")
    return v


def _writable(kind: str, allowed: str) -> Check:
    """'auto' or a path the run can write as `kind` ('folder': an existing one or one it can create; 'file': not a
    folder, its folder writable or creatable): checked before the run, so a run never fails at its last write."""
    def check(v, ctx):
        v = path_or_auto(v, ctx)
        if v != "auto":
            try:
                (paths.check_output_dir if kind == "folder" else paths.check_output_file)(v, ctx["_name"], allowed)
            except InputError as e:
                raise ParameterError(str(e)) from None
        return v

    return check


folder_or_auto = _writable("folder", "'auto' or a folder you can write to, existing or to be created")
file_or_auto = _writable("file", "'auto' or the path of a results file (.csv)")


def name_list(v, ctx) -> list[str]:
    """A comma-separated string (or a list) of names -> list of stripped names."""
    if isinstance(v, (list, tuple)):
        return [str(x).strip() for x in v if str(x).strip()]
    if isinstance(v, str):
        return [x.strip() for x in v.split(",") if x.strip()]
    raise _err(ctx["_name"], v, "a comma-separated string or a list of names")


def subset_or_all(allowed) -> Check:
    """'all' or a non-empty comma-separated subset of `allowed` -> tuple in the order given."""

    def check(v, ctx):
        if v == "all":
            return tuple(allowed)
        items = name_list(v, ctx)
        if not items or any(x not in allowed for x in items):
            raise _err(ctx["_name"], v, f"'all' or a comma-separated subset of {list(allowed)}")
        return tuple(items)

    return check


def device_memory(device: torch.device) -> int:
    """Bytes the device holds: a GPU's memory, a CPU's physical RAM (0 when unknown: nothing is refused then)."""
    if device.type == "cuda":
        return int(torch.cuda.get_device_properties(device).total_memory)
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0


def check_fits(name: str, value, per_unit: int, device: torch.device, unit: str, base: int = 0) -> None:
    """Refuse `value` units of `per_unit` bytes each (plus `base`) when they cannot fit on `device`, before anything is
    allocated: an estimate from the preset's shapes, so that a size far past the device fails here in a line, not in
    the allocator minutes later. Sizes close to the limit still run (the estimate is a floor, not a promise)."""
    have = device_memory(device)
    if not have or isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        return
    if base + int(value) * per_unit > have:
        most = max(0, (have - base) // max(per_unit, 1))
        raise ParameterError(f"{name}={value!r} is not allowed on {device}: it needs at least "
                             f"{(base + int(value) * per_unit) / 2**30:.3g} GiB ({per_unit / 2**20:.3g} MiB a {unit}) "
                             f"and the device holds {have / 2**30:.3g} GiB; allowed values: at most {most} here")


# --- the common parameters ------------------------------------------------------------------------------------


def _device(v, ctx):
    try:
        return resolve_device(v)
    except ValueError as e:
        raise ParameterError(str(e)) from None


def _preset(v, ctx):
    wl, dev = ctx["workload"], ctx["device"]
    if v == "auto":
        return wl.presets[wl.real_preset if dev.type == "cuda" else wl.tiny_preset]
    if v not in wl.presets:
        raise ParameterError(f"preset={v!r} is not allowed for workload {wl.name!r}; allowed values: "
                             f"{['auto', *wl.presets]}")
    p = wl.presets[v]
    if dev.type == "cpu" and not p.tiny:
        raise ParameterError(f"preset={v!r} is a real-shape preset and needs a GPU; on a CPU use 'auto' or "
                             f"{[k for k, q in wl.presets.items() if q.tiny]}")
    return p


def _dtype_name(v, ctx) -> torch.dtype | None:
    if v == "auto":
        return None
    if v not in DTYPES:
        raise _err(ctx["_name"], v, str(["auto", *DTYPES]))
    dt = DTYPES[v]
    if ctx["device"].type == "cpu" and dt == torch.float16:
        raise ParameterError(f"{ctx['_name']}='fp16' is not allowed on a CPU; allowed values there: "
                             f"['auto', 'fp32', 'bf16']")
    return dt


def _dtype(v, ctx):
    dt = _dtype_name(v, ctx)
    return dt if dt is not None else (torch.bfloat16 if ctx["device"].type == "cuda" else torch.float32)


def _eager_dtype(v, ctx):
    dt = _dtype_name(v, ctx)
    if dt is not None:
        return dt
    return DTYPES[ctx["workload"].eager_dtype] if ctx["device"].type == "cuda" else torch.float32


def _vae_dtype(v, ctx):
    dt = _dtype_name(v, ctx)
    return dt if dt is not None else ctx["workload"].default_vae_dtype(ctx.get("dtype", torch.float32))


DEVICE = Param("device", "auto", _device, "auto | cpu | cuda | cuda:N")
PRESET = Param("preset", "auto", _preset, "auto: the workload's tiny preset on a CPU, its real one on a GPU")


@dataclass(frozen=True)
class WeightsFile:
    """A world-weights file a run uses in place of its preset's shipped one (the `weights` parameter): where it is,
    its SHA-256 and the commit it was trained at (from its provenance JSON), what a results row records of it."""

    path: Path
    sha256: str
    git_commit: str | None

    def __str__(self) -> str:
        return f"{self.path} (sha256 {self.sha256[:16]}, trained at {self.git_commit or 'an unknown commit'})"


def _weights(v, ctx):
    if v == "auto":
        return None
    if not isinstance(v, (str, Path)) or not str(v):
        raise _err("weights", v, "'auto' or the path of a world-weights .pt file")

    preset = ctx["preset"]
    if not is_world_preset(preset):
        raise ParameterError(f"weights={v!r} applies to the trained world presets only; preset {preset.name!r} has "
                             f"random weights: leave it at 'auto'")
    path = Path(v).expanduser().resolve()
    try:
        check_weights_file(path, preset, ctx["workload"])
    except (FileNotFoundError, ValueError) as e:
        raise ParameterError(f"weights={v!r} is not allowed ({e}); allowed values: 'auto' (the shipped weights) or "
                             f"the path of a world-weights .pt file of preset {preset.name!r}") from None
    meta = path.with_name(path.name + ".json")
    commit = json.loads(meta.read_text()).get("git_commit") if meta.is_file() else None
    return WeightsFile(path, file_sha256(path), commit)


WEIGHTS = Param("weights", "auto", _weights, "trained world presets: auto: the shipped data/weights/<preset>.pt | the "
                "path of another world-weights .pt of the preset (e.g. a run just trained), recorded with its sha256")
DTYPE = Param("dtype", "auto", _dtype, "auto: bf16 on a GPU, fp32 on a CPU | fp32 | bf16 | fp16")
# notebook 01's: its run is the eager baseline every later notebook's speedup divides, so on a GPU it takes the
# precision upstream runs the workload in (Workload.eager_dtype)
EAGER_DTYPE = Param("dtype", "auto", _eager_dtype,
                    "auto: on a GPU the precision upstream runs the workload eagerly (mg2 bf16, wma fp32), fp32 on a "
                    "CPU | fp32 | bf16 | fp16")
VAE_DTYPE = Param("vae_dtype", "auto", _vae_dtype, "auto: the workload's rule | fp32 | bf16 | fp16")
WARMUP = Param("warmup", 1, integer(0), "untimed runs before timing")
REPEATS = Param("repeats", 3, integer(1), "timed runs")
SEED = Param("seed", 0, integer(0))
OUTPUT_DIR = Param("output_dir", "auto", folder_or_auto, "auto: reports/artifacts/NOTEBOOK/PRESET-DEVICE")
RESULTS_PATH = Param("results_path", "auto", file_or_auto,
                     "auto: data/results/results.csv for real presets, reports/results/results-tiny.csv for tiny")
