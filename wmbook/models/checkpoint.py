"""Reading checkpoint files (.safetensors, or .pt/.pth/.ckpt through torch.load with weights_only), and loading a
state dict into a module all or nothing: keys and shapes are checked before any tensor is copied."""

from __future__ import annotations

import pickle
import re
import warnings
import zipfile
from pathlib import Path

import torch
from safetensors.torch import load_file

from ..errors import InputError

CHECKPOINT_FILES = ("a .safetensors file, or a .pt/.pth/.ckpt file that torch.save wrote from tensors and plain "
                    "containers (a state dict)")


class CheckpointFileError(InputError):
    """A file that is not a checkpoint this package loads: missing, cut short, corrupted, or holding pickled Python
    objects that would run code to load. The message names the file and what is wrong; it never suggests loading
    the file with weights_only=False, which would run whatever code a pickle holds."""


def _refused(path, why: str) -> CheckpointFileError:
    return CheckpointFileError(f"{str(path)!r} is not allowed: {why}; allowed values: {CHECKPOINT_FILES}")


def _why_unreadable(path: Path, e: Exception) -> str:
    """What torch.load's or safetensors' error means for the user, in a line (torch's own text advises retrying with
    weights_only=False, which is never the answer for a file one has not made)."""
    text = str(e)
    if isinstance(e, (pickle.UnpicklingError, RuntimeError)) and "GLOBAL" in text:
        found = sorted(set(re.findall(r"GLOBAL ([\w.]+)", text)))
        return (f"it holds pickled Python objects ({', '.join(found)}), not only tensors, and loading them would run "
                f"code from the file")
    if "central directory" in text or "zip archive" in text or isinstance(e, (EOFError, OSError)):
        return "it is cut short or corrupted (not a complete torch.save archive)"
    # a file that is neither a zip archive nor a pickle sends the unpickler through random opcodes, whose failures
    # are of many types (IndexError, KeyError, UnicodeDecodeError, ...) and say nothing to a user
    if isinstance(e, (pickle.UnpicklingError, IndexError, KeyError, ValueError, TypeError)) and not (
            path.is_file() and zipfile.is_zipfile(path)):
        return "it is not a torch checkpoint (its bytes are not a torch.save archive or pickle)"
    if type(e).__name__ == "SafetensorError":
        return f"it is not a valid .safetensors file ({text}: cut short or corrupted)"
    return f"it cannot be read as a checkpoint ({type(e).__name__}: {text.splitlines()[0] if text else ''})"


def read_checkpoint_file(path, map_location="cpu"):
    """The content of a checkpoint file: safetensors' load_file for .safetensors, else torch.load with
    weights_only=True. A file that is missing, a folder, empty, cut short, corrupted or holding pickled code raises
    CheckpointFileError naming it (a ValueError)."""
    path = Path(path)
    if not path.exists():
        raise _refused(path, "no such file")
    if path.is_dir():
        raise _refused(path, "it is a folder")
    if path.stat().st_size == 0:
        raise _refused(path, "it is empty")
    try:
        if path.suffix == ".safetensors":
            return load_file(str(path), device=str(map_location))
        with warnings.catch_warnings():  # "Detected pickle protocol 4": a note for torch's developers, not for users
            warnings.filterwarnings("ignore", message="Detected pickle protocol", category=UserWarning)
            return torch.load(path, map_location=map_location, weights_only=True)
    except (PermissionError, MemoryError):
        raise
    except Exception as e:  # noqa: BLE001  (torch.load and safetensors raise many types for a bad file, OSError too)
        raise _refused(path, _why_unreadable(path, e)) from None


def read_state_dict(sd_or_path, weights_only: bool = True) -> dict:
    """A state dict from a dict or a file (read_checkpoint_file: tensors and plain containers only, a bad file named
    and refused). weights_only=False unpickles any Python object, which runs code the file carries: only for a file
    made on this machine (e.g. a Lightning .ckpt with configuration objects in it); no error message suggests it."""
    if isinstance(sd_or_path, dict):
        return sd_or_path
    if weights_only:
        sd = read_checkpoint_file(sd_or_path)
    else:
        sd = torch.load(str(sd_or_path), map_location="cpu", weights_only=False)
    if not isinstance(sd, dict):
        raise _refused(sd_or_path, f"it holds a {type(sd).__name__}, not a dict of tensors")
    return sd


class CheckpointMismatchError(InputError, RuntimeError):
    """A state dict that does not fit a module; raised before any tensor is copied, so the module is unchanged.

    A ValueError (a bad argument); also a RuntimeError, which is what `nn.Module.load_state_dict` raised before
    the check existed, so callers that catch that keep working."""


_SHOW = 5  # how many keys of each kind an error names


def _listed(kind: str, items: list[str]) -> str:
    more = f", ... ({len(items) - _SHOW} more)" if len(items) > _SHOW else ""
    return f"{len(items)} {kind}: " + ", ".join(items[:_SHOW]) + more


