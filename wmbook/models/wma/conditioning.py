"""Conditioning encoders of UnifoLM-WMA-0: CLIP image tokens, the image Resampler, the OpenCLIP text tower.

Upstream (`configs/inference/world_model_interaction.yaml`, `modules/encoders/condition.py`,
`modules/encoders/resampler.py`):
- image: FrozenOpenCLIPImageEmbedderV2 returns all 257 tokens (width 1280) of the ViT-H/14 visual tower's last
  block (no ln_post), not the pooled embedding; the Resampler (Perceiver, 16 queries per frame x 16 frames,
  depth 4, 12 heads of 64) turns them into 16 x 16 = 256 tokens of width 1024, 16 per frame;
- text: FrozenOpenCLIPEmbedder, ViT-H/14 text tower (width 1024, 24 layers, 16 heads, 77 tokens), the
  penultimate block's output followed by ln_final ("penultimate").
Both towers here are transformers models with seeded random weights (nothing is downloaded); the text
tokenizer is a byte-level stand-in with OpenCLIP's start/end/pad ids.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from transformers import CLIPTextConfig, CLIPTextModel

from ...presets import WMAPreset
from ..clip import ClipImageEncoder
from .layers import PerceiverAttention, perceiver_feed_forward

SOT_TOKEN, EOT_TOKEN, VOCAB = 49406, 49407, 49408


class ClipImageTokens(ClipImageEncoder):
    """image [B, 3, H, W] in [-1, 1] -> all tokens of the last CLIP block [B, 257, 1280] (upstream V2 embedder)."""

    def __init__(self, config="real", dtype=torch.float32, device="cpu", seed: int = 0):
        super().__init__(config, dtype=dtype, device=device, seed=seed, drop_last_layer=False)

    @torch.no_grad()
    def forward(self, image: torch.Tensor) -> torch.Tensor:
        # CLIP's encoder has no final norm; post_layernorm only touches the pooled token
        return self.model(pixel_values=self.preprocess(image)).last_hidden_state


class Resampler(nn.Module):
    """Perceiver resampler: CLIP tokens [B, N, E] -> [B, num_queries * video_length, output_dim] (upstream names)."""

    def __init__(self, dim: int = 1024, depth: int = 8, dim_head: int = 64, heads: int = 16, num_queries: int = 8,
                 embedding_dim: int = 768, output_dim: int = 1024, ff_mult: int = 4, video_length: int | None = None):
        super().__init__()
        n = num_queries * (video_length or 1)  # num_queries per frame
        self.latents = nn.Parameter(torch.randn(1, n, dim) / dim**0.5)
        self.proj_in = nn.Linear(embedding_dim, dim)
        self.proj_out = nn.Linear(dim, output_dim)
        self.norm_out = nn.LayerNorm(output_dim)
        self.layers = nn.ModuleList([
            nn.ModuleList([PerceiverAttention(dim, dim_head, heads), perceiver_feed_forward(dim, ff_mult, "none")])
            for _ in range(depth)
        ])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        latents = self.latents.expand(x.shape[0], -1, -1)
        x = self.proj_in(x)
        for attn, ff in self.layers:
            latents = attn(x, latents) + latents
            latents = ff(latents) + latents
        return self.norm_out(self.proj_out(latents))


def text_config(p: WMAPreset) -> CLIPTextConfig:
    """OpenCLIP ViT-H/14 text tower shapes as a transformers CLIPTextConfig (tiny presets shrink it)."""
    return CLIPTextConfig(vocab_size=VOCAB, hidden_size=p.text_width, intermediate_size=4 * p.text_width,
                          num_hidden_layers=p.text_layers, num_attention_heads=p.text_heads,
                          max_position_embeddings=p.text_len, hidden_act="gelu", layer_norm_eps=1e-5,
                          bos_token_id=SOT_TOKEN, eos_token_id=EOT_TOKEN, pad_token_id=0,
                          projection_dim=p.text_width, attn_implementation="sdpa")


class OpenClipTextEncoder(nn.Module):
    """prompts -> penultimate-block tokens after the final LayerNorm [B, text_len, width], random weights.

    The last block's output is never used, so it is dropped and `last_hidden_state` (which transformers
    passes through `final_layer_norm`) is exactly upstream's penultimate + ln_final.
    """

    def __init__(self, p: WMAPreset, device="cpu", dtype: torch.dtype = torch.float32, seed: int = 0):
        super().__init__()
        self.text_len = p.text_len
        # seeded init directly on the target device (354 M parameters at real shape); CPU RNG left untouched
        with torch.random.fork_rng(devices=[]), torch.device(device):
            torch.manual_seed(seed)
            model = CLIPTextModel(text_config(p))
        enc = getattr(model, "text_model", model).encoder
        enc.layers = enc.layers[:-1]
        self.model = model.to(dtype)
        self.eval()
        self.requires_grad_(False)

    def tokenize(self, prompts: list[str], device) -> torch.Tensor:
        """Byte-level stand-in for open_clip.tokenize: [SOT, bytes..., EOT, 0...] of length text_len."""
        ids = torch.zeros(len(prompts), self.text_len, dtype=torch.long)
        for i, text in enumerate(prompts):
            body = [256 + b for b in text.encode("utf-8")][: self.text_len - 2]
            toks = [SOT_TOKEN, *body, EOT_TOKEN]
            ids[i, : len(toks)] = torch.tensor(toks)
        return ids.to(device)

    @torch.no_grad()
    def forward(self, prompts: list[str] | str) -> torch.Tensor:
        prompts = [prompts] if isinstance(prompts, str) else list(prompts)
        dev = next(self.model.parameters()).device
        return self.model(input_ids=self.tokenize(prompts, dev)).last_hidden_state
