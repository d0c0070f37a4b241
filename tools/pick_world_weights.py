"""Pick the trained world-model run to ship: of the given weights files (each with its .pt.json provenance beside it),
the one that passes the shipping rule on its held-out evaluation (wmbook.world.eval.SHIPPING_RULE: PSNR and SSIM
above copy-last's, agent error at most half of copy-last's) by the widest PSNR margin; its .pt, .pt.json and
.loss.csv replace those in DEST (default data/weights/), all or none (wmbook.world.weights.ship_weights). Exit 1,
copying nothing, when none passes.

    python tools/pick_world_weights.py /root/wA/world-wma.pt /root/wB/world-wma.pt [--dest data/weights]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from wmbook.errors import InputError, command


def margin(meta: dict) -> float | None:
    """PSNR margin over copy-last when the run passes the shipping rule, else None."""
    from wmbook.world.eval import shipping_failures

    ev = meta.get("eval") or {}
    m, b = ev.get("model") or {}, ev.get("copy_last") or {}
    if shipping_failures(m, b):
        return None
    return m["psnr"] - b["psnr"]


@command("pick_world_weights.py")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("weights", nargs="+", type=Path)
    ap.add_argument("--dest", type=Path, default=Path("data/weights"))
    a = ap.parse_args(argv)
    from wmbook.paths import check_output_dir
    from wmbook.world.weights import ship_weights

    check_output_dir(a.dest, "--dest")
    best = None
    for w in a.weights:
        meta_path = w.with_name(w.name + ".json")
        if not w.is_file() or not meta_path.is_file():
            print(f"{w}: missing (the run did not finish)")
            continue
        try:
            meta = json.loads(meta_path.read_text())
        except (ValueError, UnicodeDecodeError) as e:
            raise InputError(f"{str(meta_path)!r} is not allowed: not a JSON provenance file ({e}); allowed values: "
                             f"the .pt.json python -m wmbook.train writes beside its weights") from None
        ev = meta.get("eval", {}) if isinstance(meta, dict) else {}
        mg = margin(meta) if isinstance(meta, dict) else None
        print(f"{w}: model {ev.get('model')} vs copy-last {ev.get('copy_last')} -> "
              + ("passes the shipping rule, PSNR +%.2f dB" % mg if mg is not None
                 else "does not pass the shipping rule"))
        if mg is not None and (best is None or mg > best[0]):
            best = (mg, w, meta)
    if best is None:
        print("no run passes the shipping rule: nothing copied")
        return 1
    _, w, _ = best
    for dst in ship_weights(w, a.dest / w.name):
        print(f"shipped {dst}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
