"""norm-conv-bias / vae-norm-conv-bias: a convolution read only by a fused GroupNorm + SiLU runs without its bias and
the norm kernel adds it (wmbook.variants.fused.fold_conv_bias). The blocks it changes give the fused blocks' outputs
(fp32: within rounding; bf16: within bf16's), the state dict stays as it was, and the variants refuse an order they
cannot serve. The kernels run in Triton's interpreter on a CPU."""

import copy

import pytest
import torch
import torch.nn as nn

from wmbook import variants, workloads
from wmbook.variants import fused
from wmbook.variants.ladder import apply_stack

DEV = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _blocks():
    """One of each block the fold changes, tiny: the UNet's ResBlock (its temporal conv block inside) and diffusers'
    ResnetBlock2D without a time embedding (the SD decoder's)."""
    from diffusers.models.resnet import ResnetBlock2D

    from wmbook.models.wma.unet import ResBlock

    torch.manual_seed(0)
    res = ResBlock(16, 8, 16, temporal_conv=True, dropout=0.0, groups=4)
    sd = ResnetBlock2D(in_channels=16, out_channels=16, temb_channels=None, groups=4)
    for m in (res, sd):  # biases far from 0: an addition left out shows
        for p in m.parameters():
            if p.dim() == 1:
                p.data.uniform_(-1, 1)
    return res.eval().to(DEV), sd.eval().to(DEV)


class _Holder(nn.Module):
    def __init__(self, *mods):
        super().__init__()
        self.mods = nn.ModuleList(mods)


def _fused(dtype):
    res, sd = _blocks()
    holder = _Holder(res, sd).to(dtype)
    fused.fuse_unet(holder)
    fused.fuse_decoder(holder)
    return holder


def _run(holder, dtype):
    res, sd = holder.mods
    g = torch.Generator().manual_seed(1)
    x = torch.randn(1 * 3, 16, 4, 5, generator=g).to(DEV, dtype)  # 1 sample of 3 frames
    emb = torch.randn(1 * 3, 8, generator=g).to(DEV, dtype)
    return res(x, emb, 1).float(), sd(x, None).float()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fold_gives_the_reference_blocks_outputs(dtype):
    """The reference blocks (GroupNorm, SiLU, biased convolutions) against the fused, folded ones."""
    res, sd = _blocks()
    ref = _Holder(res, sd).to(dtype)
    holder = copy.deepcopy(ref)
    fused.fuse_unet(holder)
    fused.fuse_decoder(holder)
    keys, n_params = list(holder.state_dict()), len(list(holder.parameters()))
    folded = copy.deepcopy(holder)
    # ResBlock: in_layers -> out_layers, the temporal block's three Conv3d -> next norm; ResnetBlock2D: conv1 -> norm2
    assert fused.fold_conv_bias(folded) == 5
    assert fused.fold_conv_bias(folded) == 0  # once only: a second call finds every pair done
    assert list(folded.state_dict()) == keys and len(list(folded.parameters())) == n_params
    assert isinstance(folded.mods[1].conv1, fused.BiasFreeConv)
    assert not isinstance(folded.mods[1].conv2, fused.BiasFreeConv)  # read by the residual add, not by a norm
    # the deep copy's norms add the copy's own convolutions' biases
    assert folded.mods[1].norm2.bias_conv is folded.mods[1].conv1
    # bf16: each convolution's output is rounded before its bias is added (the reference rounds once, after it),
    # 2^-8 relative per rounding, a few roundings deep, through normalizations that keep the scale
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    with torch.no_grad():
        outs = _run(folded, dtype)
        for a, b in zip(_run(ref, dtype), outs):
            assert ((a - b).norm() / a.norm()).item() < tol
    if dtype == torch.float32:  # dynamo traces the swapped blocks whole (notebook 06 compiles and captures them)
        torch._dynamo.reset()
        traced = _Holder(*[torch.compile(m, backend="eager", fullgraph=True) for m in folded.mods])
        with torch.no_grad():
            for a, b in zip(outs, _run(traced, dtype)):
                torch.testing.assert_close(a, b)


