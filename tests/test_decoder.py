"""The streaming decoder's variants (vae-stream-buffers, vae-channels-last, vae-compile, vae-cuda-graphs, vae-tiny,
decode-overlap), the ring KV cache, the decoder study and its FLOP floor.

On a CPU: every decoder variant against the fp32 reference decoder on seeded tiny latents, streaming equal to a one-shot
decode, the decoder table. On a GPU: graph replay of the decoder step equals eager, the ring cache under CUDA graphs
equals eager, decode on a second stream equals decode inline.
"""

from __future__ import annotations

import shutil
from types import MappingProxyType

import pytest
import torch
from conftest import _mg2_decoder_bench, _stream

from wmbook import variants, workloads
from wmbook.models.vae import StreamingWanDecoder, build_wan_vae, unnormalize_latents, wan_vae_config
from wmbook.variants.ladder import apply_stack

GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and streams need a CUDA device")


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """Every test of this module on one thread (tests/conftest.py)."""


def _bench(stack, device="cpu", backend="aot_eager"):
    return _mg2_decoder_bench(stack, device, backend)[0]


@pytest.mark.parametrize("stack", [["vae-stream-buffers"], ["vae-channels-last"],
                                   ["vae-stream-buffers", "vae-channels-last"],
                                   # the decoder ladder's compiled stack; make test's compiled case is the
                                   # same stack with the block step
                                   pytest.param(["vae-stream-buffers", "vae-channels-last", "vae-compile"],
                                                marks=pytest.mark.slow),
                                   ["vae-compile-regional"],
                                   ["vae-block-step"], ["vae-stream-buffers", "vae-block-step"],
                                   ["vae-stream-buffers", "vae-channels-last", "vae-head-gemm", "vae-block-step"],
                                   ["vae-stream-buffers", "vae-channels-last", "vae-compile", "vae-block-step"],
                                   # the window kernels' own tests are test_kernels_window_conv's; through the
                                   # decoder (their Triton kernels interpreted on a CPU) it takes a minute
                                   pytest.param(["vae-stream-buffers", "vae-channels-last", "vae-window-kernels"],
                                                marks=pytest.mark.slow)])
def test_decoder_variants_equal_the_reference_decoder(stack):
    """Seeded tiny latents through each stack, over more blocks than the caches reach back, twice (the second stream
    reuses the buffers after reset), split unevenly: the frames equal the reference decoder's."""
    z = torch.randn(1, 16, 8, 8, 8, generator=torch.Generator().manual_seed(1))
    ref = _stream(_bench([]), z, [3, 3, 2])
    dec = _bench(stack)
    for split in ([3, 3, 2], [1, 4, 3]):
        torch.testing.assert_close(_stream(dec, z, split), ref, rtol=1e-5, atol=1e-5)


def test_streaming_decode_equals_one_shot_decode():
    vae = build_wan_vae(wan_vae_config("tiny"))
    z = torch.randn(1, 16, 6, 8, 8, generator=torch.Generator().manual_seed(2))
    one_shot = vae.decode(unnormalize_latents(vae, z)).sample.clamp(-1, 1)
    for dec in (StreamingWanDecoder(vae), _bench(["vae-stream-buffers"])):
        dec.vae = vae
        dec.reset()
        torch.testing.assert_close(_stream(dec, z, [3, 3]), one_shot, rtol=1e-5, atol=1e-5)


def test_stream_buffers_keep_their_addresses_once_steady():
    dec = _bench(["vae-stream-buffers"])
    z = torch.randn(1, 16, 6, 8, 8)
    _stream(dec, z, [3, 3])
    before = {k: w.data_ptr() for k, w in dec.windows.items()}
    _stream(dec, z, [3, 3])
    assert {k: w.data_ptr() for k, w in dec.windows.items()} == before and dec.window_bytes() > 0


def test_block_step_calls_the_step_once_a_steady_block_and_sets_its_windows_up_before():
    """With vae-block-step the stream's first latent frame goes alone, the rest of its first block in one call (phase
    1), every later block in one steady call; the steady calls' windows are set up eagerly before the first of them and
    keep their addresses in the next stream; with the step compiled, the steady calls compile once and the next
    stream compiles nothing."""
    from wmbook.variants.compile_monitor import CompileMonitor

    z = torch.randn(1, 16, 9, 8, 8, generator=torch.Generator().manual_seed(3))
    ref = _stream(_bench([]), z, [3, 3, 3])
    for stack in (["vae-stream-buffers", "vae-block-step"], ["vae-stream-buffers", "vae-compile", "vae-block-step"]):
        torch._dynamo.reset()  # the compiles counted below are this stack's only
        dec = _bench(stack)
        calls, step = [], dec.decode_frame

        def record(x, phase, staged=False, step=step):
            calls.append((x.shape[2], phase))
            return step(x, phase, staged)

        dec.decode_frame = record
        with CompileMonitor() as first:
            _stream(dec, z, [3, 3, 3])
        assert calls == [(1, 0), (2, 1), (3, 2), (3, 2)], calls
        before = {k: w.data_ptr() for k, w in dec.windows.items()}
        # what the first stream recorded, read-only from now on: a captured call replays without running Python, so
        # later streams must not need anything their calls record
        dec.frames_per_latent = MappingProxyType(dict(dec.frames_per_latent))
        with CompileMonitor() as steady:
            torch.testing.assert_close(_stream(dec, z, [3, 3, 3]), ref, rtol=1e-5, atol=1e-5)
        assert {k: w.data_ptr() for k, w in dec.windows.items()} == before
        if "vae-compile" in stack:
            assert first.summary()["graph_breaks"] == 0 and first.summary()["recompiles"] == 0, first.summary()
            assert steady.summary()["frame_attempts"] == 0, steady.summary()


