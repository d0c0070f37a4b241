"""Ranked findings from a Breakdown, each naming the notebook that addresses it."""

from __future__ import annotations

import math

import pandas as pd

from .launches import SHORT_KERNEL_US

# thresholds
IDLE_SHARE_MIN = 0.10  # GPU idle share of the region worth attacking
HOST_BOUND_RATIO = 0.70  # busy / span below this: the GPU waits on the host
SHORT_SHARE_MIN = 0.40  # share of kernels under SHORT_KERNEL_US
COPY_SHARE_MIN = 0.05
FUSABLE_SHARE_MIN = 0.15  # normalization + elementwise
ATTN_SHARE_MIN = 0.15
GEMM_FRAC_MIN = 0.50  # achieved / ceiling
FORWARD_SHARE_MIN = 0.50  # denoiser forwards' share of the region -> fewer steps pays
VAE_SHARE_MIN = 0.15

NOTEBOOKS = {
    "03": "03_step_reduction", "04": "04_compile_autocast", "05": "05_triton_kernels",
    "06": "06_cuda_graphs",
}  # fmt: skip


def suggest(bd) -> pd.DataFrame:
    """Findings ranked by estimated saving (ms of device or host time per analysed region)."""
    s = bd.stats
    cat = bd.categories.set_index("category")
    busy = s.get("busy_ms") or 0.0
    rows = []

    def add(finding, evidence, saving, nb, action):
        rows.append({"finding": finding, "evidence": evidence, "estimated_saving_ms": float(max(saving, 0.0)),
                     "notebook": NOTEBOOKS[nb], "action": action})

    def sh(c):
        return float(cat.at[c, "share"]) if c in cat.index and not math.isnan(cat.at[c, "share"]) else 0.0

    def ms(c):
        return float(cat.at[c, "ms"]) if c in cat.index else 0.0

    basis = bd.basis

    idle_share = s.get("idle_share")
    if idle_share is not None and not math.isnan(idle_share) and idle_share >= IDLE_SHARE_MIN:
        add("GPU idle inside the region", f"idle {s['idle_ms']:.1f} ms = {idle_share:.0%} of the GPU span",
            s["idle_ms"], "06", "capture the block loop in CUDA graphs; remove host work between launches")
    bh = s.get("busy_over_host")
    if bh is not None and not math.isnan(bh) and bh < HOST_BOUND_RATIO:
        add("launch-bound: host enqueue slower than the GPU",
            f"GPU busy {s['busy_union_ms']:.1f} ms over {s['host_ms']:.1f} ms of host time ({bh:.0%}); "
            f"{s['kernels_per_forward']:.0f} kernels per forward", s["host_ms"] - s["busy_union_ms"], "06",
            "CUDA graphs (06) or torch.compile fusion (04) to cut launches per forward")
    sks = s.get("short_kernel_share")
    if sks is not None and not math.isnan(sks) and sks >= SHORT_SHARE_MIN:
        add("many tiny kernels", f"{sks:.0%} of kernels run under {SHORT_KERNEL_US:.0f} us "
            f"({s['short_kernel_time_share']:.0%} of busy time)", busy * s["short_kernel_time_share"] * 0.5, "04",
            "torch.compile (regional) to fuse pointwise chains")
    if sh("copy/cast") >= COPY_SHARE_MIN or (s.get("casts_per_forward") or 0) > 50:
        cpf = s.get("casts_per_forward")
        add("copies and dtype casts", f"copy/cast {sh('copy/cast'):.0%} of {basis} time ({ms('copy/cast'):.1f} ms); "
            f"{cpf:.0f} aten::to/_to_copy/copy_ per forward" if cpf == cpf else f"copy/cast {sh('copy/cast'):.0%}",
            ms("copy/cast") * 0.7, "04", "dtype hygiene: keep tensors in the model dtype, drop round trips")
    fus = sh("normalization") + sh("elementwise/activation")
    if fus >= FUSABLE_SHARE_MIN:
        add("normalization + elementwise time", f"{fus:.0%} of {basis} time "
            f"({ms('normalization') + ms('elementwise/activation'):.1f} ms)",
            (ms("normalization") + ms("elementwise/activation")) * 0.5, "05",
            "fused Triton kernels (norm+modulation, RoPE, gated residual)")
    rf = bd.roofline.set_index("category") if len(bd.roofline) else pd.DataFrame()
    if sh("attention") >= ATTN_SHARE_MIN:
        frac = rf.at["attention", "frac_of_ceiling"] if "attention" in rf.index else float("nan")
        saving = ms("attention") * (1 - min(1.0, (frac / 0.6) if frac == frac else 0.5))
        add("attention time", f"attention {sh('attention'):.0%} of {basis} time"
            + (f", {frac:.0%} of the ceiling" if frac == frac else ""), saving, "04",
            "attention backends (flash/cuDNN/FlexAttention) in 04; fused kernels in 05")
    if "GEMM/linear" in rf.index:
        frac = rf.at["GEMM/linear", "frac_of_ceiling"]
        if frac == frac and frac < GEMM_FRAC_MIN and ms("GEMM/linear") > 0:
            add("GEMMs below the measured ceiling", f"{rf.at['GEMM/linear', 'tflops']:.3g} TFLOP/s = {frac:.0%} "
                f"of the measured {rf.at['GEMM/linear', 'ceiling_tflops']:.3g} TFLOP/s",
                ms("GEMM/linear") * (1 - frac / GEMM_FRAC_MIN), "04",
                "bf16 weights/autocast, max-autotune compile, larger fused GEMMs")
    fs = s.get("forward_share")
    if fs is not None and fs == fs and fs >= FORWARD_SHARE_MIN:
        fpb = s.get("forwards_per_block")
        saving = busy * fs / fpb if fpb and fpb == fpb and fpb > 1 else busy * fs * 0.25
        unit = s.get("forward_unit", "block")
        add("denoiser forwards dominate", f"forwards {fs:.0%} of {basis} time"
            + (f", {fpb:.1f} forwards per {unit}" if fpb == fpb else ""), saving, "03",
            f"fewer denoising steps (one fewer step saves about one forward per {unit})")
    ds = s.get("decode_share")
    if ds is not None and ds == ds and ds >= VAE_SHARE_MIN:
        add("VAE decode", f"decode {ds:.0%} of {basis} time ({s['decode_ms']:.1f} ms)", s["decode_ms"] * 0.4, "04",
            "VAE in bf16 with a PSNR check, channels_last, compile")
    if (s.get("syncs_in_forward") or 0) > 0:
        add("host-device syncs inside the forward", f"{s['syncs_in_forward']} host reads of device values "
            f"(aten::_local_scalar_dense), {s['syncs_per_forward']:.0f} per forward",
            0.05 * s["syncs_in_forward"], "04", "remove .item()/host reads from the loop")
    out = pd.DataFrame(rows, columns=["finding", "evidence", "estimated_saving_ms", "notebook", "action"])
    out = out.sort_values("estimated_saving_ms", ascending=False).reset_index(drop=True)
    out.insert(0, "rank", range(1, len(out) + 1))
    return out

