"""Inside one denoiser forward: its split by fine labels and categories, and the forward/decode shares of a region."""

from __future__ import annotations

import re

import numpy as np
import pandas as pd

from ..trace import Trace, ancestors_named
from .region import Region, select, work

FORWARD_LABEL = "DiffusionModel_Forward"
DIT_FINE_LABELS = (
    "DiT_Embeddings", "DiT_Norm_Modulation", "DiT_SelfAttn_QKV_RoPE", "DiT_KV_Cache_Update", "DiT_Attention",
    "DiT_CrossAttn", "DiT_Action", "DiT_FFN", "DiT_Head",
)  # fmt: skip
DECODE_LABEL_RE = r"VAE_Decode|Decode_First_Stage"


def _names_parent(trace: Trace):
    L = trace.labels
    return L["name"].tolist(), L["parent"].to_numpy(np.int64)


def forward_anchor(trace: Trace, forward_label: str = FORWARD_LABEL) -> np.ndarray:
    """Per label: the nearest ancestor-or-self named forward_label (-1 when the label is outside every forward)."""
    names, par = _names_parent(trace)
    return trace.memo(("anchor", forward_label), lambda: ancestors_named(par, names, {forward_label}))


def in_forward(trace: Trace, label_idx, forward_label: str = FORWARD_LABEL) -> np.ndarray:
    """Mask over label indices (-1 = unlabelled): launched/started inside a forward_label range."""
    anc = forward_anchor(trace, forward_label)
    return np.array([anc[i] >= 0 if i >= 0 else False for i in np.asarray(label_idx, dtype=np.int64)], dtype=bool)


def forward_count(trace: Trace, region: str | Region | None = None, forward_label: str = FORWARD_LABEL) -> int:
    """Occurrences of forward_label inside the region."""
    reg = region if isinstance(region, Region) else select(trace, region)
    names = trace.labels["name"].tolist()
    return sum(1 for i in range(len(names)) if names[i] == forward_label and reg.label_inside(i))


def _forward_work(trace: Trace, reg: Region, forward_label: str, fine_labels) -> tuple[pd.DataFrame, int, float]:
    """(work rows inside forwards with their fine_label, forwards in the region, summed time of those rows in ms)."""
    fine = tuple(fine_labels or ())
    frame = work(trace, reg)
    names, par = _names_parent(trace)
    fine_anc = trace.memo(("fine_anchor", fine), lambda: ancestors_named(par, names, set(fine)))
    lab = frame["label"].to_numpy(np.int64) if len(frame) else np.zeros(0, dtype=np.int64)
    mask = in_forward(trace, lab, forward_label)
    fine_of = np.array([names[fine_anc[i]] if i >= 0 and fine_anc[i] >= 0 else "untagged" for i in lab], dtype=object)
    fw = frame[mask].assign(fine_label=fine_of[mask]) if len(frame) else frame.assign(fine_label=[])
    total_ms = float(fw["duration_us"].sum()) / 1e3 if len(fw) else 0.0
    return fw, forward_count(trace, reg, forward_label), total_ms


def forward_split(trace, region: str | Region | None = None, forward_label: str = FORWARD_LABEL,
                  fine_labels=DIT_FINE_LABELS) -> pd.DataFrame:
    """Time per forward by fine label (the innermost of `fine_labels` around the work, else 'untagged'):
    fine_label, ms_per_forward, share, kernels_per_forward (kernels only, not memcpy/memset). attrs: forwards (in
    the region), forward_ms (time per forward), forward_total_ms (time of every forward)."""
    trace = Trace.load(trace)
    reg = region if isinstance(region, Region) else select(trace, region)
    fw, n_fwd, total_ms = _forward_work(trace, reg, forward_label, fine_labels)
    rows = []
    fsum = fw.groupby("fine_label")["duration_us"].agg(["sum", "count"]) if len(fw) else None
    if fsum is not None and trace.source == "gpu":  # launches per forward count kernels, not memcpy/memset
        fsum["count"] = fw[fw["kind"] == "kernel"].groupby("fine_label").size().reindex(fsum.index, fill_value=0)
    for fl in list(tuple(fine_labels or ())) + ["untagged"]:
        if fsum is None or fl not in fsum.index:
            continue
        ms = float(fsum.at[fl, "sum"]) / 1e3
        rows.append({"fine_label": fl, "ms_per_forward": ms / max(n_fwd, 1),
                     "share": ms / total_ms if total_ms > 0 else float("nan"),
                     "kernels_per_forward": float(fsum.at[fl, "count"]) / max(n_fwd, 1)})
    out = pd.DataFrame(rows, columns=["fine_label", "ms_per_forward", "share", "kernels_per_forward"])
    out = out.sort_values("ms_per_forward", ascending=False).reset_index(drop=True)
    out.attrs.update(forwards=n_fwd, forward_ms=total_ms / max(n_fwd, 1) if n_fwd else float("nan"),
                     forward_total_ms=total_ms)
    return out