def test_block_step_follows_a_block_size_that_changes():
    """Steady blocks of 2, then 3, then 2 latent frames: the windows of each count set up when it first comes, the
    past frames carried each time; the frames equal the reference decoder's."""
    z = torch.randn(1, 16, 9, 8, 8, generator=torch.Generator().manual_seed(4))
    ref = _stream(_bench([]), z, [1, 1, 2, 3, 2])
    dec = _bench(["vae-stream-buffers", "vae-channels-last", "vae-block-step"])
    torch.testing.assert_close(_stream(dec, z, [1, 1, 2, 3, 2]), ref, rtol=1e-5, atol=1e-5)
    assert sorted({t for _, t in dec.windows}) == [1, 2, 3, 4, 6, 8, 12]  # frames a call: 1 2 3 at each stage x1 x2 x4


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_inductor_writes_a_steady_window_in_place(device):
    """Compiled by inductor, a steady step's causal convolution (moves_in_step False: the window's past frames move
    after the step) is one generated kernel, the input written into the window in place, and the convolution of the
    window itself: no buffer of the window's size (on an H200, with the move inside, inductor cloned the window for
    the convolution and copied it back; on a CPU the move inside is a second kernel, which this counts). Window and
    output equal eager ones; the move after gives the window eager conv_in_window leaves, for a call of fewer frames
    than the past (overlapping moves) and of more. On a CPU the windows are contiguous (inductor gives a CPU
    convolution over a channels-last window a contiguous copy of it); on a GPU channels-last, as the decoder has
    them."""
    from torch._inductor import metrics
    from torch._inductor.utils import run_and_get_code

    from wmbook.kernels.window_conv import shift_window
    from wmbook.variants.vae_stream import conv_in_window

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    if device == "cpu" and not (shutil.which("c++") or shutil.which("g++")):
        pytest.skip("inductor on a CPU needs a C++ compiler")
    fmt = torch.channels_last_3d if device == "cuda" else torch.contiguous_format
    # the window carries the causal and spatial padding. As in the decoder (vae-channels-last) the weight has the
    # window's layout, and no bias: on a GPU inductor adds a bias after the library convolution, and copies a weight
    # of another layout, each in a kernel of its own, which this count would take for a move
    conv = torch.nn.Conv3d(4, 4, 3, bias=False, device=device)
    conv.weight.data = conv.weight.data.contiguous(memory_format=fmt)
    conv._padding = (1, 1, 1, 1, 2, 0)
    for t in (1, 4):
        win = torch.randn(1, 4, 2 + t, 6, 6, device=device).contiguous(memory_format=fmt)
        ref = win.clone()
        x = torch.randn(1, 4, t, 4, 4, device=device)
        torch._dynamo.reset()
        metrics.reset()
        with torch.no_grad():
            want = conv_in_window(conv, x, ref)
            got, (code, *_) = run_and_get_code(torch.compile(conv_in_window, backend="inductor", fullgraph=True),
                                               conv, x, win, False)
        assert metrics.generated_kernel_count == 1, code
        assert f"empty_strided_{device}((1, 4, {2 + t}, 6, 6)" not in code, code
        torch.testing.assert_close(got, want)
        shift_window(win, t)
        assert torch.equal(win, ref)


def test_compiled_step_has_no_graph_break_and_recompiles_per_phase_only():
    from wmbook.variants.compile_monitor import CompileMonitor

    torch._dynamo.reset()  # a compile of the same step by an earlier test would count as a recompile here
    dec = _bench(["vae-stream-buffers", "vae-compile"])
    z = torch.randn(1, 16, 9, 8, 8)
    with CompileMonitor() as first:
        _stream(dec, z, [3, 3, 3])
    with CompileMonitor() as steady:
        _stream(dec, z, [3, 3, 3])
    assert first.summary()["graph_breaks"] == 0 and first.summary()["recompiles"] == 0, first.summary()
    assert steady.summary()["frame_attempts"] == 0, steady.summary()


def test_regional_compile_shares_graphs_between_blocks_of_one_shape():
    """vae-compile-regional: the steady frames' residual blocks go through one compiled function, a graph per distinct
    block shape (fewer than the blocks), no graph break; a second stream compiles nothing; stage labels stay (the
    step between regions is eager); with vae-compile, in either order, it is refused."""
    from wmbook.variants.compile_monitor import CompileMonitor

    dec = _bench(["vae-channels-last", "vae-compile-regional"])
    z = torch.randn(1, 16, 9, 8, 8)
    calls = []
    real = dec.regions["residual"]
    dec.regions["residual"] = lambda block, *a: calls.append(block) or real(block, *a)
    with CompileMonitor() as first:
        _stream(dec, z, [3, 3, 3])
    with CompileMonitor() as steady:
        _stream(dec, z, [3, 3, 3])
    blocks = {id(b) for b in calls}
    shapes = {(b.conv1.in_channels, b.conv1.out_channels, type(b.conv_shortcut).__name__) for b in calls}
    assert len(blocks) > len(shapes) >= 1, (len(blocks), shapes)
    s1 = first.summary()
    # one graph per distinct block shape (x the frames per call after a temporal upsampling) + the head + the other
    # convolutions: fewer than one per block, no limit hit, nothing compiled again by the second stream
    assert s1["graph_breaks"] == 0 and s1["recompile_limit_hits"] == 0, s1
    residual = first.frames[first.frames["function"] == "residual_in_windows"]
    assert 1 <= len(residual) < len(blocks), (len(residual), len(blocks))
    assert steady.summary()["frame_attempts"] == 0, steady.summary()
    for stack in (["vae-compile-regional", "vae-compile"],
                  ["vae-stream-buffers", "vae-compile", "vae-compile-regional"]):
        with pytest.raises(ValueError, match="both compile the decoder"):
            _bench(stack)
    with pytest.raises(ValueError, match="stand-in decoder"):
        _bench(["vae-tiny", "vae-compile-regional"])