def test_the_folded_convolution_leaves_out_its_bias_and_the_norm_adds_it():
    holder = _fused(torch.float32)
    sd = holder.mods[1]
    x = torch.randn(1, 16, 4, 4, device=DEV)
    with torch.no_grad():
        with_bias = sd.conv1(x)
        fused.fold_conv_bias(holder)
        without = sd.conv1(x)
        torch.testing.assert_close(with_bias - without, sd.conv1.bias.view(1, -1, 1, 1).expand_as(x),
                                   rtol=1e-5, atol=1e-5)
        n = sd.norm2
        torch.testing.assert_close(sd.norm2(without), torch.ops.wmbook.group_norm_silu(
            with_bias, n.weight, n.bias, n.num_groups, n.eps, None), rtol=1e-5, atol=1e-5)


def test_the_variants_on_the_tiny_wma_stack_and_their_order():
    wl = workloads.get("wma")
    p = wl.presets[wl.tiny_preset]
    pipe = wl.reference_pipeline(p, torch.device("cpu"))
    _, ctx = apply_stack(pipe, wl, ["triton-fused", "norm-conv-bias", "vae-triton-fused", "vae-norm-conv-bias"],
                         torch.device("cpu"))
    assert int(ctx.notes["norm-conv-bias"].split()[0]) >= 4  # at least one ResBlock: its four pairs
    assert int(ctx.notes["vae-norm-conv-bias"].split()[0]) >= 1
    with pytest.raises(ValueError, match="norm-conv-bias found no convolution .* after triton-fused"):
        apply_stack(pipe, wl, ["norm-conv-bias"], torch.device("cpu"))
    with pytest.raises(ValueError, match="vae-norm-conv-bias must come before vae-compile"):
        apply_stack(pipe, wl, ["vae-triton-fused", "vae-compile", "vae-norm-conv-bias"], torch.device("cpu"),
                    compile_backend="eager")
    assert "norm-conv-bias" not in variants.known(workloads.get("mg2"))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="inductor peels the bias off CUDA convolutions only")
def test_the_folded_unet_and_decoder_compiled_equal_their_eager_forms():
    """The swaps under inductor (compiled, as notebook 06 runs them): the same outputs as the eager folded blocks."""
    holder = _fused(torch.bfloat16)
    fused.fold_conv_bias(holder)
    with torch.no_grad():
        a = _run(holder, torch.bfloat16)
        torch._dynamo.reset()
        comp = _Holder(*[torch.compile(m) for m in holder.mods])
        b = _run(comp, torch.bfloat16)
    for x, y in zip(a, b):
        assert ((x - y).norm() / x.norm()).item() < 3e-2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the compiled, captured decode needs a CUDA device")
def test_wma_decoder_ladder_compiled_and_captured_keeps_the_frames():
    """wma's decoder ladder (notebook 06) with the norm kernels and the biases in them, compiled and captured: the
    frames within bf16's rounding over the decoder's layers of the fp32 decoder's (relative L2 under 3e-2, as the
    fold's test), its replays within one bf16 rounding of its first call."""
    wl = workloads.get("wma")
    dev = torch.device("cuda")
    ref = wl.reference_pipeline(wl.presets["tiny-wma"], dev)
    lat = torch.randn(1, 4, 4, *ref.preset.latent_shape[-2:], device="cuda",
                      generator=torch.Generator("cuda").manual_seed(0))
    want = ref.decode(lat).float()
    ladder = wl.decoder_ladder(dev)
    assert ladder.index("vae-norm-conv-bias") == ladder.index("vae-triton-fused") + 1 < ladder.index("vae-compile")
    pipe, ctx = apply_stack(ref, wl, ladder, dev)
    assert int(ctx.notes["vae-norm-conv-bias"].split()[0]) > 0
    first = pipe.decode(lat)
    assert ((first.float() - want).norm() / want.norm()).item() < 3e-2
    for _ in range(2):
        torch.testing.assert_close(pipe.decode(lat), first)
