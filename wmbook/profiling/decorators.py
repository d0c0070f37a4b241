"""The seed's profiling decorators: no-ops without an active ProfilingSession or with profiling off.

Extractors receive the call's arguments without `self`/`cls` (as in the seed).
"""

from __future__ import annotations

import functools
import inspect

import torch

from .config import load_config
from .session import ProfilingSession, current_session, profiling_enabled


def _call_args(fn):
    """A function mapping (args, kwargs) of a call to the extractor's view (args without self/cls)."""
    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):
        params = []
    skip = 1 if params and params[0] in ("self", "cls") else 0
    return lambda args: args[skip:]


def _extract(session, what: str, extractor, args, kwargs) -> dict:
    if extractor is None:
        return {}
    try:
        d = extractor(args, kwargs)
        if not isinstance(d, dict):
            raise TypeError(f"extractor returned {type(d).__name__}, not a dict")
        return d
    except Exception as e:  # a broken extractor must not break the pipeline: note it in the report
        session.errors.append(f"{what} extractor: {type(e).__name__}: {e}")
        return {}


def profile_session(name: str, tags: dict | None = None, config=None):
    """Run the decorated function inside a ProfilingSession (a stage if one is already active)."""
    cfg = load_config(config)  # validate now, not after the expensive call

    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            if not (profiling_enabled() and cfg.enabled):
                return fn(*args, **kwargs)
            s = current_session()
            if s is not None:
                with s.stage(name):
                    return fn(*args, **kwargs)
            with ProfilingSession(name, config=cfg, tags=tags):
                return fn(*args, **kwargs)

        return wrapper

    return deco


def profile_method(stage_name: str | None = None):
    """Time the decorated function as a stage of the current session (named stage_name or the function name)."""

    def deco(fn):
        name = stage_name or fn.__name__

        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            s = current_session()
            if s is None:
                return fn(*args, **kwargs)
            with s.stage(name):
                return fn(*args, **kwargs)

        return wrapper

    return deco


def add_profiling_event(name: str, fn=None):
    """After the call, add event `name` with data fn(result, *args, **kwargs) (args without self)."""
    data_fn = fn

    def deco(f):
        view = _call_args(f)

        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            result = f(*args, **kwargs)
            s = current_session()
            if s is not None:
                data = {}
                if data_fn is not None:
                    try:
                        data = data_fn(result, *view(args), **kwargs) or {}
                        if not isinstance(data, dict):
                            data = {"value": data}
                    except Exception as e:
                        s.errors.append(f"event {name!r} data function: {type(e).__name__}: {e}")
                        data = {"data_error": f"{type(e).__name__}: {e}"}
                s.event(name, **data)
            return result

        return wrapper

    return deco


def profile_diffusion_step(extractor=None):
    """Time the call as session.diffusion_step(step, timestep); extractor(args, kwargs) -> {"step", "timestep"}."""

    def deco(f):
        view = _call_args(f)

        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            s = current_session()
            if s is None:
                return f(*args, **kwargs)
            info = _extract(s, "diffusion step", extractor, view(args), kwargs)
            step = info.get("step", s.diffusion_steps)
            with s.diffusion_step(int(step), info.get("timestep")):
                return f(*args, **kwargs)

        return wrapper

    return deco


def profile_block_computation(extractor=None):
    """Time the call as session.block(index, frames); extractor(args, kwargs) -> {"block_index", "frames"}."""

    def deco(f):
        view = _call_args(f)

        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            s = current_session()
            if s is None:
                return f(*args, **kwargs)
            info = _extract(s, "block", extractor, view(args), kwargs)
            idx = info.get("block_index", info.get("index"))
            if idx is None:
                idx = len(s.timer.blocks) if s.timer is not None else 0
            frames = info.get("frames")
            with s.block(int(idx), frames=None if frames is None else int(frames)):
                return f(*args, **kwargs)

        return wrapper

    return deco


def profile_model_parameters(extractor=None):
    """After the call, note a model: extractor(args, kwargs) -> {"model_name", "parameters_count", "model_type"}
    (without an extractor, an nn.Module returned by the call is counted)."""

    def deco(f):
        view = _call_args(f)

        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            result = f(*args, **kwargs)
            s = current_session()
            if s is not None:
                info = _extract(s, "model parameters", extractor, view(args), kwargs)
                model = info.get("model", result if isinstance(result, torch.nn.Module) else None)
                s.record_model(info.get("model_name", f.__name__), model, info.get("parameters_count"),
                               info.get("model_type"))
            return result

        return wrapper

    return deco