def test_decode_overlap_refuses_a_compiled_decoder_step():
    """Measured on the H100: an inductor-compiled step on a second stream changed the frames
    (tools/overlap_check.py)."""
    from types import SimpleNamespace

    wl = workloads.get("mg2")
    ctx = variants.VariantContext(workload=wl, device=torch.device("cpu"))
    pipe = SimpleNamespace(decoder=_bench(["vae-stream-buffers", "vae-compile"]))
    with pytest.raises(ValueError, match="decode-overlap cannot follow vae-compile"):
        variants.get("decode-overlap").apply(pipe, ctx)


def test_tiny_decoder_variant_and_its_frame_count():
    dec = _bench(["vae-tiny"])
    z = torch.randn(1, 16, 6, 8, 8)
    out = _stream(dec, z, [3, 3])
    assert out.shape == (1, 3, 21, 64, 64) and out.abs().max() <= 1
    assert not variants.get("vae-tiny").frames_judged


@pytest.mark.parametrize("stack", [["vae-channels-last"], ["vae-compile"], ["vae-channels-last", "vae-compile"]])
def test_tiny_decoder_variants_equal_the_plain_tiny_decoder(stack):
    """The tiny decoder's own levers act on it (not on the Wan decoder it replaced): its convolutions in channels-last,
    its block step compiled for the steady blocks only (a stream's first block has no MemBlock memory yet); the frames
    equal the plain tiny decoder's, over two streams split unevenly."""
    z = torch.randn(1, 16, 8, 8, 8, generator=torch.Generator().manual_seed(2))
    ref = _stream(_bench(["vae-tiny"]), z, [3, 3, 2])
    dec = _bench(["vae-tiny", *stack])
    for split in ([3, 3, 2], [2, 3, 3]):
        torch.testing.assert_close(_stream(dec, z, split), ref, rtol=1e-5, atol=1e-5)
    convs = [m for m in dec.decoder.modules() if isinstance(m, torch.nn.Conv2d)]
    if "vae-channels-last" in stack:
        assert all(c.weight.is_contiguous(memory_format=torch.channels_last) for c in convs)
    if "vae-compile" in stack:
        assert dec.compiled_step and "step" in vars(dec)  # the class's step swapped on the instance
        step = dec.decoder_step()
        first = [None] * len(dec.decoder)
        assert not step.compiled((z, first)) and step.compiled((z, dec.memory))  # steady blocks only


def test_decoder_variants_registered_where_they_apply():
    streaming = {"vae-stream-buffers", "vae-channels-last", "vae-tiny", "decode-overlap", "ring-kv-cache",
                 "vae-compile-regional"}
    per_frame = {"vae-compile", "vae-compile-max-autotune", "vae-cuda-graphs"}
    assert streaming | per_frame <= set(variants.known(workloads.get("mg2")))
    assert (per_frame <= set(variants.known(workloads.get("wma")))
            and not streaming & set(variants.known(workloads.get("wma"))))
    assert ("skip-unused-decode" in variants.known(workloads.get("wma"))
            and "skip-unused-decode" not in variants.known(workloads.get("mg2")))
    with pytest.raises(ValueError, match="'vae-cuda-graphs' needs a CUDA device"):
        variants.resolve(["vae-cuda-graphs"], workloads.get("mg2"), "cpu")


def test_compile_after_the_buffers_only():
    with pytest.raises(ValueError, match="must come before vae-compile"):
        _bench(["vae-compile", "vae-stream-buffers"])


@pytest.mark.parametrize("channels_last", [False, True])
def test_head_gemm_equals_the_head_convolution_in_bf16(channels_last):
    """head_gemm_in_window against head_in_window on one bf16 window (past frames and new ones, a bias): within bf16's
    rounding of the 27 taps' products (the convolution rounds once, the GEMM each product), and both leave the same
    window behind."""
    from wmbook.variants.vae_stream import head_gemm_in_window, head_in_window

    dec = _bench(["vae-stream-buffers"]).vae.decoder.to(torch.bfloat16)
    conv = dec.conv_out
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, conv.in_channels, 3, 8, 8, generator=g, dtype=torch.bfloat16)
    win = torch.randn(1, conv.in_channels, 5, 10, 10, generator=g, dtype=torch.bfloat16)
    with torch.no_grad():
        conv.bias.normal_(generator=g)
    if channels_last:
        win = win.contiguous(memory_format=torch.channels_last_3d)
    w1, w2 = win.clone(), win.clone()
    with torch.no_grad():
        want, got = head_in_window(dec, x, w1), head_gemm_in_window(dec, x, w2)
    assert got.shape == want.shape == (1, conv.out_channels, 3, 8, 8)
    # the GEMM rounds each tap's product to bf16 (2^-8 relative) before the fp32 sum, the convolution only its output
    torch.testing.assert_close(got.float(), want.float(), rtol=2e-2, atol=5e-2)
    assert torch.equal(w1, w2)


