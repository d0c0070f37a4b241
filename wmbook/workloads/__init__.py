"""Workloads as objects: everything the notebooks need to know about one world model, in one place.

A `Workload` builds its reference pipeline and answers every workload-specific question the notebooks,
variants, the ladder and the breakdown ask: its presets, its own run parameters, the forward probe, the
end-to-end run and its metric, the decoder, the compile regions, the label names, the FLOPs of a forward,
the units. Code outside this package never branches on a workload's name; it asks the object.

    from wmbook import workloads
    wl = workloads.get("mg2")            # or "wma"
    pipe = wl.reference_pipeline(wl.presets["tiny"], torch.device("cpu"))
    probe = wl.forward_probe(pipe)       # one steady denoiser forward on seeded inputs
    e2e = wl.end_to_end(pipe, seed=0, size=E2ESize(blocks=2, ddim_steps=3))

Workloads: `mg2` (wmbook.workloads.mg2: Matrix-Game-2 / Self-Forcing causal DiT, KV caches, streaming Wan VAE),
`wma` (wmbook.workloads.wma: UnifoLM-WMA video UNet, DDIM, SD VAE) and `motion` (wmbook.workloads.motion: the per-step
reference-motion fetch of thousands of simulated robots). Which notebooks a workload runs follows from its features:
a notebook's NotebookSpec requires some (the world-model notebooks a `denoiser`, notebook 07 `motion`).
"""

from __future__ import annotations

from .base import DecoderStep, E2ESize, EndToEnd, GraphTarget, Labels, Layout, Metric, Probe, Workload

_REGISTRY: dict[str, Workload] = {}


def _load() -> None:
    if not _REGISTRY:
        from .mg2 import Mg2Workload  # noqa: PLC0415  heavy: diffusers, transformers; circle via wmbook.train
        from .motion import MotionWorkload  # noqa: PLC0415  heavy: pandas (wmbook.motion)
        from .wma import WMAWorkload  # noqa: PLC0415  heavy: diffusers, transformers; circle via wmbook.train

        for wl in (Mg2Workload(), WMAWorkload(), MotionWorkload()):
            _REGISTRY[wl.name] = wl


def all_workloads() -> list[Workload]:
    _load()
    return list(_REGISTRY.values())


def names() -> list[str]:
    _load()
    return list(_REGISTRY)


def get(name) -> Workload:
    """The workload `name` (a Workload is returned as is); ValueError lists the allowed names."""
    if isinstance(name, Workload):
        return name
    _load()
    if name not in _REGISTRY:
        raise ValueError(f"workload={name!r} is not allowed; allowed values: {list(_REGISTRY)}")
    return _REGISTRY[name]


def for_preset(preset_name: str) -> Workload:
    """The workload a preset belongs to."""
    for wl in all_workloads():
        if preset_name in wl.presets:
            return wl
    raise ValueError(f"preset={preset_name!r} is not known; allowed values: "
                     f"{sorted(p for wl in all_workloads() for p in wl.presets)}")


__all__ = ["DecoderStep", "E2ESize", "EndToEnd", "GraphTarget", "Labels", "Layout", "Metric", "Probe", "Workload",
           "all_workloads", "for_preset", "get",
           "names"]
