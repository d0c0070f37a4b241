"""Training the world presets' models on wmbook.world (flow matching for the causal DiT, v-prediction for the WMA
UNet): `python -m wmbook.train --workload mg2|wma --preset NAME --minutes M [--ship]` (a new run folder under
data/weights/runs/; --ship replaces data/weights/NAME.pt only when the new weights pass the shipping rule).

wmbook.train.objectives says what each model learns and how it matches inference; wmbook.train.core runs the loop
(seeded, resumable, budgeted by time and/or steps, bf16 autocast on CUDA, loss CSV, EMA weights, JSON provenance).
"""

from .core import TrainConfig, evaluate, train

__all__ = ["TrainConfig", "evaluate", "train"]
