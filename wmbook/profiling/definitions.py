"""What the stream metrics of a profiling session mean (DESIGN.md): quoted by sessions and their reports."""

DEFINITIONS = {
    "forward": "one call of the denoiser on one block (causal DiT) or one sample step (UNet).",
    "fps": "decoded pixel frames per second in steady state, counting every forward of the block (denoising "
           "steps and the cache-refresh pass) and the VAE decode; warm-up and compilation excluded. A latent frame "
           "decodes to 4 pixel frames (the very first to 1).",
    "first_frame_latency": "from the start of generation to the first decoded frame, warm.",
    "bps": "blocks per second (BPS): generated blocks per second, same accounting as FPS.",
    "how_measured": "device events (CUDA events on a GPU, the host clock on a CPU) at the start and end of every "
                    "block section; steady state = blocks after the first of the last generation that is not a "
                    "warm-up; block time = end of the previous block to the end of this one; first-frame latency = "
                    "start of session.generation() (or of block 0 when there is none) to the end of block 0.",
}  # fmt: skip
