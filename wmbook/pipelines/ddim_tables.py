"""The DDIM arithmetic of the UnifoLM-WMA interaction (wmbook.pipelines.ddim): the video's and the heads' diffusers
schedulers, upstream's video update as a float64 table of coefficients (`DDIMTable`, `ddim_update`), and both as
float32 coefficient tables for the fused update kernels."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from diffusers import DDIMScheduler

from ..presets import WMAPreset


def video_scheduler(p: WMAPreset) -> DDIMScheduler:
    """Upstream's video DDIM: scaled-linear betas rescaled to zero terminal SNR, v-prediction, trailing steps.

    set_alpha_to_one=False: upstream's last step goes to alpha_bar[0], not 1 (make_ddim_sampling_parameters).
    """
    return DDIMScheduler(num_train_timesteps=p.num_train_timesteps, beta_start=p.beta_start, beta_end=p.beta_end,
                         beta_schedule=p.beta_schedule, rescale_betas_zero_snr=p.rescale_betas_zero_snr,
                         prediction_type=p.prediction_type, timestep_spacing=p.timestep_spacing,
                         set_alpha_to_one=False, clip_sample=False, steps_offset=0)


def head_scheduler(p: WMAPreset) -> DDIMScheduler:
    """The action / state heads' DDIM (upstream `noise_scheduler_config`)."""
    return DDIMScheduler(num_train_timesteps=p.num_train_timesteps, beta_start=p.head_beta_start,
                         beta_end=p.head_beta_end, beta_schedule=p.head_beta_schedule, clip_sample=True,
                         set_alpha_to_one=True, steps_offset=0, prediction_type="epsilon")


def dynamic_rescale(p: WMAPreset, t: int) -> float:
    """DynamiCrafter's scale_arr[t]: 1 -> base_scale linearly over the first turning_step timesteps."""
    if t >= p.turning_step:
        return p.base_scale
    return 1.0 + (p.base_scale - 1.0) * t / (p.turning_step - 1)


@dataclass(frozen=True)
class DDIMTable:
    """Upstream's DDIM update for one step count, as host-side float64 coefficients (no device sync).

    Per step j (timestep t, previous timestep t_prev = the next entry of the list, alpha_bar[0] after the last):
      x0  = sqrt(a_t) x - sqrt(1 - a_t) v                    (v-prediction)
      eps = sqrt(a_t) v + sqrt(1 - a_t) x
      x_prev = x0_coef x0 + eps_coef eps + sigma noise
    with x0_coef = sqrt(a_prev) scale(t_prev) / scale(t) (DynamiCrafter's dynamic pred-x0 rescale),
    sigma^2 = eta^2 (1 - a_prev) / (1 - a_t) (1 - a_t / a_prev) and eps_coef = sqrt(1 - a_prev - sigma^2).

    eps_coef is computed without cancellation: 1 - a_prev - sigma^2 = (1 - a_prev) / (1 - a_t) * inner with
    inner = (1 - eta^2)(1 - a_t) + eta^2 a_t (1 - a_prev) / a_prev, a sum of non-negative terms for eta in
    [0, 1]. The textbook form subtracts two numbers that are equal when a_t = 0 (zero terminal SNR, first
    step) and eta = 1; in float32 the residue is +-1 ulp depending on the last bit of alpha_bar, and its
    square root is NaN when negative (diffusers' DDIMScheduler.step and upstream's p_sample_ddim both
    evaluate it that way).
    """

    timesteps: tuple[int, ...]
    sqrt_alpha: tuple[float, ...]  # sqrt(a_t)
    sqrt_one_minus_alpha: tuple[float, ...]  # sqrt(1 - a_t)
    x0_coef: tuple[float, ...]
    eps_coef: tuple[float, ...]
    sigma: tuple[float, ...]

    def __len__(self) -> int:
        return len(self.timesteps)


def ddim_table(p: WMAPreset, sched: DDIMScheduler, steps: int, eta: float) -> DDIMTable:
    """The coefficients of `DDIMTable` for `steps` trailing timesteps of `sched` (its alpha_bar table)."""
    if not 0.0 <= eta <= 1.0:
        raise ValueError(f"eta={eta!r} is not allowed; allowed values: a number in [0, 1]")
    sched.set_timesteps(steps)
    ts = [int(t) for t in sched.timesteps.tolist()]  # descending: 999, 979, ..., 19 at 50 steps
    ac = sched.alphas_cumprod.double().tolist()  # the same float32 table diffusers steps with, read exactly
    final = float(sched.final_alpha_cumprod)  # alpha_bar[0] (set_alpha_to_one=False), upstream's last a_prev
    cols = {k: [] for k in ("sqrt_alpha", "sqrt_one_minus_alpha", "x0_coef", "eps_coef", "sigma")}
    for j, t in enumerate(ts):
        prev = ts[j + 1] if j + 1 < len(ts) else None
        a_t = ac[t]
        a_prev = ac[prev] if prev is not None else final
        r = dynamic_rescale(p, prev) / dynamic_rescale(p, t) if p.use_dynamic_rescale and prev is not None else 1.0
        inner = (1.0 - eta**2) * (1.0 - a_t) + eta**2 * a_t * (1.0 - a_prev) / a_prev
        cols["sqrt_alpha"].append(math.sqrt(a_t))
        cols["sqrt_one_minus_alpha"].append(math.sqrt(1.0 - a_t))
        cols["x0_coef"].append(math.sqrt(a_prev) * r)
        cols["eps_coef"].append(math.sqrt((1.0 - a_prev) / (1.0 - a_t) * inner))
        cols["sigma"].append(eta * math.sqrt((1.0 - a_prev) / (1.0 - a_t) * (1.0 - a_t / a_prev)))
    return DDIMTable(timesteps=tuple(ts), **{k: tuple(v) for k, v in cols.items()})


