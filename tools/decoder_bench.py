"""The decoder table (wmbook.studies.decoder) outside a notebook: seeded latents decoded by every decoder stack at a
preset's shape, ms per steady block against the decoder's FLOP floor, PSNR against the fp32 decoder.

    PYTHONPATH=$PWD python3 tools/decoder_bench.py --preset mg2-universal --blocks 5 --repeats 5 --csv out.csv

Prints the table last. --stacks picks rows by label substring (comma-separated); --modes adds compile modes.
--no-search takes cuDNN's algorithm search out of every row (cuDNN's heuristics pick the algorithms): PyTorch keeps
the algorithm it first picked for a convolution shape for the whole process, so the rows with and without the search
compare only across two runs, e.g. `--stacks "(compiled step)"` once with and once without --no-search.
"""

from __future__ import annotations

import argparse
import sys

import torch

from wmbook import device as wdev
from wmbook import workloads
from wmbook.errors import command
from wmbook.models.flops import wan_decoder_flops
from wmbook.studies import decoder as study


@command("decoder_bench.py")
def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="mg2-universal")
    ap.add_argument("--blocks", type=int, default=5, help="blocks per decoded stream (the first is not steady)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--modes", default="default", help="vae-compile modes: default,max-autotune-no-cudagraphs")
    ap.add_argument("--stacks", default="", help="only rows whose label contains one of these (comma-separated)")
    ap.add_argument("--kernels", default="", help="print the top kernels of rows whose label contains these")
    ap.add_argument("--no-search", action="store_true", help="every row without cudnn-benchmark (see above)")
    ap.add_argument("--csv", default=None)
    a = ap.parse_args(argv)
    if a.blocks < 2 or a.repeats < 1 or a.warmup < 0:
        ap.error("--blocks must be >= 2, --repeats >= 1, --warmup >= 0")
    wl = workloads.get("mg2")
    dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    preset = wl.presets[a.preset]
    ceilings = wdev.measure_ceilings(dev, quick=dev.type != "cuda")
    ref = wl.reference_pipeline(preset, dev)
    del ref.model, ref.clip  # the decoder rows need the VAE only
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    k = preset.num_frame_per_block
    lat = torch.randn(1, 16, a.blocks * k, *preset.latent_hw, generator=torch.Generator().manual_seed(0)).to(dev)
    stacks = study.decoder_stacks(wl, dev, compile_modes=tuple(a.modes.split(",")))
    if a.stacks:
        keep = [s.strip() for s in a.stacks.split(",")]
        stacks = {lbl: s for i, (lbl, s) in enumerate(stacks.items()) if i == 0 or any(x in lbl for x in keep)}
    if a.no_search:
        stacks = {lbl.replace(" + cudnn-benchmark", "") + (" (cuDNN heuristics)" if "cudnn-benchmark" in s else ""):
                  [n for n in s if n != "cudnn-benchmark"] for lbl, s in stacks.items()}
    rows = study.run_decoder_table(ref, wl, lat, stacks, warmup=a.warmup, repeats=a.repeats)
    t = study.decoder_table(rows, wan_decoder_flops(preset), ceilings)
    if a.csv:
        t.to_csv(a.csv)
    import pandas as pd

    with pd.option_context("display.width", 250, "display.max_columns", 30, "display.precision", 3):
        print(f"{ceilings.get('device_name', dev)} | {preset.name} | floor {t.attrs['floor_ms']:.3g} ms per block")
        print(t.drop(columns=["stack"]).to_string())
    print(study.interpret(t))
    print(study.category_account(rows, t.attrs["conv_floor_ms"]))
    cats = study.categories(rows)
    if len(cats):
        with pd.option_context("display.width", 250, "display.max_columns", 30, "display.precision", 2):
            print("GPU kernel ms of one steady block by category:")
            print(cats.to_string())
            for r in rows:
                if a.kernels and any(x in r.label for x in a.kernels.split(",")) and r.kernels is not None:
                    print(f"top kernels: {r.label}")
                    print(r.kernels[["name", "ms", "count", "category"]].to_string())
    return 0


if __name__ == "__main__":
    sys.exit(main())
