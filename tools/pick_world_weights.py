"""Pick the trained world-model run to ship: of the given weights files (each with its .pt.json provenance beside it),
the one whose held-out evaluation beats the copy-last-frame baseline on PSNR and SSIM by the widest PSNR margin; its
.pt, .pt.json and .loss.csv are copied into DEST (default data/weights/). Exit 1, copying nothing, when none beats
copy-last.

    python tools/pick_world_weights.py /root/wA/world-wma.pt /root/wB/world-wma.pt [--dest data/weights]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path


def margin(meta: dict) -> float | None:
    """PSNR margin over copy-last when the model beats it on PSNR and SSIM, else None."""
    ev = meta.get("eval") or {}
    m, b = ev.get("model") or {}, ev.get("copy_last") or {}
    if None in (m.get("psnr"), b.get("psnr"), m.get("ssim"), b.get("ssim")):
        return None
    if m["psnr"] > b["psnr"] and m["ssim"] > b["ssim"]:
        return m["psnr"] - b["psnr"]
    return None


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("weights", nargs="+", type=Path)
    ap.add_argument("--dest", type=Path, default=Path("data/weights"))
    a = ap.parse_args(argv)
    best = None
    for w in a.weights:
        meta_path = w.with_name(w.name + ".json")
        if not w.is_file() or not meta_path.is_file():
            print(f"{w}: missing (the run did not finish)")
            continue
        meta = json.loads(meta_path.read_text())
        ev = meta.get("eval", {})
        mg = margin(meta)
        print(f"{w}: model {ev.get('model')} vs copy-last {ev.get('copy_last')} -> "
              + ("beats copy-last by %.2f dB" % mg if mg is not None else "does not beat copy-last"))
        if mg is not None and (best is None or mg > best[0]):
            best = (mg, w, meta)
    if best is None:
        print("no run beats copy-last: nothing copied")
        return 1
    _, w, meta = best
    a.dest.mkdir(parents=True, exist_ok=True)
    for src in (w, w.with_name(w.name + ".json"), w.with_name(meta.get("loss_csv") or w.stem + ".loss.csv")):
        if src.is_file():
            shutil.copy2(src, a.dest / src.name)
            print(f"copied {src} -> {a.dest / src.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
