"""Tiny-width checks of the TAEHV decoder: frame counts, streaming equal to one-shot, checkpoint loading (CPU)."""

import pytest
import torch
from conftest import _decode_blocks as _stream  # noqa: E402  (tests/ is on sys.path under pytest)

from wmbook.models.checkpoint import CheckpointMismatchError
from wmbook.models.taehv import (
    MemBlock,
    StreamingTAEHVDecoder,
    TAEHVDecoder,
    TGrow,
    build_taehv,
    load_taehv_decoder,
)
from wmbook.models.vae import WAN21_LATENTS_MEAN, WAN21_LATENTS_STD, pixel_frames_for

pytestmark = pytest.mark.numerics  # rerun with oneDNN and ATen held to older ISAs: `make test-isa`


@pytest.fixture(scope="module")
def dec():
    return build_taehv("tiny", seed=0)


@pytest.fixture(scope="module")
def latents():
    g = torch.Generator().manual_seed(1)
    return torch.randn(2, 16, 9, 4, 4, generator=g)  # [B, C, F, h, w], DiT (normalised) latents


@pytest.fixture(scope="module")
def oneshot(dec, latents):
    return dec.decode_video(latents)




def _upstream_parallel(dec, x):
    """Upstream's apply_model_with_memblocks_parallel + decode_video post-processing, on NTCHW latents."""
    n, t = x.shape[:2]
    x = x.reshape(n * t, *x.shape[2:])
    for b in dec:
        if isinstance(b, MemBlock):
            _x = x.reshape(n, x.shape[0] // n, *x.shape[1:])
            mem = torch.nn.functional.pad(_x, (0, 0, 0, 0, 0, 0, 1, 0))[:, : _x.shape[1]].reshape(x.shape)
            x = b(x, mem)
        elif isinstance(b, TGrow):
            x = b.conv(x).reshape(-1, *x.shape[1:])
        else:
            x = b(x)
    x = x.reshape(n, x.shape[0] // n, *x.shape[1:])
    return x.clamp(0, 1)[:, 3:]  # NTCHW in [0, 1], first t_upscale - 1 frames trimmed


# ------------------------------------------------------------------------------------------- architecture


def test_real_widths_match_upstream_layout():
    with torch.device("meta"):
        real = TAEHVDecoder()
    sd = real.state_dict()
    # upstream TAEHV.decoder (taehv.py): MemBlocks at 3-5, 9-11, 15-17; TGrow at 7, 13, 19; bias-free convs 8, 14, 20
    want = {"1.weight", "1.bias", "22.weight", "22.bias", "8.weight", "14.weight", "20.weight"}
    want |= {f"{i}.conv.weight" for i in (7, 13, 19)}
    mem = (3, 4, 5, 9, 10, 11, 15, 16, 17)
    want |= {f"{i}.conv.{j}.{p}" for i in mem for j in (0, 2, 4) for p in ("weight", "bias")}
    assert set(sd) == want and len(real) == 23
    shapes = {"1.weight": (256, 16, 3, 3), "3.conv.0.weight": (256, 512, 3, 3), "7.conv.weight": (256, 256, 1, 1),
              "8.weight": (128, 256, 3, 3), "13.conv.weight": (256, 128, 1, 1), "15.conv.4.weight": (64, 64, 3, 3),
              "19.conv.weight": (128, 64, 1, 1), "20.weight": (64, 64, 3, 3), "22.weight": (3, 64, 3, 3)}
    for k, s in shapes.items():
        assert tuple(sd[k].shape) == s, k
    n = sum(p.numel() for p in real.parameters())
    print(f"TAEHV decoder (n_f 256/128/64/64, 16 latent channels): {n:,} parameters")
    assert n == 9_844_611  # summed from upstream's layer list (upstream states no count)
    assert real.t_upscale == 4 and real.frames_to_trim == 3


@pytest.mark.parametrize("f", [1, 3, 9])
def test_decode_video_shapes_and_range(dec, latents, f):
    out = dec.decode_video(latents[:, :, :f])
    assert out.shape == (2, 3, 1 + 4 * (f - 1), 32, 32)
    assert out.shape[2] == pixel_frames_for(f, True)
    assert torch.isfinite(out).all() and out.min() >= -1.0 and out.max() <= 1.0
    assert out.std() > 0


def test_decode_video_matches_upstream_parallel_reference(dec, latents, oneshot):
    ref = _upstream_parallel(dec, latents.transpose(1, 2))  # NTCHW, [0, 1]
    torch.testing.assert_close(oneshot, ref.transpose(1, 2) * 2 - 1)


def test_decode_is_causal(dec, latents, oneshot):
    torch.testing.assert_close(dec.decode_video(latents[:, :, :3]), oneshot[:, :, :9])


# ------------------------------------------------------------------------------------------- streaming


@pytest.mark.parametrize("blocks", [[3, 3, 3], [1, 3, 5], [1] * 9, [9], [4, 5]])
@pytest.mark.parametrize("per_frame", [False, True])
def test_streaming_matches_oneshot(dec, latents, oneshot, blocks, per_frame):
    sdec = StreamingTAEHVDecoder(dec, per_frame=per_frame)
    outs = _stream(sdec, latents, blocks)
    assert [o.shape[2] for o in outs] == [pixel_frames_for(n, i == 0) for i, n in enumerate(blocks)]
    full = torch.cat(outs, 2)
    assert full.shape == oneshot.shape == (2, 3, 33, 32, 32)
    torch.testing.assert_close(full, oneshot)
    assert sdec.latent_frames_done == 9 and sdec.pixel_frames_done == 33 and sdec.blocks_done == len(blocks)


def test_reset_restarts_the_stream(dec, latents, oneshot):
    sdec = StreamingTAEHVDecoder(dec)
    _stream(sdec, latents, [2, 2])
    sdec.reset()
    assert sdec.latent_frames_done == 0 and all(m is None for m in sdec.memory)
    again = torch.cat(_stream(sdec, latents, [3, 3, 3]), 2)
    torch.testing.assert_close(again, oneshot)
    assert sdec(latents[:, :, :1]).shape[2] == 4  # __call__ = decode_block; a later block gives 4 per frame


def test_stream_rejects_bad_input(dec, latents):
    sdec = StreamingTAEHVDecoder(dec)
    with pytest.raises(ValueError):
        sdec.decode_block(latents[:, :8])  # 8 channels
    with pytest.raises(ValueError):
        sdec.decode_block(latents[:, :, 0])  # 4-D
    sdec.decode_block(latents[:, :, :1])
    with pytest.raises(ValueError, match="reset"):
        sdec.decode_block(latents[:1, :, 1:2])  # other batch size without reset()


def test_raw_latents_are_normalised_first(dec, latents, oneshot):
    mean = torch.tensor(WAN21_LATENTS_MEAN).view(1, 16, 1, 1, 1)
    std = torch.tensor(WAN21_LATENTS_STD).view(1, 16, 1, 1, 1)
    raw = latents * std + mean
    out = torch.cat(_stream(StreamingTAEHVDecoder(dec, raw_latents=True), raw, [3, 6]), 2)
    torch.testing.assert_close(out, oneshot, rtol=1e-5, atol=1e-5)


def test_decode_labels_in_profiler(dec, latents, labels_on):
    for per_frame, names_in in [(True, ["VAE_Decode_Frame_1", "VAE_Decode_Frame_2"]), (False, ["VAE_Decode_Block_1"])]:
        sdec = StreamingTAEHVDecoder(dec, per_frame=per_frame)
        sdec.decode_block(latents[:, :, :1])
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            sdec.decode_block(latents[:, :, 1:3])
        names = {e.key for e in prof.key_averages()}
        for n in ["VAE_Decode_Preprocessing", "VAE_Decode_Postprocessing", *names_in]:
            assert n in names, n
        assert "VAE_Decode_Frame_0" not in names and "VAE_Decode_Block_0" not in names


# ------------------------------------------------------------------------------------------- loading


def _params(m):
    return {k: v.clone() for k, v in m.state_dict().items()}


def test_build_is_seeded(dec):
    again, other = build_taehv("tiny", seed=0), build_taehv("tiny", seed=1)
    assert all(torch.equal(a, b) for a, b in zip(dec.state_dict().values(), again.state_dict().values()))
    assert not torch.equal(dec.state_dict()["1.weight"], other.state_dict()["1.weight"])
    assert not dec.training and not any(p.requires_grad for p in dec.parameters())
    with pytest.raises(ValueError):
        build_taehv("huge")


def test_load_own_and_upstream_style_state_dicts(dec, latents, oneshot):
    sd = dec.state_dict()
    full = {f"decoder.{k}": v for k, v in sd.items()}
    full |= {"encoder.0.weight": torch.zeros(64, 3, 3, 3), "encoder.0.bias": torch.zeros(64)}
    for src in (sd, full):
        fresh = build_taehv("tiny", seed=5)
        load_taehv_decoder(fresh, src)
        assert all(torch.equal(fresh.state_dict()[k], v) for k, v in sd.items())
        torch.testing.assert_close(fresh.decode_video(latents), oneshot, rtol=0, atol=0)


def test_load_wrong_shape_leaves_model_unchanged(dec):
    fresh = build_taehv("tiny", seed=5)
    before = _params(fresh)
    bad = dict(dec.state_dict())
    bad["8.weight"] = torch.zeros(3, 3, 3, 3)
    with pytest.raises(ValueError, match=r"8\.weight") as e:
        load_taehv_decoder(fresh, {f"decoder.{k}": v for k, v in bad.items()})
    assert isinstance(e.value, CheckpointMismatchError)
    after = fresh.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)  # nothing copied, not even the good keys


def test_load_missing_and_unexpected_keys(dec):
    fresh = build_taehv("tiny", seed=5)
    before = _params(fresh)
    sd = dict(dec.state_dict())
    del sd["13.conv.weight"]
    with pytest.raises(ValueError, match=r"missing keys.*13\.conv\.weight"):
        load_taehv_decoder(fresh, sd)
    with pytest.raises(ValueError, match=r"unexpected keys.*extra\.weight"):
        load_taehv_decoder(fresh, {**dec.state_dict(), "extra.weight": torch.zeros(1)})
    assert all(torch.equal(before[k], v) for k, v in fresh.state_dict().items())
    missing, _ = load_taehv_decoder(fresh, sd, strict=False)  # non-strict: the rest loads
    assert missing == ["13.conv.weight"] and torch.equal(fresh.state_dict()["1.weight"], dec.state_dict()["1.weight"])


def test_load_from_files(dec, latents, oneshot, tmp_path):
    pth = tmp_path / "taew2_1_tiny.pth"
    torch.save({f"decoder.{k}": v for k, v in dec.state_dict().items()}, pth)
    fresh = build_taehv("tiny", seed=5)
    load_taehv_decoder(fresh, pth)
    torch.testing.assert_close(fresh.decode_video(latents), oneshot, rtol=0, atol=0)

    pytest.importorskip("safetensors")
    from safetensors.torch import save_file

    st = tmp_path / "taew2_1_tiny.safetensors"
    save_file({k: v.contiguous() for k, v in dec.state_dict().items()}, str(st))
    fresh = build_taehv("tiny", seed=6)
    load_taehv_decoder(fresh, str(st))
    torch.testing.assert_close(fresh.decode_video(latents), oneshot, rtol=0, atol=0)
