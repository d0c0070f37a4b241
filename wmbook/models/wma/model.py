"""The trainable part of UnifoLM-WMA-0 (upstream `LatentVisualDiffusion` minus its frozen encoders).

`WMAWorldModel` holds the video UNet with its heads (`diffusion_model`, upstream `model.diffusion_model`),
the image Resampler (`image_proj_model`), the state / action MLP projectors and their learned position
embeddings, and builds the cross-attention context [state | action | text | image] the UNet expects.
"""

from __future__ import annotations

import torch
import torch.nn as nn
from diffusers import AutoencoderKL
from transformers import CLIPTextModel, CLIPVisionModel

from ...presets import WMAPreset
from ..clip import clip_dim, clip_vision_config
from .conditioning import Resampler, text_config
from .layers import MLPProjector
from .unet import WMAModel
from .vae import sd_vae_config


class WMAWorldModel(nn.Module):
    """Video UNet + heads, image resampler, state/action projectors (upstream names)."""

    def __init__(self, p: WMAPreset):
        super().__init__()
        if p.text_width != p.context_dim:
            raise ValueError(f"text_width={p.text_width} must equal context_dim={p.context_dim}")
        self.preset = p
        self.diffusion_model = WMAModel(p)
        self.image_proj_model = Resampler(
            dim=p.resampler_dim, depth=p.resampler_depth, dim_head=p.resampler_dim_head, heads=p.resampler_heads,
            num_queries=p.resampler_queries, embedding_dim=clip_dim(p.clip), output_dim=p.context_dim,
            video_length=p.frames)
        self.state_projector = MLPProjector(p.agent_state_dim, p.context_dim)
        self.action_projector = MLPProjector(p.agent_action_dim, p.context_dim)
        self.agent_action_pos_emb = nn.Parameter(torch.randn(1, p.horizon, p.context_dim))
        self.agent_state_pos_emb = nn.Parameter(torch.randn(1, p.n_obs_steps, p.context_dim))

    def embed_image(self, clip_tokens: torch.Tensor) -> torch.Tensor:
        """CLIP tokens [B, 257, 1280] -> image context [B, T*Q, C] (Q tokens per frame)."""
        return self.image_proj_model(clip_tokens.to(self.agent_state_pos_emb.dtype))

    def embed_state(self, states: torch.Tensor) -> torch.Tensor:
        """Observed states [B, n_obs, S] -> [B, n_obs, C]."""
        return self.state_projector(states.to(self.agent_state_pos_emb.dtype)) + self.agent_state_pos_emb

    def embed_action(self, actions: torch.Tensor, zero: bool = False) -> torch.Tensor:
        """Actions [B, T, A] -> [B, T, C]; `zero` = the decision pass (upstream zeroes the whole embedding)."""
        emb = self.action_projector(actions.to(self.agent_action_pos_emb.dtype)) + self.agent_action_pos_emb
        return torch.zeros_like(emb) if zero else emb

    @staticmethod
    def build_context(state: torch.Tensor, action: torch.Tensor, text: torch.Tensor,
                      image: torch.Tensor) -> torch.Tensor:
        """[B, n_obs + T + text_len + T*Q, C]: the order the UNet slices (upstream c_crossattn)."""
        return torch.cat([state, action.to(state.dtype), text.to(state.dtype), image.to(state.dtype)], dim=1)

    def forward(self, x: torch.Tensor, cond_latent: torch.Tensor, x_action: torch.Tensor, x_state: torch.Tensor,
                timesteps: torch.Tensor, context: torch.Tensor, obs_images: torch.Tensor, obs_states: torch.Tensor,
                fs: torch.Tensor | None = None, actions: torch.Tensor | None = None):
        """One denoiser call ('hybrid' conditioning): channel-concat the observation latent, then the UNet.
        actions: the raw actions [B, T, A], for presets with action_embedding (zeros for the decision pass)."""
        xc = torch.cat([x, cond_latent.to(x.dtype)], dim=1)  # [B, 8, T, h, w]
        if actions is None:  # the reference call, argument for argument
            return self.diffusion_model(xc, x_action, x_state, timesteps, context, obs_images, obs_states, fs)
        return self.diffusion_model(xc, x_action, x_state, timesteps, context, obs_images, obs_states, fs, actions)


def _numel(module: nn.Module) -> int:
    return sum(t.numel() for t in module.parameters())


def parameter_counts(p: WMAPreset) -> dict[str, int]:
    """Parameter counts by part, from modules built on the meta device (no memory, no weights)."""
    with torch.device("meta"):
        wm = WMAWorldModel(p)
        vae = AutoencoderKL(**sd_vae_config(p))
        clip = CLIPVisionModel(clip_vision_config(p.clip))
        text = CLIPTextModel(text_config(p))
    dm = wm.diffusion_model
    heads = _numel(dm.action_unet) + _numel(dm.state_unet)
    text_layers = getattr(text, "text_model", text).encoder.layers
    out = {
        "unet": _numel(dm) - heads,  # the video UNet incl. the action-token projector
        "action_head": _numel(dm.action_unet),
        "state_head": _numel(dm.state_unet),
        "image_resampler": _numel(wm.image_proj_model),
        "state_action_projectors": _numel(wm.state_projector) + _numel(wm.action_projector)
        + wm.agent_action_pos_emb.numel() + wm.agent_state_pos_emb.numel(),
        "clip_image_encoder": _numel(clip),
        # the last text block is never run ("penultimate"); counted without it, as built by the pipeline
        "text_encoder": _numel(text) - _numel(text_layers[-1]),
        "vae_encoder": _numel(vae.encoder) + _numel(vae.quant_conv),
        "vae_decoder": _numel(vae.decoder) + _numel(vae.post_quant_conv),
    }
    out["conditioning"] = (out["image_resampler"] + out["state_action_projectors"] + out["clip_image_encoder"]
                           + out["text_encoder"])
    out["world_model"] = _numel(wm)
    return out
