"""tools/wma_iteration_account.py: its stacks' syntax, refused input, and an iteration's phases adding up."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest
import torch
from conftest import load_tool

from wmbook import variants, workloads

acc = load_tool("wma_iteration_account")


def test_default_stacks_resolve_and_bad_stacks_are_refused():
    wl = workloads.get("wma")
    for text in acc.DEFAULT_STACKS:
        label, names = acc.parse_stack(text)
        assert label and variants.resolve(names, wl, "cuda")
    for bad in ("no-equals", "=tf32", "label="):
        with pytest.raises(argparse.ArgumentTypeError, match="LABEL=variant"):
            acc.parse_stack(bad)
    for argv in (["--rounds", "0"], ["--profile", "-1"], ["--trace", "traces"]):
        with pytest.raises(SystemExit):
            acc.main(argv)
    assert acc.kernel_account(None, None, {}, torch.device("cpu"), 5) is None  # no profile off CUDA


def test_gn_rule_turns_the_one_launch_rule_on_and_the_compile_caches_off_inside_only():
    import torch._functorch.config
    import torch._inductor.config

    from wmbook.kernels import group_norm_silu as gns

    before = (gns._CL_ONE_MAX, torch._inductor.config.fx_graph_cache, torch._functorch.config.enable_autograd_cache)
    assert before[0] == 0  # the launcher's default: the three kernels
    with acc.gn_rule(True):
        assert gns._CL_ONE_MAX == gns._CL_ONE_RULE_MAX > 0
        assert not torch._inductor.config.fx_graph_cache and not torch._functorch.config.enable_autograd_cache
    with acc.gn_rule(False):
        assert (gns._CL_ONE_MAX, torch._inductor.config.fx_graph_cache) == before[:2]
    assert (gns._CL_ONE_MAX, torch._inductor.config.fx_graph_cache,
            torch._functorch.config.enable_autograd_cache) == before
    with pytest.raises(SystemExit):
        acc.main(["--stack", "a=bf16", "--gn-one-launch", "b"])  # not a stack's label


def test_phases_add_up_to_the_iteration():
    p = SimpleNamespace
    out = p(conditioning_ms=5.0, iteration_ms=100.0,
            decision=p(sampling_ms=40.0, decode_ms=0.0, forward_ms=[18.0, 18.0]),
            world=p(sampling_ms=40.0, decode_ms=12.0, forward_ms=[18.0, 17.0]))
    d = acc.phases(out)
    assert d["rest"] == pytest.approx(3.0) and d["UNet forwards"] == pytest.approx(71.0)
    assert sum(d[k] for k in acc.PHASES) == pytest.approx(d["iteration"])


def test_frame_decode_bench_stacks_resolve_and_bad_input_is_refused():
    """tools/frame_decode_bench.py: its default stacks are wma decoder stacks; bad counts and presets are refused
    before any work."""
    bench = load_tool("frame_decode_bench")
    wl = workloads.get("wma")
    for text in bench.DEFAULT_STACKS:
        label, names = variants.parse_labelled_stack(text)
        assert label and variants.resolve(names, wl, "cuda")
    for argv in (["--rounds", "0"], ["--frames", "0"], ["--preset", "mg2-universal"], ["--stack", "no-equals"]):
        with pytest.raises(SystemExit):
            bench.main(argv)
