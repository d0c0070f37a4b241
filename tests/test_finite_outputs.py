"""Every output of both reference pipelines is finite on the tiny presets, with the installed library versions.

A fresh install once got a diffusers/torch pair whose float32 schedule made the wma pipeline NaN everywhere:
this is the test that fails loudly, naming the output, when any pipeline output is NaN or inf.
"""

import pytest
import torch

from wmbook.check import NonFiniteError, require_finite
from wmbook.pipelines.causal import CausalStreamingPipeline
from wmbook.pipelines.ddim import WMAInteractionPipeline


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """Every test of this module on one thread (tests/conftest.py)."""


@pytest.mark.parametrize("preset", ["tiny", "tiny-sf"])
def test_causal_pipeline_outputs_are_finite(preset):
    pipe = CausalStreamingPipeline(preset, device="cpu", dtype="fp32", seed=0)
    out = pipe.generate(pipe.prepare(3, seed=1), progress=False)
    require_finite({"latents": out.latents, "frames": out.frames}, f"causal pipeline ({preset})")


@pytest.mark.parametrize("guidance_scale", [1.0, 2.0])
def test_wma_pipeline_outputs_are_finite(guidance_scale):
    """Both passes (latents, frames, actions, states) at the preset's 1000-step zero-terminal-SNR schedule."""
    pipe = WMAInteractionPipeline("tiny-wma", device="cpu", dtype="fp32", seed=0)
    out = pipe.run_iteration(pipe.prepare(seed=2), guidance_scale=guidance_scale, progress=False)
    assert out.timesteps[0] == pipe.preset.num_train_timesteps - 1  # the zero-SNR step is sampled
    require_finite(out.reference(), f"wma pipeline (guidance {guidance_scale})")


def test_require_finite_names_the_bad_outputs():
    good = torch.zeros(3)
    bad = torch.tensor([1.0, float("nan"), float("inf")])
    require_finite({"a": good, "skipped": None})
    with pytest.raises(NonFiniteError,
                       match=r"wma produced non-finite outputs: world_frames \(2 of 3 values, shape \(3,\)\)") as e:
        require_finite({"a": good, "world_frames": bad}, "wma")
    assert "a (" not in str(e.value)