def test_head_gemm_before_what_runs_the_head_its_own_way():
    for stack in (["vae-stream-buffers", "vae-compile", "vae-head-gemm"], ["vae-compile-regional", "vae-head-gemm"],
                  ["vae-head-gemm", "vae-compile-regional"]):
        with pytest.raises(ValueError, match="vae-head-gemm"):
            _bench(stack)


def test_window_kernels_refuse_what_they_cannot_follow_or_precede():
    with pytest.raises(ValueError, match="vae-channels-last before it"):
        _bench(["vae-stream-buffers", "vae-window-kernels"])
    with pytest.raises(ValueError, match="use one of them"):
        _bench(["vae-stream-buffers", "vae-channels-last", "vae-window-kernels", "vae-compile"])
    with pytest.raises(ValueError, match="use one of them"):
        _bench(["vae-stream-buffers", "vae-channels-last", "vae-compile", "vae-window-kernels"])


def test_wma_decode_step_compiled_and_the_decision_decode_skipped():
    """The UNet workload's per-frame SD VAE decode through vae-compile equals the reference's; skip-unused-decode
    leaves the decision pass undecoded and the world-model pass as it was."""
    wl = workloads.get("wma")
    dev = torch.device("cpu")
    ref = wl.reference_pipeline(wl.presets["tiny-wma"], dev)
    # backend eager: dynamo traces the step (aot_eager fails on this CPU group_norm, torch 2.13; inductor is slow here)
    pipe, _ = apply_stack(ref, wl, ["vae-compile", "skip-unused-decode"], dev, compile_backend="eager")
    lat = torch.randn(1, 4, 2, *ref.preset.latent_shape[-2:], generator=torch.Generator().manual_seed(4))
    torch.testing.assert_close(pipe.decode(lat), ref.decode(lat), rtol=1e-5, atol=1e-5)
    size = workloads.E2ESize(ddim_steps=2)
    a = ref.run_iteration(ref.prepare(seed=0), ddim_steps=2, progress=False)
    b = pipe.run_iteration(pipe.prepare(seed=0), ddim_steps=2, progress=False)
    assert a.decision.frames is not None and b.decision.frames is None
    torch.testing.assert_close(b.world.frames, a.world.frames, rtol=1e-5, atol=1e-5)
    assert wl.end_to_end(pipe, 0, size).frames is not None


def test_wma_batched_frames_decode_equals_a_frame_per_call():
    """vae-batch-frames: a pass's frames decoded as one batch are each frame's own decode (within fp32 rounding: the
    convolutions see another batch), in decode's layout; with the decision pass skipped and the step compiled too."""
    wl = workloads.get("wma")
    dev = torch.device("cpu")
    ref = wl.reference_pipeline(wl.presets["tiny-wma"], dev)
    lat = torch.randn(2, 4, 3, *ref.preset.latent_shape[-2:], generator=torch.Generator().manual_seed(5))
    want = ref.decode(lat)
    for stack in (["vae-batch-frames"], ["vae-batch-frames", "vae-compile", "skip-unused-decode"]):
        pipe, ctx = apply_stack(ref, wl, stack, dev, compile_backend="eager")
        got = pipe.decode(lat)
        assert got.shape == want.shape and got.is_contiguous()
        # fp32 through a few dozen layers whose kernels may be other ones at another batch: a frame put in the wrong
        # place would be off by O(1)
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
        assert "vae-batch-frames" in ctx.notes
    assert "vae-batch-frames" not in variants.known(workloads.get("mg2"))  # a streaming decoder carries frames over


def test_wma_decoder_in_bf16_leaves_the_encoder_and_the_unet_input_alone():
    """vae-decoder-bf16 decodes as the whole VAE in bf16 does (the same bf16 arithmetic), while the encoder stays fp32,
    so the UNet's forward, conditioned on the encoder's latent, is the reference's bit for bit; it refuses to follow
    the compiled step it replaces."""
    wl = workloads.get("wma")
    dev = torch.device("cpu")
    ref = wl.reference_pipeline(wl.presets["tiny-wma"], dev)
    lat = torch.randn(1, 4, 2, *ref.preset.latent_shape[-2:], generator=torch.Generator().manual_seed(6))
    half, _ = apply_stack(ref, wl, ["vae-decoder-bf16"], dev)
    whole, _ = apply_stack(ref, wl, ["vae-bf16"], dev)
    assert torch.equal(half.decode(lat), whole.decode(lat))
    assert half.vae.encoder.conv_in.weight.dtype == torch.float32 and half.vae.decoder.conv_in.weight.dtype == (
        torch.bfloat16)
    for a, b in zip(wl.forward_probe(half).forward(), wl.forward_probe(ref).forward()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="must come before vae-compile"):
        apply_stack(ref, wl, ["vae-compile", "vae-decoder-bf16"], dev, compile_backend="eager")


