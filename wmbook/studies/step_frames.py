"""Notebook 03's frames where it claims quality (trained world presets): a held-out episode's ground truth, the
full-step run's prediction and the chosen point's (the reference solver's knee), small and embedded, with each
frame's PSNR against the truth; then a frame comparer of the truth against the chosen point."""

from __future__ import annotations

import numpy as np

from .. import display as wd
from ..check import frame_psnr
from .steps import axis, knee_table, world_eval


def chosen_point(sweep):
    """The reference solver's knee (its first curve's), else the full-step run."""
    kt = knee_table(sweep)
    label = kt["knee"].iloc[0] if len(kt) else None
    return next((r for r in sweep.results if r.point.label == label), sweep.reference)


def show_frames(cfg, pipe, sweep, columns: int = 6) -> str:
    """Draw the strip and the comparer on a trained world preset; returns what was shown, or why nothing was."""
    import matplotlib.pyplot as plt  # noqa: PLC0415  heavy: matplotlib.pyplot

    weval, why = world_eval()
    if weval is None or not sweep.has_quality:
        return why or (f"No frames shown: `{cfg.preset.name}` has random weights, so there is no ground truth and its "
                       f"frames say nothing about quality (the deviation table above is solver error).")
    ax = axis(cfg)
    kw = {"num_blocks": cfg.options.blocks} if cfg.options.blocks else {}
    case = weval.heldout_case(cfg.workload, pipe, cfg.seed + 1000, **kw)
    chosen = chosen_point(sweep)
    rows = [("ground truth", case.target)]
    for label, r in (("full steps", sweep.reference), (f"chosen: {chosen.point.label}", chosen)):
        if r is chosen and r is sweep.reference:
            continue
        rows.append((label, weval.predict(cfg.workload, pipe, case, **ax.kwargs(r.point))))
    t = case.target.shape[0]
    picks = sorted(set(np.linspace(0, t - 1, min(columns, t)).round().astype(int).tolist()))
    fig, axes = plt.subplots(len(rows), len(picks), figsize=(1.5 * len(picks), 1.65 * len(rows)), squeeze=False)
    for (label, video), axrow in zip(rows, axes):
        psnr = frame_psnr(case.target, video) if video is not case.target else None
        for j, (i, a) in enumerate(zip(picks, axrow)):
            a.imshow(video[i])
            a.set_xticks([]), a.set_yticks([])
            a.set_title(f"frame {i}" + (f"\n{psnr[i]:.1f} dB" if psnr is not None and np.isfinite(psnr[i]) else ""),
                        fontsize=7)
            if j == 0:
                a.set_ylabel(label, fontsize=8)
    fig.suptitle(f"Held-out episode (seed {cfg.seed + 1000}): each frame's PSNR against the truth", fontsize=9)
    fig.tight_layout()
    plt.show()
    wd.frame_comparer(case.target, rows[-1][1], labels=("ground truth", rows[-1][0]))
    return (f"Frames of one held-out episode: the truth, the full-step run and `{chosen.point.label}` (the "
            f"{ax.solvers[0]} knee), each frame's PSNR against the truth under it.")