def forward_categories(trace, region: str | Region | None = None, forward_label: str = FORWARD_LABEL,
                       fine_labels=DIT_FINE_LABELS) -> pd.DataFrame:
    """ms per forward by fine label (rows) and category (columns)."""
    trace = Trace.load(trace)
    reg = region if isinstance(region, Region) else select(trace, region)
    fw, n_fwd, _ = _forward_work(trace, reg, forward_label, fine_labels)
    if not len(fw):
        return pd.DataFrame()
    return fw.pivot_table(index="fine_label", columns="category", values="duration_us", aggfunc="sum",
                          fill_value=0.0) / 1e3 / max(n_fwd, 1)


def _has_ancestor(par, names, i, rx) -> bool:
    while i >= 0:
        if rx.search(names[i]):
            return True
        i = par[i]
    return False


def decode_ms(trace, region: str | Region | None = None, decode_label_re: str | None = DECODE_LABEL_RE) -> float:
    """Time of the region's work launched under a label matching decode_label_re (the VAE decode)."""
    trace = Trace.load(trace)
    reg = region if isinstance(region, Region) else select(trace, region)
    frame = work(trace, reg)
    rx = re.compile(decode_label_re) if decode_label_re else None
    if rx is None or not len(frame):
        return 0.0
    names, par = _names_parent(trace)
    mask = np.array([_has_ancestor(par, names, i, rx) for i in frame["label"].to_numpy(np.int64)], dtype=bool)
    return float(frame.loc[mask, "duration_us"].sum()) / 1e3


def part_categories(trace, region: str | Region | None = None, forward_label: str = FORWARD_LABEL,
                    decode_label_re: str | None = DECODE_LABEL_RE) -> pd.DataFrame:
    """ms of the region's work by category (rows) and part (columns): the denoiser's forwards (under
    `forward_label`), the decoder (under a label matching decode_label_re) and the rest; each column's total is its
    share of the busy time's sum. The denoiser and the decoder are optimized separately: this says which one a
    category's time belongs to."""
    trace = Trace.load(trace)
    reg = region if isinstance(region, Region) else select(trace, region)
    frame = work(trace, reg)
    if not len(frame):
        return pd.DataFrame()
    names, par = _names_parent(trace)
    fwd = re.compile(rf"^{re.escape(forward_label)}$")
    dec = re.compile(decode_label_re) if decode_label_re else None
    labels = frame["label"].to_numpy(np.int64)
    is_dec = np.array([dec is not None and _has_ancestor(par, names, i, dec) for i in labels], dtype=bool)
    is_fwd = np.array([_has_ancestor(par, names, i, fwd) for i in labels], dtype=bool) & ~is_dec
    part = np.where(is_dec, "decoder", np.where(is_fwd, "denoiser forwards", "rest"))
    t = frame.assign(part=part).pivot_table(index="category", columns="part", values="duration_us", aggfunc="sum",
                                            fill_value=0.0) / 1e3
    t = t.reindex(columns=[c for c in ("denoiser forwards", "decoder", "rest") if c in t.columns])
    return t.loc[t.sum(axis=1).sort_values(ascending=False).index]


def generated_units(trace, region: str | Region | None = None) -> tuple[int, str]:
    """(count, unit) of what one generation is made of inside the region: blocks (labels ending `Block_<i>`, causal
    DiT) or else sampling passes (labels ending `Pass`, the DDIM two-pass loop)."""
    trace = Trace.load(trace)
    reg = region if isinstance(region, Region) else select(trace, region)
    names = trace.labels["name"].tolist()
    blocks = [i for i in range(len(names)) if re.search(r"Block_\d+$", names[i]) and reg.label_inside(i)]
    if blocks:
        return len(blocks), "block"
    return sum(1 for i in range(len(names)) if names[i].endswith("Pass") and reg.label_inside(i)), "pass"
