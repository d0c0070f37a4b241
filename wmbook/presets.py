"""Named shapes: tiny presets for the CPU, the real Matrix-Game-2 / Self-Forcing / WMA shapes for the GPU."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import torch


@dataclass(frozen=True)
class ActionConfig:
    """Matrix-Game-2 action modules (keyboard + mouse), upstream `action_config` names."""

    blocks: tuple[int, ...] = tuple(range(15))
    keyboard_dim_in: int = 4
    mouse_dim_in: int = 2
    hidden_size: int = 128
    img_hidden_size: int = 1536
    keyboard_hidden_dim: int = 1024
    mouse_hidden_dim: int = 1024
    heads_num: int = 16
    windows_size: int = 3
    vae_time_compression_ratio: int = 4
    rope_dim_list: tuple[int, int, int] = (8, 28, 28)
    rope_theta: float = 256.0
    qk_norm: bool = True
    qkv_bias: bool = False


@dataclass(frozen=True)
class CausalWanPreset:
    """One block-causal Wan DiT configuration plus its streaming run settings."""

    name: str
    model_type: str  # "i2v" (CLIP image context + cond_concat) or "t2v" (text context)
    height: int  # pixels
    width: int
    num_frame_per_block: int  # latent frames per block
    local_attn_size: int  # latent frames in the attention window; -1 = full causal
    max_latent_frames: int  # capacity of the KV cache when the window is full (-1)
    denoising_steps: tuple[int, ...]  # before warping onto the shifted flow schedule
    default_blocks: int
    dim: int = 1536
    ffn_dim: int = 8960
    num_heads: int = 12
    num_layers: int = 30
    freq_dim: int = 256
    in_dim: int = 36
    out_dim: int = 16
    patch_size: tuple[int, int, int] = (1, 2, 2)
    text_len: int = 512
    text_dim: int = 4096
    clip_dim: int = 1280
    clip_tokens: int = 257
    cross_attn_norm: bool = True
    qk_norm: bool = True
    eps: float = 1e-6
    shift: float = 5.0
    action: ActionConfig | None = None
    vae: str = "real"  # key for wmbook.models.vae.wan_vae_config
    clip: str = "real"  # key for wmbook.models.clip.clip_vision_config
    tiny: bool = False

    @property
    def latent_hw(self) -> tuple[int, int]:
        return self.height // 8, self.width // 8

    @property
    def frame_seqlen(self) -> int:
        h, w = self.latent_hw
        return (h // self.patch_size[1]) * (w // self.patch_size[2])

    @property
    def head_dim(self) -> int:
        return self.dim // self.num_heads

    @property
    def forwards_per_block(self) -> int:
        return len(self.denoising_steps) + 1  # + the cache-refresh pass at t=0

    def kv_capacity_frames(self) -> int:
        return self.local_attn_size if self.local_attn_size != -1 else self.max_latent_frames

    def with_(self, **kw) -> "CausalWanPreset":
        return replace(self, **kw)

    def to_dict(self) -> dict:
        return asdict(self)


MG2_ACTION = ActionConfig()

PRESETS: dict[str, CausalWanPreset] = {
    # Same code paths as mg2-universal at toy width: 2 blocks of 3 frames, window 6 (eviction from block 2).
    "tiny": CausalWanPreset(
        name="tiny", model_type="i2v", height=64, width=64, num_frame_per_block=3, local_attn_size=6,
        max_latent_frames=12, denoising_steps=(1000, 666, 333), default_blocks=3,
        dim=64, ffn_dim=128, num_heads=4, num_layers=2, freq_dim=32, text_len=8, text_dim=32,
        clip_dim=32, clip_tokens=5,
        action=ActionConfig(blocks=(0,), hidden_size=8, img_hidden_size=64, keyboard_hidden_dim=32,
                            mouse_hidden_dim=32, heads_num=2, rope_dim_list=(4, 6, 6)),
        vae="tiny", clip="tiny", tiny=True,
    ),
    "tiny-sf": CausalWanPreset(
        name="tiny-sf", model_type="t2v", height=64, width=64, num_frame_per_block=3, local_attn_size=-1,
        max_latent_frames=9, denoising_steps=(1000, 750, 500, 250), default_blocks=3,
        dim=64, ffn_dim=128, num_heads=4, num_layers=2, freq_dim=32, in_dim=16, text_len=8, text_dim=32,
        vae="tiny", clip="tiny", tiny=True,
    ),
    "mg2-universal": CausalWanPreset(
        name="mg2-universal", model_type="i2v", height=352, width=640, num_frame_per_block=3,
        local_attn_size=6, max_latent_frames=15, denoising_steps=(1000, 666, 333), default_blocks=6,
        action=MG2_ACTION,
    ),
    "self-forcing": CausalWanPreset(
        name="self-forcing", model_type="t2v", height=480, width=832, num_frame_per_block=3,
        local_attn_size=-1, max_latent_frames=21, denoising_steps=(1000, 750, 500, 250), default_blocks=7,
        in_dim=16,
    ),
}

TINY_FOR = {"mg2-universal": "tiny", "self-forcing": "tiny-sf"}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def get_preset(name: str) -> CausalWanPreset:
    """Look up a preset by name (ValueError lists the known ones)."""
    if name not in PRESETS:
        raise ValueError(f"preset={name!r} is not known; allowed values: {sorted(PRESETS)}")
    return PRESETS[name]


def resolve_device(device: str = "auto") -> torch.device:
    """'auto' -> cuda when present, else cpu; 'cuda' without a GPU is an error."""
    allowed = ("auto", "cpu", "cuda")
    if device not in allowed and not str(device).startswith("cuda:"):
        raise ValueError(f"device={device!r} is not allowed; allowed values: {list(allowed)} or 'cuda:N'")
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device={device!r} asked for, but torch sees no CUDA GPU; use device='cpu' or 'auto'")
    return torch.device(device)


def resolve_preset(name: str, device: torch.device, real_default: str = "mg2-universal") -> str:
    """'auto' -> the real preset on a GPU, its tiny twin on a CPU; other names are checked."""
    if name == "auto":
        return real_default if device.type == "cuda" else TINY_FOR.get(real_default, "tiny")
    get_preset(name)
    return name


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """'auto' -> bf16 on a GPU, fp32 on a CPU."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if name not in DTYPES:
        raise ValueError(f"dtype={name!r} is not allowed; allowed values: {['auto', *DTYPES]}")
    return DTYPES[name]


def dtype_name(dtype: torch.dtype) -> str:
    return {v: k for k, v in DTYPES.items()}[dtype]