def state_dict_problems(module: torch.nn.Module, state_dict: dict, strict: bool = True) -> dict[str, list[str]]:
    """What stops `state_dict` from loading into `module`, without touching it: "missing" and "unexpected" keys
    (problems only when strict), "shape" mismatches and "not_tensor" values (always problems, as load_state_dict
    refuses them). Dtypes are not compared: load_state_dict converts on copy (a bf16 checkpoint into an fp32
    model is fine). Returns every kind that has entries, so an empty dict means it loads."""
    target = module.state_dict()
    problems: dict[str, list[str]] = {}
    if strict:
        problems["missing"] = [k for k in target if k not in state_dict]
        problems["unexpected"] = [k for k in state_dict if k not in target]
    shape, not_tensor = [], []
    for k, v in state_dict.items():
        t = target.get(k)
        if not isinstance(t, torch.Tensor):  # unexpected (see above) or a module's extra state
            continue
        if not isinstance(v, torch.Tensor):
            not_tensor.append(f"{k} ({type(v).__name__})")
        elif tuple(v.shape) != tuple(t.shape):
            shape.append(f"{k}: checkpoint {tuple(v.shape)} vs model {tuple(t.shape)}")
    problems["shape"], problems["not_tensor"] = shape, not_tensor
    return {kind: keys for kind, keys in problems.items() if keys}


def check_state_dict(module: torch.nn.Module, state_dict: dict, strict: bool = True, what: str = "checkpoint"):
    """Raise one CheckpointMismatchError naming every kind of problem (the first few keys of each and the
    counts) when `state_dict` does not fit `module` (see state_dict_problems); nothing is copied either way."""
    problems = state_dict_problems(module, state_dict, strict)
    if not problems:
        return
    names = {"shape": "shape mismatches", "missing": "missing keys", "unexpected": "unexpected keys",
             "not_tensor": "values that are not tensors"}
    parts = "; ".join(_listed(names[kind], keys) for kind, keys in problems.items())
    hint = "" if strict else " (strict=False allows missing and unexpected keys, never a wrong shape)"
    raise CheckpointMismatchError(f"{what} does not fit {type(module).__name__} (strict={strict}): {parts}{hint}. "
                                  f"Nothing was loaded; the model is unchanged.")


def load_checked(module: torch.nn.Module, state_dict: dict, strict: bool = True, what: str = "checkpoint"):
    """`module.load_state_dict(state_dict, strict)` after check_state_dict: a refused load raises before any
    tensor is copied. Returns load_state_dict's (missing_keys, unexpected_keys)."""
    check_state_dict(module, state_dict, strict, what)
    with torch.no_grad():
        return module.load_state_dict(state_dict, strict=strict)


def describe_keys(sd: dict, limit: int = 8) -> str:
    """The first few keys of a checkpoint and their count, for error messages."""
    keys = [str(k) for k in sd]
    more = f", ... ({len(keys)} keys in all)" if len(keys) > limit else ""
    return "[" + ", ".join(repr(k) for k in keys[:limit]) + more + "]"


GENERATOR, GENERATOR_EMA = "generator", "generator_ema"  # Self-Forcing's checkpoint entries (torch.save'd dict)


def select_generator(sd: dict, use_ema: bool = False) -> dict:
    """The generator weights of a Self-Forcing-style checkpoint: `sd["generator"]`, or `sd["generator_ema"]` when
    use_ema=True, as upstream's inference.py picks them (its --use_ema flag, off by default). A nested
    {"state_dict": ...} or {"model": ...} is looked into; flat "generator_ema.*" keys count as the EMA copy.
    A plain state dict (Matrix-Game-2's .safetensors, a module's own) is returned as it is when use_ema=False.
    Raises ValueError when use_ema=True and there are no EMA weights, or when use_ema=False and there are only
    EMA weights (never a silent switch either way)."""
    top, cur = sd, sd
    for _ in range(4):
        if use_ema and isinstance(cur.get(GENERATOR_EMA), dict):
            return cur[GENERATOR_EMA]
        if not use_ema and isinstance(cur.get(GENERATOR), dict):
            return cur[GENERATOR]
        if not use_ema and isinstance(cur.get(GENERATOR_EMA), dict):
            raise ValueError(f"the checkpoint holds EMA weights ({GENERATOR_EMA!r}) but no {GENERATOR!r} entry; "
                             f"pass use_ema=True to load the EMA weights (keys present: {describe_keys(top)})")
        inner = next((cur[k] for k in ("state_dict", "model") if isinstance(cur.get(k), dict)), None)
        if inner is None:
            break
        cur = inner
    pre = GENERATOR_EMA + "."
    ema = {k[len(pre):]: v for k, v in cur.items() if isinstance(k, str) and k.startswith(pre)}
    if use_ema:
        if ema:
            return ema
        raise ValueError(f"use_ema=True but the checkpoint holds no EMA weights (no {GENERATOR_EMA!r} entry, no "
                         f"{pre!r} keys); keys present: {describe_keys(top)}. Load it with use_ema=False.")
    if ema:
        rest = {k: v for k, v in cur.items() if not (isinstance(k, str) and k.startswith(pre))}
        if not rest:
            raise ValueError(f"the checkpoint holds only EMA weights ({pre!r} keys); pass use_ema=True to load them")
        return rest
    return cur