def test_wma_vae_attention_as_gemms_decodes_as_sdpa():
    """vae-attn-gemm runs the SD VAE decoder's mid-block attention as diffusers' GEMM + softmax processor: in fp32 the
    same frames up to the order of additions; the encoder keeps SDPA; it refuses to follow a compiled decode."""
    from diffusers.models.attention_processor import Attention, AttnProcessor

    wl = workloads.get("wma")
    dev = torch.device("cpu")
    ref = wl.reference_pipeline(wl.presets["tiny-wma"], dev)
    lat = torch.randn(2, 4, 2, *ref.preset.latent_shape[-2:], generator=torch.Generator().manual_seed(7))
    pipe, ctx = apply_stack(ref, wl, ["vae-attn-gemm"], dev)
    dec = [m for m in pipe.vae.decoder.modules() if isinstance(m, Attention)]
    assert dec and all(type(m.processor) is AttnProcessor for m in dec)
    assert all(type(m.processor) is not AttnProcessor for m in pipe.vae.encoder.modules() if isinstance(m, Attention))
    assert ctx.notes["vae-attn-gemm"].startswith(f"{len(dec)} SD VAE decoder attention layer")
    # fp32 GEMMs against SDPA's fp32 kernel: a few ulps of the activations' scale per layer
    torch.testing.assert_close(pipe.decode(lat), ref.decode(lat), rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="must come before vae-compile and vae-cuda-graphs"):
        apply_stack(ref, wl, ["vae-compile", "vae-attn-gemm"], dev, compile_backend="eager")
    assert "vae-attn-gemm" not in variants.known(workloads.get("mg2"))


def test_wma_decoder_ladder_on_a_gpu_puts_the_bf16_decoder_and_the_batch_before_the_compile():
    wl = workloads.get("wma")
    assert wl.decoder_ladder(torch.device("cuda")) == ["vae-decoder-bf16", "vae-batch-frames", "vae-upsample-fold",
                                                        "vae-triton-fused", "vae-norm-conv-bias", "vae-attn-gemm",
                                                        "vae-compile", "vae-cuda-graphs"]
    assert wl.decoder_ladder(torch.device("cpu")) == []


def test_mg2_decoder_ladder_on_a_gpu_puts_the_head_gemm_before_the_compile():
    wl = workloads.get("mg2")
    assert wl.decoder_ladder(torch.device("cuda")) == ["cudnn-benchmark", "vae-bf16", "vae-stream-buffers",
                                                        "vae-channels-last", "vae-upsample-fold", "vae-head-gemm",
                                                        "vae-compile", "vae-cuda-graphs", "vae-block-step"]
    assert wl.decoder_ladder(torch.device("cpu")) == ["vae-stream-buffers", "vae-channels-last", "vae-upsample-fold",
                                                       "vae-block-step"]


def test_decoder_table_on_the_tiny_preset():
    """Every CPU decoder row decodes the same latents; full-decoder rows pass the PSNR gate, the random tiny decoder
    says it needs real weights; the FLOP floor comes from a meta-tensor count."""
    from wmbook.models.flops import wan_decoder_flops
    from wmbook.studies import decoder as study

    wl = workloads.get("mg2")
    dev = torch.device("cpu")
    ref = wl.reference_pipeline(wl.presets["tiny"], dev)
    lat = torch.randn(1, 16, 6, 8, 8, generator=torch.Generator().manual_seed(3))
    stacks = {k: v for k, v in study.decoder_stacks(wl, dev).items() if not any(n.startswith("vae-compile") for n in v)}
    assert "+ vae-compile-regional" in study.decoder_stacks(wl, torch.device("cuda"))  # a GPU row (tested above)
    assert "+ vae-compile-regional" not in study.decoder_stacks(wl, dev)
    assert "+ vae-window-kernels + vae-cuda-graphs" in study.decoder_stacks(wl, torch.device("cuda"))  # a GPU row
    rows = study.run_decoder_table(ref, wl, lat, stacks, warmup=0, repeats=1)
    t = study.decoder_table(rows, wan_decoder_flops(ref.preset), {"gemm_tflops": 1.0})
    assert list(t.index)[0] == "fp32 (reference)" and t["gate"].iloc[0] == "reference"
    full = t[t["stack"].str.contains("vae-stream-buffers")]
    assert len(full) >= 2 and (full["gate"] == "pass").all() and (full["PSNR dB vs fp32"] > 100).all()
    assert t.loc["tiny decoder (TAEHV)", "gate"] == "needs real weights"
    assert t.loc["tiny + channels-last", "gate"] == "needs real weights"  # judged against the plain tiny decoder:
    assert t.loc["tiny + channels-last", "PSNR dB vs plain stand-in"] > 100  # the same frames
    assert (t["ms / block"] > 0).all() and t.attrs["floor_ms"] > 0
    assert "tiny decoder" in study.interpret(t)
    f = wan_decoder_flops(wl.presets["mg2-universal"])
    assert 20e12 < f["steady_block"] < 26e12 and 15e12 < f["first_block"] < 20e12  # ANCHORS.md: ~23 and ~17.7 TFLOP
    assert 0.95 * f["steady_block"] < f["steady_block_conv"] < f["steady_block"]  # all but the middle attention
    assert t["conv % of floor"].isna().all()  # no profiled block on a CPU


def test_decoder_convolutions_against_their_floor():
    """A profiled row's convolution kernels are set against the convolutions' own FLOP floor: the table's column, the
    key view the notebook shows, and the account's sentence."""
    from wmbook.bench import Samples
    from wmbook.studies import decoder as study

    row = study.DecoderRow(label="bf16", stack=["vae-bf16"], gate="pass", block_ms=Samples([40.0, 41.0]),
                           psnr_db=50.0, first_pass_s=1.0, first_block_ms=30.0, peak_memory_gib=1.0,
                           pixel_frames_per_block=12, gpu_busy_ms=38.0,
                           categories={"convolution": 30.0, "reduction": 5.0, "copy/cast": 3.0})
    t = study.decoder_table([row], {"first_block": 8e12, "steady_block": 10e12, "steady_block_conv": 9e12},
                            {"gemm_tflops": 600.0})
    assert t.attrs["conv_floor_ms"] == pytest.approx(15.0)  # 9e12 FLOPs at 600 TFLOP/s
    assert t.loc["bf16", "conv ms"] == 30.0 and t.loc["bf16", "conv % of floor"] == pytest.approx(50.0)
    assert set(study.DECODER_KEY) <= set(t.columns)
    text = study.category_account([row], t.attrs["conv_floor_ms"])
    assert "convolution takes 30 ms (79%)" in text and "reach 50% of it" in text
    assert "FLOP floor" not in study.category_account([row])


