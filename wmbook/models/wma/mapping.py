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
embedder.* CLIP, model_ema.* and dp_ema_model.* EMA copies, schedule buffers, cond_pos_emb, ...) belongs to other
modules and is reported as `ignored` (model_ema.* is loaded instead of model.* on request: load_upstream_checkpoint's
use_ema). The VAE and the OpenCLIP towers use other layouts (LDM, OpenCLIP) and are not mapped here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import torch

from ..checkpoint import load_checked, read_state_dict
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
    """What a load did: upstream keys not ours (ignored), and load_state_dict's missing / unexpected keys.
    With use_ema=True: `ema` counts the tensors taken from upstream's `model_ema.*`, `not_ema` names our
    parameters that had no EMA copy and kept the non-EMA weights (as upstream's ema_scope leaves them)."""

    loaded: int
    ignored: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    unexpected: list[str] = field(default_factory=list)
    ema: int = 0
    not_ema: list[str] = field(default_factory=list)


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


EMA_PREFIX = "model_ema."  # upstream LitEma of `model` (the DiffusionWrapper): buffers named without dots
EMA_BOOKKEEPING = ("model_ema.decay", "model_ema.num_updates")


def upstream_ema_key(upstream_key: str) -> str | None:
    """Upstream key under `model.` -> the key of its LitEma copy (LatentDiffusion's `model_ema`, kept when the
    config has use_ema: true): "model.diffusion_model.out.2.weight" -> "model_ema.diffusion_modelout2weight".
    None for keys outside `model.` (image_proj_model.*, the projectors, ...), which upstream keeps no EMA of."""
    if not upstream_key.startswith("model."):
        return None
    return EMA_PREFIX + upstream_key[len("model."):].replace(".", "")


def _read(sd_or_path, weights_only: bool = True) -> dict:
    sd = read_state_dict(sd_or_path, weights_only=weights_only)
    if "state_dict" in sd and isinstance(sd["state_dict"], dict):
        return sd["state_dict"]
    if "module" in sd and isinstance(sd["module"], dict):  # DeepSpeed: upstream strips 16 characters
        return {k[len("_forward_module."):] if k.startswith("_forward_module.") else k: v
                for k, v in sd["module"].items()}
    return sd


def _prefix_counts(keys) -> str:
    counts: dict[str, int] = {}
    for k in keys:
        head = k.split(".", 1)[0] + ("." if "." in k else "")
        counts[head] = counts.get(head, 0) + 1
    return ", ".join(f"{h!r}: {n}" for h, n in sorted(counts.items(), key=lambda kv: -kv[1])[:10])


def _is_own_layout(sd: dict) -> bool:
    """A WMAWorldModel.state_dict() (our names) rather than upstream's: "diffusion_model.*" keys and no
    "model.diffusion_model.*" keys (no upstream key starts with "diffusion_model.")."""
    keys = [k for k in sd if isinstance(k, str)]
    return any(k.startswith(OURS_UNET) for k in keys) and not any(k.startswith(UPSTREAM_UNET) for k in keys)


