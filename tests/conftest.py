"""Shared fixtures."""

import os

import pytest
import torch

_workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1") or 1)
if _workers > 1:  # pytest-xdist (`make test`): the cores shared between the workers, not each worker taking them all,
    _threads = max(1, len(os.sched_getaffinity(0)) // _workers)
    torch.set_num_threads(_threads)
    # and the notebook kernels the tests start (their own processes) too: oversubscribed OpenMP threads spin, and a
    # tiny notebook took 6x its time alone next to another worker
    for _var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_var, str(_threads))

if not torch.cuda.is_available():  # the fused kernels (wmbook.kernels) run in Triton's CPU interpreter; set before
    os.environ.setdefault("TRITON_INTERPRET", "1")  # anything imports triton


def pytest_addoption(parser):
    parser.addoption("--slow", action="store_true", default=False,
                     help="also run the tests marked slow (`make test-all`; WMBOOK_SLOW_TESTS=1 does the same)")


def pytest_configure(config):
    config.addinivalue_line("markers", "slow: a full tiny-preset notebook run or a long interpreter check, covered in "
                                       "`make test` by a shorter case; run with --slow (`make test-all`)")
    config.addinivalue_line("markers", "numerics: compares results of bf16/fp16 arithmetic or of library kernels the "
                                       "CPU picks (oneDNN, ATen's vectorized code) with stored numbers or across code "
                                       "paths; `make test-isa` runs these with older instruction sets too")


def slow_enabled(config) -> bool:
    """Whether this run includes the slow cases (--slow, or WMBOOK_SLOW_TESTS=1)."""
    return bool(config.getoption("--slow") or os.environ.get("WMBOOK_SLOW_TESTS") == "1")


SLOW_REASON = "slow: `make test-all` (pytest --slow) runs it; `make test` has a shorter case"


# the modules whose tests start processes or run notebooks (10-60 s a test on 2 cores) run first, so that a run does
# not end on one of them while the other worker has nothing left
LONG_MODULES = ("test_notebooks", "test_distributed", "test_steps_notebook", "test_report_render", "test_ladder_reuse",
                "test_regenerate", "test_rows_house")


def pytest_collection_modifyitems(config, items):
    """`make test` (and CI) stays under 15 minutes on 2 cores: the slow cases are skipped, saying how to run them;
    the long modules go first (a stable sort: every xdist worker collects the same order)."""
    items.sort(key=lambda item: item.module.__name__.rpartition(".")[2] not in LONG_MODULES
               if item.module is not None else True)
    if slow_enabled(config):
        return
    skip = pytest.mark.skip(reason=SLOW_REASON)
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny shapes run faster and far steadier on a shared 2-core box on one thread (restored after the module)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def labels_on():
    """Labels switched on for one test (restored after)."""
    from wmbook.profiling.labels import labels_enabled, set_labels

    was = labels_enabled()
    set_labels(True)
    yield
    set_labels(was)


def _decode_blocks(decoder, latents, blocks):
    """A streaming decoder's outputs for consecutive latent blocks of the given sizes: [frames per block]."""
    outs, f0 = [], 0
    for n in blocks:
        outs.append(decoder.decode_block(latents[:, :, f0:f0 + n]))
        f0 += n
    return outs


def _stream(decoder, latents, blocks):
    """A streaming decoder's frames for the latents decoded from a reset stream in blocks of the given sizes."""
    decoder.reset()
    return torch.cat(_decode_blocks(decoder, latents, blocks), 2)


def _mg2_decoder_bench(stack, device="cpu", backend="aot_eager"):
    """The tiny mg2 preset's decoder bench (wmbook.studies.decoder) with the decoder variants `stack` applied:
    (its streaming decoder, the variants' context)."""
    from wmbook import variants, workloads  # noqa: PLC0415
    from wmbook.studies.decoder import decoder_bench  # noqa: PLC0415

    wl = workloads.get("mg2")
    ref = wl.reference_pipeline(wl.presets["tiny"], torch.device(device))
    bench = decoder_bench(ref, wl)
    ctx = variants.VariantContext(workload=wl, device=torch.device(device), compile_backend=backend)
    for v in variants.resolve(stack, wl, device):
        v.apply(bench, ctx)
    return bench.decoder, ctx


@pytest.fixture(scope="session")
def decode_blocks():
    """decode_blocks(decoder, latents [B, C, F, h, w], block sizes) -> the decoded frames of each block."""
    return _decode_blocks


@pytest.fixture
def poisoned(monkeypatch):
    """torch.empty_like hands out NaN-filled tensors (a kernel launcher's output): an element the kernel leaves
    unwritten fails the comparison."""
    empty_like = torch.empty_like

    def nan_empty_like(*args, **kwargs):
        t = empty_like(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t

    monkeypatch.setattr(torch, "empty_like", nan_empty_like)


@pytest.fixture(scope="session")
def run_uninterpreted():
    """run(code, stdin="") -> CompletedProcess of `python -c code` from the repository root without the Triton
    interpreter (there the kernels' ops are triton_ops, as on a GPU host; nothing in it may launch a kernel)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])

    def run(code: str, stdin: str = ""):
        return subprocess.run([sys.executable, "-c", code], input=stdin, text=True, capture_output=True, env=env,
                              cwd=root, timeout=300)

    return run


def load_tool(name: str):
    """tools/<name>.py imported as a module (the tools are scripts, not a package)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(name, Path(__file__).resolve().parents[1] / "tools" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod
