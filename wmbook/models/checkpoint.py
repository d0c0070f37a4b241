"""Reading checkpoint files: .safetensors, or .pt/.pth/.ckpt through torch.load with weights_only."""

from __future__ import annotations

import torch


def read_state_dict(sd_or_path, weights_only: bool = True) -> dict:
    """A state dict from a dict or a file. weights_only=True (the default) refuses pickled Python objects other
    than tensors and plain containers; pass False only for a checkpoint you trust (e.g. a Lightning .ckpt with
    configuration objects in it)."""
    if isinstance(sd_or_path, dict):
        return sd_or_path
    path = str(sd_or_path)
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file

        return load_file(path)
    try:
        return torch.load(path, map_location="cpu", weights_only=weights_only)
    except Exception as e:
        if weights_only:
            raise ValueError(f"torch.load({path!r}, weights_only=True) failed ({type(e).__name__}: {e}); if you trust "
                             f"this file, load it with weights_only=False") from e
        raise