def load_upstream_checkpoint(model: WMAWorldModel, sd_or_path, strict: bool = True,
                             weights_only: bool = True, use_ema: bool = False) -> LoadReport:
    """Load an upstream checkpoint (path or state dict) into `model`; strict: every parameter present, none extra.
    The file is read with weights_only=True: a Lightning .ckpt that also pickles configuration objects is refused
    (CheckpointFileError naming them); save its state dict as .safetensors or a plain torch.save to load it here.
    A state dict of our own layout (WMAWorldModel.state_dict()) loads too, as it is.

    EMA or not: upstream's Lightning state dict holds the trained weights under `model.diffusion_model.*` (plus
    image_proj_model.*, the projectors and the position embeddings), and, when trained with use_ema, a LitEma
    copy of `model` under `model_ema.*` (names without dots, e.g. "model_ema.diffusion_modelout2weight", plus
    model_ema.decay / num_updates); with dp_use_ema also a `dp_ema_model.*` copy of the action head. Upstream's
    inference (configs/inference/*.yaml: use_ema: False; world_model_interaction.py loads the state dict into
    that model) samples with the non-EMA `model.` weights and never reads dp_ema_model, so use_ema=False (the
    default) loads those and ignores every EMA entry. use_ema=True does what upstream's ema_scope does: each
    parameter of `diffusion_model` takes its `model_ema` copy; buffers, parameters without a copy (reported
    in `not_ema`) and everything outside `model` keep the non-EMA weights. dp_ema_model is never loaded.
    use_ema=True on a checkpoint without `model_ema.*` weights raises ValueError naming what it holds.

    All or nothing: the whole mapped state dict is checked against model.state_dict() (missing and unexpected
    keys, shapes; dtypes convert on copy) before any tensor is copied; a mismatch raises one ValueError
    (wmbook.models.checkpoint.CheckpointMismatchError, also a RuntimeError) that lists what is wrong and
    leaves the model unchanged. strict=False allows missing and unexpected keys, never a wrong shape.
    """
    raw = _read(sd_or_path, weights_only)
    if _is_own_layout(raw):
        if use_ema:
            raise ValueError("use_ema=True but this is a WMAWorldModel state dict of our own layout, which holds "
                             f"no EMA weights (keys by prefix: {_prefix_counts(raw)}); load it with use_ema=False")
        result = load_checked(model, dict(raw), strict=strict, what="WMAWorldModel state dict")
        return LoadReport(loaded=len(raw), missing=list(result.missing_keys),
                          unexpected=list(result.unexpected_keys))
    if not use_ema and any(isinstance(k, str) and k.startswith(EMA_PREFIX) for k in raw) \
            and not any(isinstance(k, str) and k.startswith(UPSTREAM_UNET) for k in raw):
        raise ValueError(f"the checkpoint holds only EMA weights ({EMA_PREFIX!r} keys, no {UPSTREAM_UNET!r} keys; keys "
                         f"by prefix: {_prefix_counts(raw)}); pass use_ema=True to load them. Nothing was loaded")
    ours: dict[str, torch.Tensor] = {}
    ignored = []
    for k, v in raw.items():
        nk = from_upstream_key(k)
        if nk is None:
            ignored.append(k)
        elif nk in ours:
            if not torch.equal(ours[nk], v):
                raise ValueError(f"upstream key {k!r} should repeat the shared block {nk!r} but differs from it")
        else:
            ours[nk] = v
    n_ema, not_ema, used = 0, [], set()
    if use_ema:
        ema = {k: v for k, v in raw.items() if k.startswith(EMA_PREFIX) and k not in EMA_BOOKKEEPING}
        if not ema:
            raise ValueError(f"use_ema=True but the checkpoint holds no EMA weights (no {EMA_PREFIX!r} keys besides "
                             f"decay / num_updates; keys by prefix: {_prefix_counts(raw)}); load it with "
                             f"use_ema=False (upstream's default)")
        params = {k for k, _ in model.named_parameters()}
        for k in model.state_dict():
            if k not in params or not k.startswith(OURS_UNET):
                continue  # buffers and modules outside upstream's `model` have no EMA copy
            found = [ek for ek in map(upstream_ema_key, to_upstream_keys(k)) if ek in ema]
            if not found:
                not_ema.append(k)
                continue
            for ek in found[1:]:  # a folded block: upstream's LitEma holds one copy, but check any repeat
                if not torch.equal(ema[found[0]], ema[ek]):
                    raise ValueError(f"EMA key {ek!r} should repeat the shared block {found[0]!r} but differs")
            ours[k] = ema[found[0]]
            n_ema += 1
            used.update(found)
        if not used:
            raise ValueError(f"use_ema=True but none of the checkpoint's {len(ema)} {EMA_PREFIX!r} keys (e.g. "
                             f"{next(iter(ema))!r}) is the EMA copy of a parameter of this model; nothing was loaded")
        ignored = [k for k in ignored if k not in used and k not in EMA_BOOKKEEPING]
    result = load_checked(model, ours, strict=strict, what="checkpoint (use_ema=True)" if use_ema else "checkpoint")
    return LoadReport(loaded=len(ours), ignored=ignored, missing=list(result.missing_keys),
                      unexpected=list(result.unexpected_keys), ema=n_ema, not_ema=not_ema)
