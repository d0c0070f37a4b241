"""The action / state head of UnifoLM-WMA-0: a diffusion-policy ConditionalUnet1D fed with video-UNet features.

Upstream: `src/unifolm_wma/models/diffusion_head/conditional_unet1d.py` with the inference config
(`use_linear_act_proj=True`, `cond_predict_scale=True`, `cond_cross_attention=False`): each of the
T = horizon steps of a sample is one row, its D action dims are the 1-D UNet's channels and a
Linear(1 -> act_proj_dim) lifts every value to a length-act_proj_dim signal (32 -> 16 -> 8 -> 4).
Every residual block is FiLM-conditioned per row on
  [diffusion-step embedding | observation encoding (ResNet-18 + spatial softmax, n_obs frames) |
   spatial-softmax keypoints of one video-UNet feature map of that frame].
The nine feature maps (4 encoder levels, middle, 4 decoder levels) come from `WMAModel.forward`.
"""

from __future__ import annotations

import torch
import torch.nn as nn

from ...presets import WMAPreset
from .layers import sinusoidal_pos_emb


def spatial_softmax_of_feature(levels: int) -> list[int]:
    """Which of the `levels` unique spatial-softmax blocks reads each of the 2*levels+1 UNet features.

    Features: each encoder level, the middle block, each decoder level; upstream keeps a 9-entry ModuleList
    whose entries 4..8 are the same modules as 3, 3, 2, 1, 0 (mapping.py folds them).
    """
    return list(range(levels)) + [levels - 1] + list(range(levels - 1, -1, -1))

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


class SinusoidalPosEmb(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x):
        return sinusoidal_pos_emb(x, self.dim)


