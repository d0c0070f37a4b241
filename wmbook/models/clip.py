"""The CLIP image encoder behind Matrix-Game-2's visual context (257 x 1280 tokens).

Wan / Matrix-Game-2 use the OpenCLIP ViT-H/14 visual tower and take the tokens *before* its last
transformer block (Wan's `use_31_block=True`: the output of block 31 of 32, no final layer norm).
Here that tower is transformers' `CLIPVisionModel` built from a `CLIPVisionConfig` with seeded
random weights (nothing is downloaded). In transformers' terms the features are
`hidden_states[-2]` of the full model; we get exactly that more cheaply by dropping the last encoder
layer (its output is never used) and returning `last_hidden_state` (CLIP's encoder has no final
norm; `post_layernorm` only touches the pooled token). `drop_last_layer=False` keeps all layers and
reads `hidden_states[-2]` instead (same numbers; tested).

Real weights: `ClipImageEncoder.load_pretrained(path)` loads a local checkpoint in transformers'
CLIP layout (a `save_pretrained` directory of a CLIPVisionModel / CLIPModel such as
laion/CLIP-ViT-H-14-laion2B-s32B-b79K, or a .safetensors / .pt state dict with the same key names).
Wan's own `models_clip_open-clip-xlm-roberta-large-vit-huge-14.pth` uses OpenCLIP names and would
need a key conversion first; it is not done here.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn
from transformers import CLIPVisionConfig, CLIPVisionModel

from .checkpoint import read_state_dict

__all__ = [
    "CLIP_MEAN",
    "CLIP_STD",
    "clip_vision_config",
    "clip_dim",
    "clip_tokens",
    "ClipImageEncoder",
]

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def clip_vision_config(preset: str) -> CLIPVisionConfig:
    """"real": OpenCLIP ViT-H/14 (1280 wide, 32 layers, 16 heads, patch 14, 224 px -> 257 tokens).
    "tiny": 32 wide, 2 layers, 2 heads, patch 14, 28 px -> 5 tokens (for CPU tests)."""
    if preset == "real":
        kw = dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=16,
                  patch_size=14, image_size=224, projection_dim=1024)
    elif preset == "tiny":
        kw = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
                  patch_size=14, image_size=28, projection_dim=32)
    else:
        raise ValueError(f"unknown CLIP preset {preset!r} (expected 'real' or 'tiny')")
    return CLIPVisionConfig(hidden_act="gelu", layer_norm_eps=1e-5, attn_implementation="sdpa", **kw)


def _as_config(config: str | CLIPVisionConfig) -> CLIPVisionConfig:
    return clip_vision_config(config) if isinstance(config, str) else config


def clip_dim(config: str | CLIPVisionConfig) -> int:
    """Width of the visual tokens (the DiT's img_emb in_dim): 1280 real, 32 tiny."""
    return _as_config(config).hidden_size


def clip_tokens(config: str | CLIPVisionConfig) -> int:
    """Number of visual tokens: (image_size / patch_size)^2 + 1 class token = 257 real, 5 tiny."""
    c = _as_config(config)
    return (c.image_size // c.patch_size) ** 2 + 1


def _tower(model: CLIPVisionModel) -> nn.Module:
    # transformers < 5 wraps the tower as `.vision_model`; 5.x puts its parts on the model itself
    return getattr(model, "vision_model", model)


class ClipImageEncoder(nn.Module):
    """image [B, 3, H, W] in [-1, 1] -> penultimate-block CLIP tokens [B, clip_tokens, clip_dim].

    The image is resized to `image_size` (bicubic, antialiased; skipped when already that size),
    mapped to [0, 1] and CLIP-normalised in fp32, then cast to the model's dtype.
    """

    def __init__(
        self,
        config: str | CLIPVisionConfig = "real",
        dtype: torch.dtype = torch.float32,
        device="cpu",
        seed: int = 0,
        drop_last_layer: bool = True,
    ):
        super().__init__()
        self.config = _as_config(config)
        self.clip_dim = clip_dim(self.config)
        self.clip_tokens = clip_tokens(self.config)
        self.image_size = int(self.config.image_size)
        self.drop_last_layer = bool(drop_last_layer)
        # seeded init on the CPU in fp32 (same weights on every device), global RNG untouched
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = CLIPVisionModel(self.config)
        if self.drop_last_layer:
            enc = _tower(model).encoder
            enc.layers = enc.layers[:-1]
        self.model = model
        self._norm_cache: dict = {}
        self.to(device=device, dtype=dtype)
        self.eval()
        self.requires_grad_(False)

    @property
    def dtype(self) -> torch.dtype:
        return next(self.model.parameters()).dtype

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _norm(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        key = str(device)
        if key not in self._norm_cache:
            mean = torch.tensor(CLIP_MEAN, dtype=torch.float32).view(1, 3, 1, 1).to(device)
            std = torch.tensor(CLIP_STD, dtype=torch.float32).view(1, 3, 1, 1).to(device)
            self._norm_cache[key] = (mean, std)
        return self._norm_cache[key]

    def preprocess(self, image: torch.Tensor) -> torch.Tensor:
        """[-1, 1] image -> CLIP pixel_values at image_size, in the model's dtype."""
        if image.dim() != 4 or image.shape[1] != 3:
            raise ValueError(f"expected image [B, 3, H, W], got {tuple(image.shape)}")
        x = image.to(device=self.device, dtype=torch.float32)
        s = self.image_size
        if tuple(x.shape[-2:]) != (s, s):
            x = F.interpolate(x, size=(s, s), mode="bicubic", align_corners=False, antialias=True)
        mean, std = self._norm(x.device)
        x = (x * 0.5 + 0.5 - mean) / std
        return x.to(self.dtype)

    @torch.no_grad()
    def forward(self, image: torch.Tensor) -> torch.Tensor:
        pixel_values = self.preprocess(image)
        if self.drop_last_layer:
            return self.model(pixel_values=pixel_values).last_hidden_state
        return self.model(pixel_values=pixel_values, output_hidden_states=True).hidden_states[-2]

    def load_pretrained(self, path: str | os.PathLike) -> "ClipImageEncoder":
        """Load real weights from a local checkpoint (never downloads). Optional; untested with real weights.

        `path`: a transformers `save_pretrained` directory (CLIPVisionModel or CLIPModel; the vision
        tower is taken), or a .safetensors / .pt / .bin state dict in transformers' CLIP key layout
        (a leading "vision_model." is handled either way; text-tower / projection keys are ignored).
        Shapes must match this encoder's config (use the "real" preset for ViT-H/14).
        """
        path = Path(path)
        if path.is_dir():
            src = CLIPVisionModel.from_pretrained(str(path), local_files_only=True)
            sd = src.state_dict()
        else:
            sd = read_state_dict(path)
            sd = sd.get("state_dict", sd)
        own = self.model.state_dict()
        own_prefixed = any(k.startswith("vision_model.") for k in own)
        mapped = {}
        for k, v in sd.items():
            base = k[len("vision_model."):] if k.startswith("vision_model.") else k
            key = ("vision_model." + base) if own_prefixed else base
            if key in own:
                mapped[key] = v
        missing = [k for k in own if k not in mapped and not k.endswith("position_ids")]
        if missing:
            raise KeyError(f"checkpoint {path} lacks {len(missing)} CLIP vision keys, e.g. {missing[:5]}")
        dtype, device = self.dtype, self.device
        self.model.load_state_dict({k: v.to(device=device, dtype=dtype) for k, v in mapped.items()}, strict=False)
        return self
