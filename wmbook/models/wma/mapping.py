"""Upstream UnifoLM-WMA-0 checkpoint <-> `WMAWorldModel` parameter names, and a strict loader.

Upstream's checkpoint is the LightningModule state dict of `LatentVisualDiffusion` (under "state_dict", or a
DeepSpeed {"module": ...} whose keys carry a 16-character "_forward_module." prefix). Our names equal upstream's
except where listed here:

  upstream                                                  ours
  model.diffusion_model.<rest>                              diffusion_model.<rest>
  ....temopral_conv....  (sic, ResBlock)                    ....temporal_conv....
  ...{action,state}_unet.obs_encoder.key_model_map.image.   ...{action,state}_unet.obs_encoder.backbone.
  ...{action,state}_unet.spatial_softmax_blocks.{0..8}      ...spatial_softmax_blocks.{0..3}: upstream's 9 entries
                                                            are 4 modules (entries 4..8 = 3, 3, 2, 1, 0); copies
                                                            must be equal and are folded
  ...obs_encoder._dummy_variable (ModuleAttrMixin, empty)   dropped
  image_proj_model.*, state_projector.*, action_projector.*, agent_action_pos_emb, agent_state_pos_emb: same

Everything else in an upstream checkpoint (first_stage_model.* VAE, cond_stage_model.* text tower,
embedder.* CLIP, model_ema.*, schedule buffers, cond_pos_emb, ...) belongs to other modules and is reported
as `ignored`. The VAE and the OpenCLIP towers use other layouts (LDM, OpenCLIP) and are not mapped here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from ..checkpoint import read_state_dict

from .action_head import spatial_softmax_of_feature
from .model import WMAWorldModel

UPSTREAM_UNET = "model.diffusion_model."
OURS_UNET = "diffusion_model."
SAME_PREFIXES = ("image_proj_model.", "state_projector.", "action_projector.")
SAME_KEYS = ("agent_action_pos_emb", "agent_state_pos_emb")
_HEAD = r"(action_unet|state_unet)"
_SS_UP = re.compile(rf"^{_HEAD}\.spatial_softmax_blocks\.(\d+)\.(.+)$")
_LEVELS = 4  # upstream's 9-entry spatial-softmax list assumes 4 UNet levels


@dataclass
class LoadReport:
    """What a load did: upstream keys not ours (ignored), and load_state_dict's missing / unexpected keys."""

    loaded: int
    ignored: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)


def from_upstream_key(key: str) -> str | None:
    """Upstream key -> our key, or None when it is not a WMAWorldModel parameter (or a dropped placeholder)."""
    if key.startswith(UPSTREAM_UNET):
        rest = key[len(UPSTREAM_UNET):]
        if re.match(rf"^{_HEAD}\.obs_encoder\._dummy_variable$", rest):
            return None
        rest = rest.replace(".temopral_conv.", ".temporal_conv.")
        rest = re.sub(rf"^{_HEAD}\.obs_encoder\.key_model_map\.image\.", r"\1.obs_encoder.backbone.", rest)
        m = _SS_UP.match(rest)
        if m:
            block = spatial_softmax_of_feature(_LEVELS)[int(m[2])]
            rest = f"{m[1]}.spatial_softmax_blocks.{block}.{m[3]}"
        return OURS_UNET + rest
    if key.startswith(SAME_PREFIXES) or key in SAME_KEYS:
        return key
    return None


def to_upstream_keys(key: str) -> list[str]:
    """Our key -> its upstream key(s) (a folded spatial-softmax block has several)."""
    if not key.startswith(OURS_UNET):
        return [key]
    rest = key[len(OURS_UNET):].replace(".temporal_conv.", ".temopral_conv.")
    rest = re.sub(rf"^{_HEAD}\.obs_encoder\.backbone\.", r"\1.obs_encoder.key_model_map.image.", rest)
    m = _SS_UP.match(rest)
    if m:
        entries = [i for i, b in enumerate(spatial_softmax_of_feature(_LEVELS)) if b == int(m[2])]
        return [f"{UPSTREAM_UNET}{m[1]}.spatial_softmax_blocks.{i}.{m[3]}" for i in entries]
    return [UPSTREAM_UNET + rest]


def upstream_state_dict(model: WMAWorldModel) -> dict[str, torch.Tensor]:
    """Our state dict under upstream names (shared spatial-softmax blocks repeated as upstream stores them)."""
    return {uk: v for k, v in model.state_dict().items() for uk in to_upstream_keys(k)}


def _read(sd_or_path, weights_only: bool = True) -> dict:
    sd = read_state_dict(sd_or_path, weights_only=weights_only)
    if "state_dict" in sd and isinstance(sd["state_dict"], dict):
        return sd["state_dict"]
    if "module" in sd and isinstance(sd["module"], dict):  # DeepSpeed: upstream strips 16 characters
        return {k[len("_forward_module."):] if k.startswith("_forward_module.") else k: v
                for k, v in sd["module"].items()}
    return sd


def load_upstream_checkpoint(model: WMAWorldModel, sd_or_path, strict: bool = True,
                             weights_only: bool = True) -> LoadReport:
    """Load an upstream checkpoint (path or state dict) into `model`; strict: every parameter present, none extra.
    Upstream's Lightning .ckpt may hold configuration objects: load it with weights_only=False if you trust it."""
    ours: dict[str, torch.Tensor] = {}
    ignored = []
    for k, v in _read(sd_or_path, weights_only).items():
        nk = from_upstream_key(k)
        if nk is None:
            ignored.append(k)
        elif nk in ours:
            if not torch.equal(ours[nk], v):
                raise ValueError(f"upstream key {k!r} should repeat the shared block {nk!r} but differs from it")
        else:
            ours[nk] = v
    result = model.load_state_dict(ours, strict=strict)
    return LoadReport(loaded=len(ours), ignored=ignored, missing=list(result.missing_keys),
                      unexpected=list(result.unexpected_keys))