class Conv1dBlock(nn.Module):
    """Conv1d -> GroupNorm -> Mish."""

    def __init__(self, cin: int, cout: int, kernel_size: int, n_groups: int = 8):
        super().__init__()
        self.block = nn.Sequential(nn.Conv1d(cin, cout, kernel_size, padding=kernel_size // 2),
                                   nn.GroupNorm(n_groups, cout), nn.Mish())

    def forward(self, x):
        return self.block(x)


class Downsample1d(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.conv = nn.Conv1d(dim, dim, 3, 2, 1)

    def forward(self, x):
        return self.conv(x)


class Upsample1d(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.conv = nn.ConvTranspose1d(dim, dim, 4, 2, 1)

    def forward(self, x):
        return self.conv(x)


class ConditionalResidualBlock1D(nn.Module):
    """Two Conv1dBlocks with a FiLM (per-channel scale and bias) from the row's condition in between."""

    def __init__(self, cin: int, cout: int, cond_dim: int, kernel_size: int = 3, n_groups: int = 8):
        super().__init__()
        self.out_channels = cout
        self.blocks = nn.ModuleList([Conv1dBlock(cin, cout, kernel_size, n_groups),
                                     Conv1dBlock(cout, cout, kernel_size, n_groups)])
        self.cond_encoder = nn.Sequential(nn.Mish(), nn.Linear(cond_dim, cout * 2))
        self.residual_conv = nn.Conv1d(cin, cout, 1) if cin != cout else nn.Identity()

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> torch.Tensor:
        # x [(B T), C_in, L]; cond [B, T, cond_dim]
        out = self.blocks[0](x)
        film = self.cond_encoder(cond).reshape(-1, 2, self.out_channels, 1)  # [(B T), 2, C_out, 1]
        out = film[:, 0] * out + film[:, 1]
        out = self.blocks[1](out)
        return out + self.residual_conv(x)


class SpatialSoftmax(nn.Module):
    """1x1 conv to K maps, softmax over positions, expected (x, y) per map: [N, C, h, w] -> [N, K, 2] (robomimic)."""

    def __init__(self, channels: int, height: int, width: int, num_kp: int):
        super().__init__()
        self.height, self.width, self.num_kp = height, width, num_kp
        self.nets = nn.Conv2d(channels, num_kp, kernel_size=1)
        self.register_buffer("temperature", torch.ones(1))
        pos_x, pos_y = torch.meshgrid(torch.linspace(-1.0, 1.0, width), torch.linspace(-1.0, 1.0, height),
                                      indexing="xy")  # [h, w] each, x varies along w
        self.register_buffer("pos_x", pos_x.reshape(1, height * width))
        self.register_buffer("pos_y", pos_y.reshape(1, height * width))

    def forward(self, feature: torch.Tensor) -> torch.Tensor:
        f = self.nets(feature).reshape(-1, self.height * self.width)  # [N*K, h*w]
        attn = torch.softmax(f / self.temperature, dim=-1)
        xy = torch.cat([(self.pos_x * attn).sum(1, keepdim=True), (self.pos_y * attn).sum(1, keepdim=True)], dim=1)
        return xy.view(-1, self.num_kp, 2)


class BasicBlock(nn.Module):
    """ResNet basic block with GroupNorm (torchvision names; `bn*` hold GroupNorms as upstream swaps them in)."""

    def __init__(self, cin: int, cout: int, stride: int = 1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.GroupNorm(cout // 16, cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.GroupNorm(cout // 16, cout)
        self.downsample = None
        if stride != 1 or cin != cout:
            self.downsample = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.GroupNorm(cout // 16, cout))

    def forward(self, x):
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return self.relu(out + (x if self.downsample is None else self.downsample(x)))


def resnet18_trunk(widths=(64, 128, 256, 512)) -> nn.Sequential:
    """torchvision resnet18 up to layer4 (no pooling / fc), BatchNorm -> GroupNorm(C/16): indices as upstream."""
    w0 = widths[0]
    layers: list[nn.Module] = [nn.Conv2d(3, w0, 7, 2, 3, bias=False), nn.GroupNorm(w0 // 16, w0), nn.ReLU(inplace=True),
                               nn.MaxPool2d(3, 2, 1)]
    cin = w0
    for i, w in enumerate(widths):
        stride = 1 if i == 0 else 2
        layers.append(nn.Sequential(BasicBlock(cin, w, stride), BasicBlock(w, w, 1)))
        cin = w
    return nn.Sequential(*layers)


def resnet18_out_hw(height: int, width: int) -> tuple[int, int]:
    """Spatial size after the trunk: stride-2 stem conv (k7 p3), max-pool (k3 p1), three stride-2 stages (k3 p1)."""

    def down(n: int, k: int, pad: int) -> int:
        return (n + 2 * pad - k) // 2 + 1

    h, w = down(height, 7, 3), down(width, 7, 3)
    for _ in range(4):
        h, w = down(h, 3, 1), down(w, 3, 1)
    return h, w


class ObsEncoder(nn.Module):
    """Observation frames + agent state -> [N, 2*kp + state_dim] (upstream MultiImageObsEncoder, spatial softmax)."""

    def __init__(self, p: WMAPreset, state_dim: int):
        super().__init__()
        self.backbone = resnet18_trunk(p.obs_widths)
        oh, ow = resnet18_out_hw(p.height, p.width)
        self.spatial_softmax = SpatialSoftmax(p.obs_widths[-1], oh, ow, p.obs_spatial_kp)
        self.output_dim = 2 * p.obs_spatial_kp + state_dim
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)

    def forward(self, images: torch.Tensor, agent_pos: torch.Tensor) -> torch.Tensor:
        # images [N, 3, H, W] (upstream feeds the [-1, 1] frames straight into ImageNet normalisation)
        x = (images - self.mean.to(images.dtype)) / self.std.to(images.dtype)
        kp = self.spatial_softmax(self.backbone(x)).flatten(1)  # [N, 2*kp]
        return torch.cat([kp, agent_pos.to(kp.dtype)], dim=-1)


class ConditionalUnet1D(nn.Module):
    """Denoises a [B, T, D] action (or state) chunk, conditioned on video-UNet features and the observation."""

    def __init__(self, p: WMAPreset, input_dim: int):
        super().__init__()
        self.n_obs_steps = p.n_obs_steps
        self.act_proj_dim = p.head_act_proj_dim
        dsed, k, g = p.head_step_embed_dim, p.head_kernel_size, p.head_n_groups
        down = list(p.head_down_dims)
        context_dims = [m * p.model_channels for m in p.channel_mult]
        self.obs_encoder = ObsEncoder(p, p.agent_state_dim)
        self.diffusion_step_encoder = nn.Sequential(SinusoidalPosEmb(dsed), nn.Linear(dsed, dsed * 4), nn.Mish(),
                                                    nn.Linear(dsed * 4, dsed))
        cond_dim = dsed + self.obs_encoder.output_dim * p.n_obs_steps
        in_out = list(zip([input_dim] + down[:-1], down))

        self.down_modules = nn.ModuleList()
        for ind, (din, dout) in enumerate(in_out):
            cur = cond_dim + 2 * context_dims[ind]  # + (x, y) keypoints of that level's C maps
            last = ind == len(in_out) - 1
            self.down_modules.append(nn.ModuleList([
                ConditionalResidualBlock1D(din, dout, cur, k, g), ConditionalResidualBlock1D(dout, dout, cur, k, g),
                nn.Identity(), nn.Identity() if last else Downsample1d(dout)]))
        mid = down[-1]
        self.mid_modules = nn.ModuleList([ConditionalResidualBlock1D(mid, mid, cur, k, g),
                                          ConditionalResidualBlock1D(mid, mid, cur, k, g), nn.Identity()])
        self.up_modules = nn.ModuleList()
        rev = context_dims[::-1]
        for ind, (din, dout) in enumerate(reversed(in_out[1:] + [(down[-1], down[-1])])):
            cur = cond_dim + 2 * rev[ind]
            last = ind == len(in_out) - 1
            self.up_modules.append(nn.ModuleList([
                ConditionalResidualBlock1D(dout + din, din, cur, k, g), ConditionalResidualBlock1D(din, din, cur, k, g),
                nn.Identity(), nn.Identity() if last else Upsample1d(din)]))
        self.final_conv = nn.Sequential(Conv1dBlock(down[0], down[0], k), nn.Conv1d(down[0], input_dim, 1))

        h, w = p.latent_hw
        self.feature_block = spatial_softmax_of_feature(len(context_dims))
        self.spatial_softmax_blocks = nn.ModuleList([
            SpatialSoftmax(cd, h // 2**i, w // 2**i, cd) for i, cd in enumerate(context_dims)])
        a = p.head_act_proj_dim
        self.proj_in_action = nn.Sequential(nn.Linear(1, a), nn.LayerNorm(a))
        self.proj_in_horizon = nn.Sequential(nn.Linear(p.horizon, a), nn.LayerNorm(a))  # unused at inference
        self.proj_out_action = nn.Sequential(nn.LayerNorm(a), nn.Linear(a, 1))
        self.proj_out_horizon = nn.Sequential(nn.LayerNorm(a), nn.Linear(a, p.horizon))  # unused at inference

    def forward(self, sample: torch.Tensor, timestep: torch.Tensor, feats: list[torch.Tensor],
                obs_images: torch.Tensor, obs_states: torch.Tensor) -> torch.Tensor:
        """sample [B, T, D], timestep [B], feats 9 x [B, T, C, h, w], obs_images [B, 3, n_obs, H, W],
        obs_states [B, n_obs, S] -> [B, T, D]."""
        b, t, d = sample.shape
        x = self.proj_in_action(sample.unsqueeze(-1)).reshape(b * t, d, self.act_proj_dim)  # [(B T), D, L]
        imgs = obs_images.transpose(1, 2).flatten(0, 1).to(x.dtype)  # [(B n_obs), 3, H, W]
        obs = self.obs_encoder(imgs, obs_states.flatten(0, 1))  # [(B n_obs), obs_dim]
        obs = obs.reshape(b, 1, -1).expand(b, t, -1)  # [B, T, n_obs*obs_dim]
        enc = self.diffusion_step_encoder  # [SinusoidalPosEmb, Linear, Mish, Linear]
        step = enc[1:](enc[0](timestep.expand(b)).to(x.dtype))[:, None].expand(b, t, -1)  # [B, T, dsed]

        def cond(i: int) -> torch.Tensor:  # [B, T, dsed + n_obs*obs_dim + 2C]
            f = feats[i]
            kp = self.spatial_softmax_blocks[self.feature_block[i]](f.flatten(0, 1))  # [(B T), C, 2]
            return torch.cat([step, obs, kp.reshape(b, t, -1)], dim=-1)

        skips = []
        for i, (res1, res2, _, downsample) in enumerate(self.down_modules):
            c = cond(i)
            x = res2(res1(x, c), c)
            skips.append(x)
            x = downsample(x)
        c = cond(len(self.down_modules))
        x = self.mid_modules[1](self.mid_modules[0](x, c), c)
        for j, (res1, res2, _, upsample) in enumerate(self.up_modules):
            c = cond(len(self.down_modules) + 1 + j)
            x = torch.cat([x, skips.pop()], dim=1)
            x = upsample(res2(res1(x, c), c))
        x = self.final_conv(x)  # [(B T), D, L]
        return self.proj_out_action(x.reshape(b, t, d, self.act_proj_dim)).reshape(b, t, d)