def test_wma_decoder_table_on_the_tiny_preset():
    """The UNet workload's SD VAE in the same table: frame by frame (one timed decode = one frame), its fp32 decode
    through the bench equal to the pipeline's own decode of the same latents, the compiled step gated against it, the
    floor counted per frame."""
    from wmbook.models.flops import sd_decoder_flop_parts
    from wmbook.studies import decoder as study

    wl = workloads.get("wma")
    dev = torch.device("cpu")
    ref = wl.reference_pipeline(wl.presets["tiny-wma"], dev)
    lat = torch.randn(1, 4, 3, *ref.preset.latent_shape[-2:], generator=torch.Generator().manual_seed(5))
    assert study.decoder_stacks(wl, dev) == {"fp32 (reference)": [], "bf16": ["vae-bf16"]}
    assert {"bf16", "+ vae-compile", "+ vae-cuda-graphs (compiled step)"} <= set(
        study.decoder_stacks(wl, torch.device("cuda")))
    stacks = {"fp32 (reference)": [], "bf16": ["vae-bf16"], "+ vae-compile": ["vae-compile"]}
    assert wl.decoder_block(ref) == (1, 1)
    bench = wl.decoder_bench(ref)
    with torch.no_grad():
        torch.testing.assert_close(wl.decoder_stream(bench).decode_block(lat), ref.decode(lat), rtol=0, atol=0)
    assert bench.vae is not ref.vae
    # backend eager: dynamo traces the step (aot_eager fails on this CPU group_norm, as in the test above)
    rows = study.run_decoder_table(ref, wl, lat, stacks, warmup=0, repeats=1, compile_backend="eager")
    t = study.decoder_table(rows, wl.decoder_flops(ref.preset), {"gemm_tflops": 1.0})
    assert t["gate"].iloc[0] == "reference" and t.loc["+ vae-compile", "gate"] == "pass"
    assert t.loc["+ vae-compile", "PSNR dB vs fp32"] > 100 and 10 < t.loc["bf16", "PSNR dB vs fp32"] < 100
    assert t.loc["bf16", "gate"] == ("pass" if t.loc["bf16", "PSNR dB vs fp32"] >= study.DECODER_PSNR_DB else "FAIL")
    assert (t["decoder-only FPS"] > 0).all() and t.attrs["floor_ms"] > 0
    assert ref.decode_step.__func__ is type(ref).decode_step  # the bench's compiled step left the reference alone
    f = sd_decoder_flop_parts(wl.presets["wma"])["total"]  # one 320x512 frame of the SD VAE decoder
    assert 1.0e12 < f < 2.5e12
    parts = wl.decoder_flops(wl.presets["wma"])
    assert parts["steady_block"] == f and 0.9 * f < parts["steady_block_conv"] < f


def test_ring_cache_keys_one_graph_for_every_full_block():
    """With ring caches, every block after the ring filled has the same cache signature (one CUDA graph), whatever its
    write position; the reference's slots differ between block 0 and the rest only because it evicts."""
    from wmbook.workloads.mg2 import _cache_slots

    wl = workloads.get("mg2")
    ref = wl.reference_pipeline(wl.presets["tiny"], torch.device("cpu"))
    pipe, _ = apply_stack(ref, wl, ["hygiene", "ring-kv-cache"], torch.device("cpu"))
    inp = pipe.prepare(5, seed=0)
    cache = pipe.init_cache(inp)
    k = pipe.preset.num_frame_per_block
    keys, idx = [], []
    for b in range(5):
        cache.begin(b * k, pipe.preset.frame_seqlen, k)
        keys.append(_cache_slots((), {"cache": cache}))
        idx.append(cache.kv[0].write_idx.clone())
    assert len(set(keys[1:])) == 1 and keys[0] != keys[1]
    assert not torch.equal(idx[1], idx[2]) and torch.equal(idx[1], idx[3])  # the write position moves on the device


