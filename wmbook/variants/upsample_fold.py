"""A nearest 2x upsampling and the 3 x 3 convolution after it as one transposed convolution (variants
`vae-upsample-fold` for the decoders, `upsample-fold` for the wma UNet).

Both VAE decoders and the wma UNet's up path grow their images by repeating each pixel twice in each direction and
convolving the result with a 3 x 3 kernel (padding 1): the SD VAE's `Upsample2D`, the Wan decoder's resamplers
(`nearest-exact`, the same indices at a factor of 2), the UNet's `Upsample`. Of an output pixel's three input rows, two
are copies of one low-resolution row, so an even output row 2i reads low-resolution rows i-1 (tap -1) and i (taps 0 and
+1 summed), an odd one 2i+1 reads rows i (taps -1 and 0 summed) and i+1 (tap +1); the same holds for columns. That is a
transposed convolution of the low-resolution input with stride 2, padding 1 and a 4 x 4 kernel whose taps are those
sums: each output reads 2 x 2 inputs instead of 3 x 3, so 4/9 of the convolution's multiply-adds, and the upsampled
tensor (4x the input) is never written nor read.

The folded kernel's taps are sums of the original's, made in fp32 and rounded once to the weight's dtype; the outputs
equal the original pair's up to the order of the additions.
"""

from __future__ import annotations

import torch
from torch import nn

# tap k of the transposed kernel (one dimension; PyTorch's transposed indexing: input i reaches output 2i + k - 1) as a
# sum of the 3 x 3 kernel's taps -1, 0, +1 (columns 0, 1, 2): k = 0 carries input m + 1 to output 2m + 1 (tap +1),
# k = 1 input m to 2m (taps 0 and +1), k = 2 input m to 2m + 1 (taps -1 and 0), k = 3 input m - 1 to 2m (tap -1)
_FOLD = torch.tensor([[0.0, 0.0, 1.0],
                      [0.0, 1.0, 1.0],
                      [1.0, 1.0, 0.0],
                      [1.0, 0.0, 0.0]])


def foldable(conv: nn.Module) -> bool:
    """A 2-D convolution the fold reproduces: 3 x 3, stride 1, padding 1 (zeros), no dilation, one group."""
    return (isinstance(conv, nn.Conv2d) and conv.kernel_size == (3, 3) and conv.stride == (1, 1)
            and conv.padding == (1, 1) and conv.dilation == (1, 1) and conv.groups == 1
            and conv.padding_mode == "zeros")


def fold_kernel(weight: torch.Tensor) -> torch.Tensor:
    """A 3 x 3 convolution's weight [out, in, 3, 3] -> the transposed convolution's [in, out, 4, 4] (fp32 sums, in the
    weight's dtype)."""
    m = _FOLD.to(weight.device)
    w4 = torch.einsum("kp,lq,oipq->iokl", m, m, weight.float())
    return w4.to(weight.dtype).contiguous()  # einsum may hand back a permuted view


class NearestUpConv(nn.Module):
    """Nearest 2x upsampling followed by `conv` (3 x 3, padding 1), computed as one stride-2 transposed convolution of
    the low-resolution input. Takes [N, C, H, W], returns [N, C_out, 2H, 2W]."""

    upsamples = True  # an upsampling layer to the models that ask (the wma UNet collects its features after them)

    def __init__(self, conv: nn.Conv2d):
        super().__init__()
        if not foldable(conv):
            raise ValueError(f"NearestUpConv folds a 3 x 3 convolution of stride 1 and padding 1; got {conv}")
        w = conv.weight.detach()
        self.conv = nn.ConvTranspose2d(conv.in_channels, conv.out_channels, 4, stride=2, padding=1,
                                       bias=conv.bias is not None, device=w.device, dtype=w.dtype)
        self.conv.requires_grad_(False)
        folded = fold_kernel(w)
        # the folded kernel keeps the original's layout (channels-last where vae-channels-last put it)
        if w.is_contiguous(memory_format=torch.channels_last) and not w.is_contiguous():
            folded = folded.contiguous(memory_format=torch.channels_last)
        self.conv.weight.data = folded
        if conv.bias is not None:
            self.conv.bias.data = conv.bias.detach().clone()

    def forward(self, x: torch.Tensor, output_size=None, *args, **kwargs) -> torch.Tensor:
        if output_size is not None and tuple(output_size) != (2 * x.shape[-2], 2 * x.shape[-1]):
            raise ValueError(f"output_size={tuple(output_size)} is not allowed; allowed values: None or "
                             f"{(2 * x.shape[-2], 2 * x.shape[-1])} (the fold upsamples by exactly 2)")
        return self.conv(x)


def _is_nearest_x2(up: nn.Module) -> bool:
    if not isinstance(up, nn.Upsample) or up.size is not None or up.mode not in ("nearest", "nearest-exact"):
        return False
    s = up.scale_factor
    return all(float(f) == 2.0 for f in (s if isinstance(s, tuple) else (s, s)))


def _replacement(module: nn.Module, also: tuple[type, ...] = ()) -> nn.Module | None:
    """NearestUpConv for a pair it reproduces: diffusers' Upsample2D (interpolating, with its 3 x 3 convolution, no
    norm), an nn.Sequential of a nearest 2x nn.Upsample and such a convolution (the Wan decoder's resamplers), or an
    instance of `also`: classes whose forward is their `conv` of the input upsampled 2x by nearest neighbours."""
    if also and isinstance(module, also) and foldable(getattr(module, "conv", None)):
        return NearestUpConv(module.conv)
    from diffusers.models.upsampling import Upsample2D  # noqa: PLC0415  heavy: diffusers (the callers' decoders)

    if isinstance(module, Upsample2D):
        conv = getattr(module, "conv", None) if module.name == "conv" else getattr(module, "Conv2d_0", None)
        if (module.use_conv and module.interpolate and not module.use_conv_transpose and module.norm is None
                and foldable(conv)):
            return NearestUpConv(conv)
    if isinstance(module, nn.Sequential) and len(module) == 2 and _is_nearest_x2(module[0]) and foldable(module[1]):
        return NearestUpConv(module[1])
    return None


def fold_upsample_convs(model: nn.Module, also: tuple[type, ...] = ()) -> int:
    """Replace every nearest-2x-upsampling + 3 x 3 convolution pair inside `model` (see _replacement; `also`: the
    model's own upsampling classes) by its NearestUpConv; returns how many were replaced."""
    found = [(name, new) for name, m in model.named_modules() if name and (new := _replacement(m, also)) is not None]
    for name, new in found:
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new)
    return len(found)
