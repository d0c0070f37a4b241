"""Tiny-preset checks of the streaming Wan VAE decoder and the CLIP image encoder (CPU, fp32)."""

import inspect

import pytest
import torch
from conftest import _decode_blocks as _stream  # noqa: E402  (tests/ is on sys.path under pytest)

from wmbook.models.clip import ClipImageEncoder, clip_dim, clip_tokens, clip_vision_config
from wmbook.models.vae import (
    StreamingWanDecoder,
    build_wan_vae,
    encode_first_frame,
    normalize_latents,
    pixel_frames_for,
    unnormalize_latents,
    wan_vae_config,
)

pytestmark = pytest.mark.numerics  # rerun with oneDNN and ATen held to older ISAs: `make test-isa`


@pytest.fixture(scope="module")
def vae():
    return build_wan_vae(wan_vae_config("tiny"), torch.float32, "cpu", seed=0)


@pytest.fixture(scope="module")
def latents():
    g = torch.Generator().manual_seed(1)
    return torch.randn(1, 16, 9, 4, 4, generator=g)


@pytest.fixture(scope="module")
def oneshot(vae, latents):
    return vae.decode(unnormalize_latents(vae, latents)).sample




def test_real_vae_config_is_diffusers_default():
    from diffusers import AutoencoderKLWan

    defaults = {k: p.default for k, p in inspect.signature(AutoencoderKLWan.__init__).parameters.items()}
    for k, v in wan_vae_config("real").items():
        assert defaults[k] == v, k
    tiny = wan_vae_config("tiny")
    assert tiny["z_dim"] == 16 and tiny["temperal_downsample"] == [False, True, True]


def test_pixel_frames_for():
    assert pixel_frames_for(1, True) == 1
    assert pixel_frames_for(3, True) == 9
    assert pixel_frames_for(3, False) == 12
    assert pixel_frames_for(0, False) == 0


def test_streaming_decode_matches_oneshot(vae, latents, oneshot, labels_on):
    dec = StreamingWanDecoder(vae)
    outs = _stream(dec, latents, [3, 3, 3])
    assert [o.shape[2] for o in outs] == [9, 12, 12]
    assert [o.shape[2] for o in outs] == [pixel_frames_for(3, i == 0) for i in range(3)]
    full = torch.cat(outs, 2)
    assert full.shape == (1, 3, 1 + 4 * 8, 32, 32) == oneshot.shape
    assert (full - oneshot).abs().max().item() < 1e-5
    assert full.abs().max() <= 1.0
    assert dec.latent_frames_done == 9 and dec.pixel_frames_done == 33

    # reset() -> a second stream (different block split) reproduces the first
    dec.reset()
    assert dec.latent_frames_done == 0 and all(c is None for c in dec.feat_cache)
    again = torch.cat(_stream(dec, latents, [1, 5, 3]), 2)
    assert (again - full).abs().max().item() < 1e-5


def test_staged_decoder_bit_equal_to_plain(vae, latents, labels_on):
    staged = StreamingWanDecoder(vae, stage_labels=True)
    plain = StreamingWanDecoder(vae, stage_labels=False)
    assert staged.stage_labels and not plain.stage_labels
    a = torch.cat(_stream(staged, latents[:, :, :5], [2, 3]), 2)
    b = torch.cat(_stream(plain, latents[:, :, :5], [2, 3]), 2)
    assert torch.equal(a, b)
    for ca, cb in zip(staged.feat_cache, plain.feat_cache):
        assert (ca is None and cb is None) or (isinstance(ca, str) and ca == cb) or torch.equal(ca, cb)


def test_decode_labels_in_profiler(vae, latents, labels_on):
    dec = StreamingWanDecoder(vae)
    dec.decode_block(latents[:, :, :1])
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        dec.decode_block(latents[:, :, 1:3])
    names = {e.key for e in prof.key_averages()}
    for n in ["VAE_Decode_Preprocessing", "VAE_Decode_Frame_1", "VAE_Decode_Frame_2", "VAE_Dec_Conv1",
              "VAE_Dec_Middle_Blocks", "VAE_Dec_Upsample_Blocks", "VAE_Dec_Head", "VAE_Decode_Postprocessing"]:
        assert n in names, n
    assert "VAE_Decode_Frame_0" not in names  # frame index is global to the stream


def test_encode_first_frame(vae):
    g = torch.Generator().manual_seed(2)
    img = torch.rand(2, 3, 32, 32, generator=g) * 2 - 1
    z = encode_first_frame(vae, img, 3)
    assert z.shape == (2, 16, 3, 4, 4)
    video = torch.cat([img.unsqueeze(2), torch.zeros(2, 3, 8, 32, 32)], 2)
    ref = normalize_latents(vae, vae.encode(video).latent_dist.mode())
    assert torch.equal(z, ref)
    assert encode_first_frame(vae, img, 1).shape == (2, 16, 1, 4, 4)


# ---------------------------------------------------------------------------------------------- CLIP


def test_clip_config_dims():
    real = clip_vision_config("real")
    assert (real.hidden_size, real.num_hidden_layers, real.num_attention_heads, real.patch_size) == (1280, 32, 16, 14)
    assert clip_tokens("real") == 257 and clip_dim("real") == 1280
    assert clip_tokens("tiny") == 5 and clip_dim("tiny") == 32


def test_clip_tiny_shapes_and_determinism():
    img = torch.rand(2, 3, 40, 56, generator=torch.Generator().manual_seed(3)) * 2 - 1
    a = ClipImageEncoder("tiny", seed=0)
    b = ClipImageEncoder("tiny", seed=0)
    c = ClipImageEncoder("tiny", seed=1)
    ya, yb, yc = a(img), b(img), c(img)
    assert ya.shape == (2, a.clip_tokens, a.clip_dim) == (2, 5, 32)
    assert torch.equal(ya, yb)
    assert not torch.allclose(ya, yc)
    assert torch.isfinite(ya).all()


def test_clip_penultimate_equals_hidden_states_minus_2():
    img = torch.rand(1, 3, 28, 28, generator=torch.Generator().manual_seed(4)) * 2 - 1
    cut = ClipImageEncoder("tiny", seed=0, drop_last_layer=True)
    full = ClipImageEncoder("tiny", seed=0, drop_last_layer=False)
    torch.testing.assert_close(cut(img), full(img), rtol=0, atol=1e-6)
    # and it is not the last layer's output
    last = full.model(pixel_values=full.preprocess(img)).last_hidden_state
    assert not torch.allclose(cut(img), last)


def test_clip_load_pretrained_roundtrip(tmp_path):
    src = ClipImageEncoder("tiny", seed=5, drop_last_layer=False)
    src.model.save_pretrained(tmp_path / "clip")
    dst = ClipImageEncoder("tiny", seed=0).load_pretrained(tmp_path / "clip")
    img = torch.rand(1, 3, 28, 28, generator=torch.Generator().manual_seed(6)) * 2 - 1
    torch.testing.assert_close(dst(img), src(img), rtol=0, atol=1e-6)
