"""UnifoLM-WMA-0 reference model: DynamiCrafter-style video UNet with action/state heads, its encoders and VAE."""

from .model import WMAWorldModel, parameter_counts  # noqa: F401
from .unet import WMA_FINE_LABELS, WMA_FORWARD_LABEL, WMAModel  # noqa: F401