@GPU
def test_decoder_graphs_replay_equals_eager():
    z = torch.randn(1, 16, 12, 8, 8, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    eager = _bench(["vae-stream-buffers"], "cuda")
    graphed = _bench(["vae-stream-buffers", "vae-cuda-graphs"], "cuda")
    ref = _stream(eager, z, [3, 3, 3, 3])
    for _ in range(3):  # the third stream replays graphs of all three phases
        torch.testing.assert_close(_stream(graphed, z, [3, 3, 3, 3]), ref, rtol=0, atol=0)
    g = graphed.decode_frame
    assert g.captured == 3 and not g.failures, g.table()


@GPU
def test_decoder_block_step_graphs_replay_equals_eager():
    """vae-block-step under vae-cuda-graphs: the steady block's call captured after its windows were set up eagerly;
    replays give the eager block step's frames bit for bit, and those equal the per-frame step's within TF32's
    rounding (cuDNN's fp32 convolutions run in TF32 by default and may pick other algorithms for 3x the frames)."""
    z = torch.randn(1, 16, 12, 8, 8, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    per_frame = _stream(_bench(["vae-stream-buffers"], "cuda"), z, [3, 3, 3, 3])
    ref = _stream(_bench(["vae-stream-buffers", "vae-block-step"], "cuda"), z, [3, 3, 3, 3])
    torch.testing.assert_close(ref, per_frame, rtol=5e-3, atol=5e-3)
    graphed = _bench(["vae-stream-buffers", "vae-cuda-graphs", "vae-block-step"], "cuda")
    for _ in range(5):  # streams 4 and 5 replay the first frame's and the next call's graphs too
        torch.testing.assert_close(_stream(graphed, z, [3, 3, 3, 3]), ref, rtol=0, atol=0)
    g = graphed.decode_frame
    assert g.captured == 3 and not g.failures, g.table()  # the first frame, the call after it, the steady blocks


@GPU
def test_head_gemm_compiled_and_captured_equals_the_eager_block_step():
    """vae-head-gemm in the compiled, captured block step (inductor): every stream's frames within TF32's rounding of
    the eager block step's (cuDNN's fp32 convolutions run in TF32), replays bit for bit like the first stream."""
    z = torch.randn(1, 16, 12, 8, 8, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    ref = _stream(_bench(["vae-stream-buffers", "vae-block-step"], "cuda"), z, [3, 3, 3, 3])
    dec = _bench(["vae-stream-buffers", "vae-channels-last", "vae-head-gemm", "vae-compile", "vae-cuda-graphs",
                  "vae-block-step"], "cuda", backend="inductor")
    first = _stream(dec, z, [3, 3, 3, 3])
    torch.testing.assert_close(first, ref, rtol=5e-3, atol=5e-3)
    for _ in range(4):
        torch.testing.assert_close(_stream(dec, z, [3, 3, 3, 3]), first, rtol=0, atol=0)
    assert dec.decode_frame.captured == 3 and not dec.decode_frame.failures, dec.decode_frame.table()


@GPU
def test_tiny_decoder_graphs_replay_equals_eager():
    """The tiny decoder's block step captured (its memory in and out as arguments): replays give the eager frames
    bit for bit."""
    z = torch.randn(1, 16, 12, 8, 8, device="cuda", generator=torch.Generator("cuda").manual_seed(0))
    # against the same layout run eagerly: cuDNN picks other algorithms for channels-last convolutions (TF32 for fp32
    # by default), whose frames differ from contiguous ones by rounding (81 dB at mg2-universal, H100)
    ref = _stream(_bench(["vae-tiny", "vae-channels-last"], "cuda"), z, [3, 3, 3, 3])
    graphed = _bench(["vae-tiny", "vae-channels-last", "vae-cuda-graphs"], "cuda")
    for _ in range(3):
        torch.testing.assert_close(_stream(graphed, z, [3, 3, 3, 3]), ref, rtol=0, atol=0)
    g = graphed.step
    # two signatures, each captured after its two eager warm-ups: a stream's first block (no memory yet; its third
    # occurrence is in the third stream) and the steady blocks
    assert g.captured == 2 and not g.failures, g.table()


@GPU
def test_wma_decoder_graphs_replay_equals_eager():
    wl = workloads.get("wma")
    dev = torch.device("cuda")
    ref = wl.reference_pipeline(wl.presets["tiny-wma"], dev)
    graphed, _ = apply_stack(ref, wl, ["vae-cuda-graphs"], dev)
    lat = torch.randn(1, 4, 4, *ref.preset.latent_shape[-2:], device="cuda")
    want = ref.decode(lat)
    for _ in range(2):
        torch.testing.assert_close(graphed.decode(lat), want, rtol=0, atol=0)
    from wmbook.variants.builtin import graphed_callables

    (g,) = graphed_callables(graphed)
    assert g.captured == 1 and not g.failures


@GPU
def test_ring_caches_with_graphs_and_decode_overlap_equal_eager():
    wl = workloads.get("mg2")
    dev = torch.device("cuda")
    ref = wl.reference_pipeline(wl.presets["tiny"], dev)
    eager, _ = apply_stack(ref, wl, ["bf16", "hygiene", "ring-kv-cache"], dev)
    fast, _ = apply_stack(ref, wl, ["bf16", "hygiene", "static-caches", "ring-kv-cache", "cuda-graphs",
                                    "vae-stream-buffers", "vae-cuda-graphs", "decode-overlap"], dev)
    size = workloads.E2ESize(blocks=4)
    for _ in range(3):
        a = wl.end_to_end(eager, 0, size)
        b = wl.end_to_end(fast, 0, size)
        torch.testing.assert_close(b.latents, a.latents, rtol=0, atol=0)
        torch.testing.assert_close(b.frames, a.frames, rtol=0, atol=0)
    from wmbook.variants.builtin import graphed_callables

    assert all(g.captured >= 1 and not g.failures for g in graphed_callables(fast))


def test_decoder_rows_store_their_gpu_time_by_category_and_the_account_names_convolution_against_the_rest():
    """A GPU run's decoder rows keep one profiled steady block's GPU time, whole and by category, as results rows;
    the account says where the fastest gated full decoder's kernel time goes (stand-ins and failed rows left out)."""
    from wmbook.bench import Samples
    from wmbook.studies import decoder as dstudy
    from wmbook.studies import graphs as study06

    cfg = study06.validate(workload="mg2", preset="tiny", device="cpu")

    def row(label, gate, ms, cats, busy=float("nan")):
        return dstudy.DecoderRow(label=label, stack=["vae-bf16"] if label != "fp32" else [], block_ms=Samples([ms]),
                                 first_block_ms=ms, first_pass_s=1.0, psnr_db=50.0, gate=gate,
                                 pixel_frames_per_block=12, gpu_busy_ms=busy, categories=cats)

    rows = [row("fp32", "reference", 270.0, {"convolution": 200.0, "normalization": 40.0}, 262.0),
            row("compiled", "pass", 83.0, {"convolution": 44.0, "elementwise/activation": 20.0, "copy/cast": 16.0},
                81.0),
            row("tiny", "needs real weights", 4.0, {"convolution": 3.0}, 3.5),
            row("broken", "FAIL", 50.0, {"convolution": 1.0}, 2.0)]
    stored = {(r["variant"], r["metric"]): r["value"] for r in dstudy.result_rows(cfg, rows)}
    assert stored[("decoder: vae-bf16", "decoder_category_ms:copy/cast")] == 16.0
    assert stored[("decoder: fp32", "decoder_gpu_busy_ms")] == 262.0
    said = dstudy.category_account(rows)
    assert said.startswith("Of the fastest gated decoder's (compiled) 80 ms of kernel time")
    assert "convolution takes 44 ms (55%) and everything else 36 ms" in said
    assert dstudy.category_account([row("cpu", "reference", 10.0, {})]) == ""
    cpu = dstudy.result_rows(cfg, [row("cpu", "reference", 10.0, {})])
    assert not [r for r in cpu if r["metric"].startswith("decoder_category") or r["metric"] == "decoder_gpu_busy_ms"]


def test_frame_decoder_rows_on_a_gpu_end_with_bf16_captured():
    """The SD VAE's table on a GPU: fp32 compiled and captured, then bf16 compiled and captured (its compiled step is
    host-bound), then with the upsamplings folded; names only, so it runs on a CPU."""
    from wmbook import workloads
    from wmbook.studies.decoder import frame_decoder_stacks

    rows = frame_decoder_stacks(workloads.get("wma"), torch.device("cuda"))
    assert rows["bf16 + vae-compile + vae-cuda-graphs"] == ["vae-bf16", "cudnn-benchmark", "vae-compile",
                                                            "vae-cuda-graphs"]
    assert list(rows)[-4] == "bf16 + vae-compile + vae-cuda-graphs" and "+ vae-cuda-graphs (compiled step)" in rows
    assert rows[list(rows)[-3]] == ["vae-bf16", "cudnn-benchmark", "vae-upsample-fold", "vae-compile",
                                    "vae-cuda-graphs"]
    assert rows[list(rows)[-2]] == ["vae-bf16", "cudnn-benchmark", "vae-upsample-fold", "vae-triton-fused",
                                    "vae-norm-conv-bias", "vae-compile", "vae-cuda-graphs"]
    assert rows[list(rows)[-1]] == ["vae-bf16", "cudnn-benchmark", "vae-upsample-fold", "vae-triton-fused",
                                    "vae-norm-conv-bias", "vae-attn-gemm", "vae-compile", "vae-cuda-graphs"]


def test_decoder_rows_on_a_gpu_search_cudnn_from_their_first_reduced_precision_row():
    """cuDNN keeps the algorithm it first picked for a convolution shape for the rest of the process (however it
    picked it), so every GPU decoder row but the fp32 reference has the search on (a row's variants are all applied
    before it decodes), and no row of its own claims it (names only, so it runs on a CPU)."""
    from wmbook.studies import decoder as study

    for name in ("mg2", "wma"):
        rows = study.decoder_stacks(workloads.get(name), torch.device("cuda"))
        assert rows["fp32 (reference)"] == [] and "+ cudnn-benchmark" not in rows
        assert all("cudnn-benchmark" in stack for label, stack in rows.items() if label != "fp32 (reference)")
    mg2 = study.decoder_stacks(workloads.get("mg2"), torch.device("cuda"))
    assert list(mg2)[1] == "bf16 + cudnn-benchmark" and mg2["bf16 + cudnn-benchmark"] == ["vae-bf16", "cudnn-benchmark"]


def test_decoder_bench_without_the_search_relabels_its_rows(monkeypatch):
    """tools/decoder_bench.py --no-search: every row without cudnn-benchmark, labelled so (the GPU rows' stacks, taken
    on a CPU up to the table's run)."""
    from conftest import load_tool

    from wmbook.studies import decoder as study

    tool, seen = load_tool("decoder_bench"), {}
    gpu_stacks = study.decoder_stacks(workloads.get("mg2"), torch.device("cuda"))
    monkeypatch.setattr(study, "decoder_stacks", lambda *a, **k: dict(gpu_stacks))

    def stop(ref, wl, lat, stacks, **kw):
        seen.update(stacks)
        raise KeyboardInterrupt  # the tool ends as on Ctrl-C, before anything is decoded

    monkeypatch.setattr(study, "run_decoder_table", stop)
    assert tool.main(["--preset", "tiny", "--blocks", "2", "--stacks", "(compiled step)", "--no-search"]) != 0
    assert seen == {"fp32 (reference)": [],
                    "+ vae-cuda-graphs (compiled step) (cuDNN heuristics)": ["vae-bf16", "vae-stream-buffers",
                                                                             "vae-channels-last", "vae-compile",
                                                                             "vae-cuda-graphs"]}