def ddim_update(table: DDIMTable, j: int, x: torch.Tensor, v: torch.Tensor, gen: torch.Generator | None,
                noise: torch.Tensor | None = None):
    """One DDIM step of the video latents from the v-prediction `v`; returns (x_prev, pred_x0).

    The noise (when sigma > 0) is `noise` if given, else drawn from `gen`.
    """
    sa, s1a = table.sqrt_alpha[j], table.sqrt_one_minus_alpha[j]
    x0 = sa * x - s1a * v
    eps = sa * v + s1a * x
    x_prev = table.x0_coef[j] * x0 + table.eps_coef[j] * eps
    if table.sigma[j] > 0.0:
        if noise is None:  # the same draw as diffusers' step: randn of the output's shape, dtype and device
            noise = torch.randn(v.shape, generator=gen, device=v.device, dtype=v.dtype)
        x_prev = x_prev + table.sigma[j] * noise
    return x_prev, x0


VIDEO_COEFS = ("sqrt_alpha", "sqrt_one_minus_alpha", "x0_coef", "eps_coef", "sigma")  # columns of `video_coef_table`
HEAD_COEFS = ("sqrt_beta", "sqrt_alpha", "inv_sqrt_alpha", "sqrt_alpha_prev", "dir_coef")  # of `head_coef_table`


def video_coef_table(table: DDIMTable, device=None) -> torch.Tensor:
    """`table`'s coefficients as a float32 [steps, 5] tensor (columns `VIDEO_COEFS`), for `update_step`.

    float32 is what `ddim_update` multiplies with: a Python float times a float32 tensor is rounded to float32 first
    (round to nearest, as here), so a row of this table gives the same products."""
    rows = [[getattr(table, k)[j] for k in VIDEO_COEFS] for j in range(len(table))]
    return torch.tensor(rows, dtype=torch.float64).to(torch.float32).to(device)


def head_coef_table(sched: DDIMScheduler, timesteps, device=None) -> torch.Tensor:
    """A head's diffusers DDIM step (`DDIMScheduler.step`, epsilon prediction, clip_sample, eta 0 as the pipeline
    calls it) at each of `timesteps`, as a float32 [steps, 5] tensor of coefficients (columns `HEAD_COEFS`), computed
    with the operations `step` evaluates them with (float32 0-dim tensors on the CPU), so that

      x0     = (sample - sqrt_beta * eps) / sqrt_alpha        (CPU; CUDA: * inv_sqrt_alpha, see `update_step`)
      x0     = x0.clamp(-clip_sample_range, clip_sample_range)
      x_prev = sqrt_alpha_prev * x0 + dir_coef * eps

    is `step` bit for bit. `sched.set_timesteps(len(timesteps))` must have run (prev_timestep is `step`'s
    t - num_train_timesteps // num_inference_steps, not the next entry of `timesteps`)."""
    c = sched.config
    if c.prediction_type != "epsilon" or not c.clip_sample or c.thresholding:
        raise ValueError(f"head_coef_table supports the heads' epsilon, clip_sample, no-thresholding DDIM; got "
                         f"prediction_type={c.prediction_type!r}, clip_sample={c.clip_sample!r}, "
                         f"thresholding={c.thresholding!r}")
    if sched.num_inference_steps != len(timesteps):
        raise ValueError(f"the scheduler is set to {sched.num_inference_steps} steps, not {len(timesteps)}: call "
                         f"set_timesteps first")
    eta = 0.0  # what the pipeline steps the heads with (step's default)
    rows = []
    for t in timesteps:
        t = int(t)
        prev = t - c.num_train_timesteps // sched.num_inference_steps
        alpha_prod_t = sched.alphas_cumprod[t]
        alpha_prod_t_prev = sched.alphas_cumprod[prev] if prev >= 0 else sched.final_alpha_cumprod
        beta_prod_t = 1 - alpha_prod_t
        sqrt_alpha = alpha_prod_t ** (0.5)
        # CUDA divides a tensor by a CPU scalar as a multiplication by its float32 reciprocal (div_true_kernel_cuda)
        inv_sqrt_alpha = torch.ones((), dtype=sqrt_alpha.dtype) / sqrt_alpha
        std_dev_t = eta * sched._get_variance(t, prev) ** (0.5)
        dir_coef = (1 - alpha_prod_t_prev - std_dev_t**2) ** (0.5)
        rows.append(torch.stack([beta_prod_t ** (0.5), sqrt_alpha, inv_sqrt_alpha, alpha_prod_t_prev ** (0.5),
                                 dir_coef.to(sqrt_alpha.dtype)]))
    return torch.stack(rows).to(torch.float32).to(device)
