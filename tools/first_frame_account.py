"""Where a stream's first frame goes: notebook 06's best stack (its default base and graph steps up to the decoder's,
full decoder; without decode-first and stream-frames, which --extra adds) at a
preset, one fresh stream of one block at a time, each part timed with the pipeline's own device events (KV-cache
initialization, each DiT forward of block 0, its decode) beside the host's wall clock of the same call; then streams
of `--blocks` blocks for the steady block against which the first one compares.

    python tools/first_frame_account.py --preset mg2-universal --rounds 10 --out first_frame.csv
    python tools/first_frame_account.py --extra decode-first --out first_frame.csv   # both stacks, side by side
    python tools/first_frame_account.py --extra "decode-first;decode-first,stream-frames"   # three stacks
    python tools/first_frame_account.py --base-extra fp8-static   # a variant that changes the arithmetic, in the base
    python tools/first_frame_account.py --swap vae-compile=vae-window-kernels   # one variant of the stack replaced
    python tools/first_frame_account.py --swap vae-compile=vae-head-gemm,vae-compile   # ... by several

With --extra, the stack plus those variants (each `;`-separated set a row of its own) is measured too, after the
stack in the same process, and gated: its
latents and frames must equal the stack's bit for bit (a variant that only reorders work), else it is reported as
failing and its times do not count. Warm-up (compiles, graph captures) is excluded: `--warmup` one-block streams of
each stack run before its timed ones. Medians with p20-p80 over the rounds; the CSV holds every round.

With --base-extra, variants that change the arithmetic (fp8-static, an attention backend) go into the base before its
compile, as a row of their own; such a row is gated as notebook 06 gates its rows: the last steady stream's frames
against the fp32 reference pipeline's (at least 40 dB; the latents' relative error is printed beside, a generation's
error compounds over its blocks). Every stack's error against the fp32 reference is printed beside.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import torch

from wmbook import workloads
from wmbook.bench import Samples
from wmbook.studies import graphs as study06
from wmbook.variants import GlobalFlags
from wmbook.variants.compile import reset_compile_state
from wmbook.variants.ladder import apply_stack


def _account(out, wall_ms: float) -> dict:
    fwd = out.forward_ms[0]
    row = {"first_frame_ms": out.first_frame_ms, "wall_ms": wall_ms, "block0_ms": out.block_ms[0],
           "decode_ms": out.decode_ms[0],
           "cache_init_ms": out.block_ms[0] - sum(fwd) - out.decode_ms[0]}
    for j, ms in enumerate(fwd):
        row[f"forward{j}_ms"] = ms
    row["forwards_ms"] = sum(fwd)
    return row


def _print_times(k, stack, rows, steady, keys, where, blocks) -> None:
    """One stack's times, printed as soon as it is measured (a later failure keeps them)."""
    print(f"\n{k}: " + " + ".join(map(str, stack)))
    print(f"{k}: first frame of a fresh stream, {where}, median (p20-p80)")
    for key in keys:
        s = Samples([r[key] for r in rows if r["stack"] == k], "ms")
        print(f"  {key:16s} {s.median:8.2f} ({s.p20:.2f}-{s.p80:.2f})")
    print(f"  a steady block (blocks 2-{blocks - 1} of 3 streams of {blocks}):")
    for key in ("block_ms", "forwards_ms", "decode_ms"):
        s = Samples([r[key] for r in steady if r["stack"] == k], "ms")
        print(f"  {key:16s} {s.median:8.2f} ({s.p20:.2f}-{s.p80:.2f})", flush=True)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="mg2-universal")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--rounds", type=int, default=10, help="timed one-block streams per stack (>= 3)")
    ap.add_argument("--warmup", type=int, default=3, help="untimed one-block streams per stack first (>= 1)")
    ap.add_argument("--blocks", type=int, default=8, help="blocks of the steady streams (>= 3)")
    ap.add_argument("--extra", default="", help="comma-separated variants added to the stack as a row of its own; "
                    "several rows separated by ';'")
    ap.add_argument("--base-extra", default="", help="comma-separated variants inserted into the base before its "
                    "compile, as a row of their own (gated against the fp32 reference); several rows separated by ';'")
    ap.add_argument("--swap", default="", help="OLD=NEW: the stack with variant OLD replaced by NEW (comma-separated "
                    "variants: several in its place), as a row of its "
                    "own (gated against the fp32 reference); several rows separated by ';'")
    ap.add_argument("--out", type=Path, default=None, help="CSV of every round")
    a = ap.parse_args(argv)
    for name, lo in (("rounds", 3), ("warmup", 1), ("blocks", 3)):
        if getattr(a, name) < lo:
            ap.error(f"--{name}={getattr(a, name)} is not allowed; allowed values: an integer >= {lo}")
    cfg = study06.validate(workload="mg2", preset=a.preset, device=a.device)
    wl = workloads.get("mg2")
    # notebook 06's best stack before the rows that only change when frames leave (FRAME_STEPS): --extra adds those
    stack = [v for v in [*study06.base_stack(cfg), *study06.graph_steps(cfg)] if v.name not in study06.FRAME_STEPS]
    stacks = {"stack": stack}
    from wmbook import variants

    for row in a.extra.split(";"):
        extra = [v for v in row.split(",") if v]
        if extra:  # names checked before anything is built
            stacks["stack + " + " + ".join(extra)] = variants.resolve([*stack, *extra], wl, cfg.device)
    base = study06.base_stack(cfg)
    arithmetic = set()  # the rows gated against the fp32 reference instead of bit for bit
    for row in a.base_extra.split(";"):
        extra = [v for v in row.split(",") if v]
        if extra:
            k = "stack with " + " + ".join(extra) + " in the base"
            stacks[k] = variants.resolve([*base[:-1], *extra, *stack[len(base) - 1:]], wl, cfg.device)
            arithmetic.add(k)
    for row in a.swap.split(";"):
        if not row:
            continue
        old, sep, new = row.partition("=")
        names = [v.name for v in stack]
        if not sep or old not in names:
            ap.error(f"--swap {row!r}: expected OLD=NEW with OLD one of the stack's variants {names}")
        k = f"stack with {new} for {old}"  # NEW may be several variants, comma-separated, in their order
        stacks[k] = variants.resolve([m for n in names for m in (new.split(",") if n == old else [n])], wl,
                                     cfg.device)
        arithmetic.add(k)
    print("stack:", " + ".join(map(str, stack)), flush=True)
    ref = wl.reference_pipeline(cfg.preset, cfg.device, cfg.seed)

    def stream(pipe, blocks: int):
        inputs = pipe.prepare(blocks, seed=cfg.seed)
        if cfg.device.type == "cuda":
            torch.cuda.synchronize(cfg.device)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = pipe.generate(inputs, progress=False)
        if cfg.device.type == "cuda":
            torch.cuda.synchronize(cfg.device)
        return out, (time.perf_counter() - t0) * 1e3

    # one stack after the other, each built, warmed, timed and dropped before the next: two pipelines with captured
    # CUDA graphs alive at once and replayed in turn did not give the frames each gives alone
    # the process-wide switches a stack's variants set (an attention backend, tf32) go back before the next stack and
    # the fp32 reference run: each is built and run as it would be alone
    flags = GlobalFlags()
    rows, steady, outs = [], [], {}
    dev = torch.cuda.get_device_name(cfg.device) if cfg.device.type == "cuda" else "cpu"
    for k, st in stacks.items():
        flags.restore()
        # compiled code is cached per code object, across copies: every stack compiles afresh, as a ladder row
        # does (a variant that changes only inductor's settings would otherwise run the code of the stack before it)
        reset_compile_state()
        pipe = apply_stack(ref, wl, st, cfg.device, cfg.options.compile_backend)[0]
        for i in range(a.warmup):
            stream(pipe, 1)
        print(f"{k}: warmed up ({a.warmup} streams)", flush=True)
        for i in range(a.rounds):
            out, wall = stream(pipe, 1)
            rows.append({"stack": k, "round": i, **_account(out, wall)})
        for run in range(3):
            out, _ = stream(pipe, a.blocks)
            for b in range(2, a.blocks):
                steady.append({"stack": k, "run": run, "block": b, "block_ms": out.block_ms[b],
                               "forwards_ms": sum(out.forward_ms[b]), "decode_ms": out.decode_ms[b]})
        outs[k] = out
        out.latents, out.frames = out.latents.cpu(), out.frames.cpu()
        del pipe
        if cfg.device.type == "cuda":
            torch.cuda.empty_cache()
        keys = [c for c in rows[0] if c not in ("stack", "round")]
        _print_times(k, stacks[k], rows, steady, keys, f"{cfg.preset.name}, {dev}, {a.rounds} rounds", a.blocks)
    flags.restore()
    # the fp32 reference's stream of the same inputs: what notebook 06's rows are gated against
    ref_out, _ = stream(ref, a.blocks)
    ref_lat, ref_frames = ref_out.latents.cpu(), ref_out.frames.cpu()
    del ref, ref_out
    from wmbook import check

    against_fp32 = {}
    for k, out in outs.items():
        lat = check.compare(out.latents.float(), ref_lat.float(), dtype="fp32")
        fr = check.compare(out.frames.float(), ref_frames.float(), dtype="fp32", frames=True)
        against_fp32[k] = (lat.rel_l2, fr.psnr)
    gate = {}
    base = outs["stack"]
    for k, out in outs.items():
        if k in arithmetic:
            rel, psnr = against_fp32[k]
            ok = psnr >= 40.0
            gate[k] = f"{'pass' if ok else 'FAIL'} (against fp32: frames {psnr:.1f} dB, latents rel L2 {rel:.3g})"
            continue
        same = torch.equal(out.latents, base.latents) and torch.equal(out.frames, base.frames)
        if k == "stack" or same:
            gate[k] = "reference" if k == "stack" else "pass (bit-equal)"
            continue
        # what differs, and by how much: the latents (the DiT's work) or only the decoded frames
        dl = (out.latents.float() - base.latents.float()).abs().max().item()
        df = (out.frames.float() - base.frames.float()).abs()
        psnr = 10 * torch.log10(4.0 / df.pow(2).mean().clamp_min(1e-20)).item()  # frames in [-1, 1]
        gate[k] = f"FAIL (latents max |diff| {dl:.3g}; frames max |diff| {df.max().item():.3g}, {psnr:.1f} dB)"
    print("\ngates (the times above count only where the gate passes):")
    for k in stacks:
        rel, psnr = against_fp32[k]
        err = "" if k in arithmetic else f"; against fp32: frames {psnr:.1f} dB, latents rel L2 {rel:.3g}"
        print(f"  {k} [{gate[k]}{err}]")
    if a.out is not None:
        for r in rows:
            r["gate"] = gate[r["stack"]]
        with a.out.open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=["stack", "round", *keys, "gate"])
            w.writeheader()
            w.writerows(rows)
        with a.out.with_name(a.out.stem + "-steady.csv").open("w", newline="") as f:
            w = csv.DictWriter(f, fieldnames=list(steady[0]))
            w.writeheader()
            w.writerows(steady)
    return 0 if all(not g.startswith("FAIL") for g in gate.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
