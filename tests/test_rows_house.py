"""The results rows of notebooks 03, 05, 06, 07 and 08 on the tiny presets equal those of the code before the package
was restructured ("the house"), wherever they do not depend on timing or on the CPU's floating-point kernels.

tests/data/rows_tiny_before_house.csv was written by commit bd4f4cb with tests/data/rows_house_recipe.py (its
docstring says what each notebook runs there and what it leaves out: the trained world presets, notebook 05's kernel
table and Triton rows, the CUDA-graph rows); each test below runs the same recipe against the current API (rows_03 ...
rows_08; notebook 07's result_rows is now wmbook.studies.motion_report's only). About 70 s on 2 cores, 08's
multi-process job a third of it. Compared:

- exactly: the set of rows (notebook, workload, preset, variant, metric, and num_envs for notebook 07's scaling
  points), units, gate verdicts, the rows' params (the run's settings and, for notebook 03, each point's sampling
  keyword arguments, the next notebook's input), num_envs and source, and every value that depends on neither timing
  nor kernels: forward counts and knees (03), bytes per step and the bytes floor at the given copy ceiling (07), bytes
  on the wire and whether the split's frames are bit-equal (08);
- within bf16's unit roundoff (`BF16_U`, as in tests/test_rows_before_after.py): the statistics of bf16 rounding, the
  rel-L2 against fp32 of a bf16 stack's forward and the PSNR of its frames (through their RMSE, `_same_psnr`);
- within `FP32_TOL` (512 fp32 eps, about 6e-5), absolute, the fp32 errors (each a relative error already: rel-L2,
  or an RMSE in units of the data range): notebook 03's deviations between samplers (several fp32 model forwards and
  a decode apart), the fp32 decoders' PSNR against each other (06) and the motion fetch's error against float64 (07,
  whose gate verdicts, compared exactly, hold it to the fp32 budget). Two CPUs' fp32 kernels (other vector widths,
  other accumulation orders) move these by far less (with oneDNN and ATen held to AVX2, by at most 2% of it); a
  machine's exact rounding is never asked for;
- timings (ms, s, FPS, speedups, shares of the fetch's time, x the floor) only for being there and finite where they
  were.

A PSNR row that a notebook leaves out when the frames are bit-equal (06's and 05's `psnr_db` and `decoder_psnr_db`,
08's `psnr_db`) counts as inf: whether two kernels agree to the last bit is the CPU's to say, not the code's.
Changes on purpose since bd4f4cb, checked explicitly: notebook 06's ladder rows after the old last one
(LADDER_SINCE: the decoder's upsampling fold, its block step and the two frame rows) and its decoder table's
block-step row; the notebooks' parameters added since (PARAMS_SINCE), at their defaults.
"""

import json
import math
from pathlib import Path

import pandas as pd
import pytest
import torch

from wmbook import results

pytestmark = pytest.mark.numerics  # rerun with oneDNN and ATen held to older ISAs: `make test-isa`

BEFORE = Path(__file__).parent / "data" / "rows_tiny_before_house.csv"
BF16_U = torch.finfo(torch.bfloat16).eps / 2  # bf16's unit roundoff, 2**-8
FP32_TOL = 512 * torch.finfo(torch.float32).eps  # 2**-14
CEILINGS = {"gemm_tflops": 1.0, "copy_gbps": 10.0, "sdpa_tflops": 0.5, "device_name": "cpu"}
KEY = ["notebook", "workload", "preset", "variant", "metric", "num_envs"]
KEEP = ["notebook", "workload", "preset", "variant", "metric", "unit", "value", "gate", "rel_l2_vs_fp32",
        "rel_l2_vs_fp64", "num_envs", "source", "params"]
EXACT = {"forwards", "knee_forwards", "bytes_per_step", "bytes_floor_ms", "copy_gbps", "wire_bytes_per_block",
         "frames_bit_equal"}
DEVIATIONS = {"rel_l2_vs_full", "action_rel_l2_vs_full"}  # 03: fp32 error ratios between two sampler runs
PSNR = {"psnr_vs_full", "psnr_db", "decoder_psnr_db"}
BIT_EQUAL_OMITS = {"psnr_db", "decoder_psnr_db"}  # left out where the frames are bit-equal (an infinite PSNR)
# rows changed on purpose since bd4f4cb, each with its reason; every other row must stay as it was.
# notebook 06's graph rows end with decode-first and stream-frames (the same frames, an earlier first frame): its
# ladder has two rows more after the decoder's, and its stand-in row (the captured denoiser's
# graph rows, then the tiny decoder) has the two in its stack, before the stand-in decoder (_since_06)
FRAME_STEPS_SINCE = ("decode-first", "stream-frames")
LADDER_SINCE = ("vae-upsample-fold", "vae-block-step", *FRAME_STEPS_SINCE)


def _bf16(row) -> bool:
    """Whether a row's numbers come from bf16 arithmetic: a bf16 variant in its stack (08: in the ranks' stack)."""
    parts = str(row["variant"]).removeprefix("decoder: ").split(" + ")
    stack = json.loads(row["params"]).get("stack", []) if row["notebook"] == "08_multi_gpu" else []
    return bool({"bf16", "vae-bf16"} & (set(parts) | set(stack)))


def _same_error(got: float, want: float, bf16: bool) -> bool:
    """Two error ratios (rel-L2, RMSE over the data range) within bf16's unit roundoff, or within FP32_TOL."""
    return abs(got - want) <= (BF16_U if bf16 else FP32_TOL)


def _same_psnr(got: float, want: float, bf16: bool) -> bool:
    """Two PSNRs whose RMSEs over the data range, the errors they stand for, are the same error (_same_error); inf
    (bit-equal frames) is an RMSE of 0."""
    return _same_error(10 ** (-got / 20), 10 ** (-want / 20), bf16)


@pytest.fixture(autouse=True, scope="module")
def _one_thread(one_thread):
    """Every test of this module on one thread (tests/conftest.py)."""


@pytest.fixture(scope="module")
def before():
    return _keyed(pd.read_csv(BEFORE, dtype={"gate": str, "source": str, "unit": str}, keep_default_na=False,
                              na_values=[""]))


# parameters added since bd4f4cb, as a run at its defaults records them: checked, then left out of the comparison
PARAMS_SINCE = {"05_triton_kernels": {"compile_ahead": "auto"}, "06_cuda_graphs": {"compile_ahead": "auto"}}


def _keyed(df: pd.DataFrame) -> pd.DataFrame:
    df = df.reindex(columns=KEEP).copy()
    df["num_envs"] = ["" if _text(n) == "" else str(int(float(n))) for n in df["num_envs"]]
    df["params"] = [json.dumps(json.loads(p) if isinstance(p, str) else p, sort_keys=True) for p in df["params"]]
    assert not df.duplicated(KEY).any(), df[df.duplicated(KEY, keep=False)][KEY]
    df.index = pd.MultiIndex.from_frame(df[KEY], names=[f"key_{k}" for k in KEY])
    return df


def _frame(parts: list) -> pd.DataFrame:
    return _keyed(pd.concat([pd.DataFrame(p) for p in parts if len(p)], ignore_index=True))


def _text(v) -> str:
    return "" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v)


def _compare(after: pd.DataFrame, old: pd.DataFrame) -> None:
    """Every row of `old` (the stored rows of one notebook's run) against `after` (this code's), as the module says."""
    keys_old = {k for k in old.index if k[4] not in BIT_EQUAL_OMITS}
    keys_new = {k for k in after.index if k[4] not in BIT_EQUAL_OMITS}
    assert sorted(keys_new - keys_old) == [] and sorted(keys_old - keys_new) == [], "rows added / missing"
    for key in sorted(set(old.index) | set(after.index)):
        was = old.loc[key] if key in old.index else None
        row = after.loc[key] if key in after.index else None
        if was is None or row is None:  # a PSNR row on one side only: bit-equal frames on the other
            have = row if row is not None else was
            value = float(have["value"])
            assert _same_psnr(value, math.inf, _bf16(have)), (key, "only on one side", value)
            continue
        m = key[4]
        for col in ("unit", "gate", "source"):
            assert _text(row[col]) == _text(was[col]), (key, col, row[col], was[col])
        params = json.loads(row["params"])
        for name, value in PARAMS_SINCE.get(key[0], {}).items():
            assert params.pop(name, None) == value, (key, "params", name)
        assert params == json.loads(was["params"]), (key, "params")
        got, want, bf16 = float(row["value"]), float(was["value"]), _bf16(was)
        if m in EXACT:
            assert got == pytest.approx(want, rel=1e-12, abs=0), (key, got, want)
        elif m in PSNR:
            assert _same_psnr(got, want, bf16), (key, got, want)
        elif m in DEVIATIONS:
            assert _same_error(got, want, bf16), (key, got, want)
        else:  # a timing: there, and finite where it was
            assert not math.isnan(got) and (math.isfinite(got) or not math.isfinite(want)), (key, got, want)
        for col in ("rel_l2_vs_fp32", "rel_l2_vs_fp64"):  # the gate's error: a statistic of the row's rounding
            a, b = float(row[col]), float(was[col])
            assert math.isnan(a) == math.isnan(b), (key, col, a, b)
            if not math.isnan(b):
                assert _same_error(a, b, bf16 and col == "rel_l2_vs_fp32"), (key, col, a, b)


def _old(before, notebook: str, workload: str | None = None) -> pd.DataFrame:
    old = before[before["notebook"] == notebook]
    return old[old["workload"] == workload] if workload else old


# --- the recipe (tests/data/rows_house_recipe.py) against the current API ------------------------------------------


STEPS_03 = {"mg2": dict(solvers="renoise,unipc", sampling_steps="1000,666,333;1000,500", shifts="8", blocks=2),
            "wma": dict(solvers="ddim,unipc", sampling_steps="3,1", split_passes=True)}


def rows_03(workload: str, tmp: Path) -> list:
    from wmbook.studies import steps

    cfg = steps.validate(workload=workload, device="cpu", warmup=0, repeats=1, deviation_budget_db=20.0, seed=0,
                         output_dir=str(tmp / f"03-{workload}"), results_path=str(tmp / f"03-{workload}.csv"),
                         **STEPS_03[workload])
    pipe, inputs = steps.build(cfg)
    sweep = steps.run_sweep(cfg, pipe, inputs, progress=False)
    steps.quality(cfg, pipe, sweep, progress=False)
    return [steps.result_rows(sweep)]


def rows_05(tmp: Path) -> list:
    from wmbook.studies import compile as study04
    from wmbook.studies import kernels

    path = tmp / "05-wma.csv"
    cfg = kernels.validate(workload="wma", device="cpu", kernel_table=False, ladder=True, base="bf16",
                           steps="head-conv-gemm", warmup=0, repeats=1, e2e_ddim_steps=1, e2e_repeats=1, seed=0,
                           output_dir=str(tmp / "05-wma"), results_path=str(path))
    kernels.run_ladder(study04.reference(cfg), cfg, CEILINGS)
    return [results.read(path)]


def rows_06(tmp: Path) -> list:
    from wmbook.studies import compile as study04
    from wmbook.studies import decoder as dstudy
    from wmbook.studies import graphs

    path = tmp / "06-mg2.csv"
    cfg = graphs.validate(workload="mg2", device="cpu", base="bf16", compile_backend="eager", warmup=0, repeats=1,
                          e2e_blocks=1, e2e_repeats=1, seed=0, output_dir=str(tmp / "06-mg2"), results_path=str(path))
    ref = study04.reference(cfg)
    graphs.run_ladder(ref, cfg, CEILINGS)
    # graphs.decoder_study without its compiled stacks, as the recipe runs it
    stacks = {k: v for k, v in dstudy.decoder_stacks(cfg.workload, cfg.device).items() if "vae-compile" not in v}
    lat = cfg.workload.decoder_latents(ref, cfg.seed, graphs.e2e_size(cfg))
    drows = dstudy.run_decoder_table(ref, cfg.workload, lat, stacks, warmup=1, repeats=max(2, cfg.repeats // 3),
                                     compile_backend=cfg.options.compile_backend)
    return [results.read(path), dstudy.result_rows(cfg, drows)]


def rows_07(tmp: Path) -> list:
    from wmbook.studies import motion
    from wmbook.studies.motion_report import result_rows  # re-exported by wmbook.studies.motion at bd4f4cb

    cfg = motion.validate(device="cpu", scaling_envs="32,64", warmup=0, repeats=2, profile_warmup=0, profile_active=1,
                          seed=0, output_dir=str(tmp / "07"), results_path=str(tmp / "07.csv"))
    s = motion.setup(cfg, CEILINGS)
    stages = motion.stage_table(motion.profile_fetch(s), cfg)
    lad = motion.run_ladder(s)
    scaling = motion.run_scaling(s, lad)
    return [result_rows(cfg, s, lad, scaling, stages)]


def rows_08(tmp: Path) -> list:
    from wmbook.studies import multi_gpu

    path = tmp / "08-mg2.csv"
    cfg = multi_gpu.validate(workload="mg2", device="cpu", base="bf16", blocks=2, warmup=0, repeats=1, seed=0,
                             output_dir=str(tmp / "08-mg2"), results_path=str(path))
    multi_gpu.run(cfg, progress=False)
    return [results.read(path)]


# --- the tests ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("workload", ["mg2", "wma"])
def test_notebook_03_rows(before, workload, tmp_path):
    old = _old(before, "03_step_reduction", workload)
    assert {"knee_forwards", "forwards", "rel_l2_vs_full"} <= set(old["metric"])
    _compare(_frame(rows_03(workload, tmp_path)), old)


def test_notebook_05_ladder_rows(before, tmp_path):
    old = _old(before, "05_triton_kernels", "wma")
    assert set(old["gate"].dropna()) == {"pass"} and len(old) >= 8
    _compare(_frame(rows_05(tmp_path)), old)


def _since_06(after: pd.DataFrame, old: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """LADDER_SINCE: the ladder rows added after the old last one, checked here (gated, the same metrics as the row
    before, the same frames: the frame rows' PSNR exactly the block step's, the fold's and the block step's within
    the rounding of their fp32 decoder's other convolutions, which the bf16 stack's error dwarfs) and then left out,
    as is the decoder table's block-step row (gated, its PSNR against the fp32 decoder the same error as the
    channels-last row's); the stand-in row renamed in the old rows."""
    ladder = [v for v in old.loc[old["metric"] == "forward_ms", "variant"] if "vae-tiny" not in v.split(" + ")]
    last = max(ladder, key=lambda v: len(v.split(" + ")))
    added = [" + ".join([last, *LADDER_SINCE[:i + 1]]) for i in range(len(LADDER_SINCE))]
    new = after[after["variant"].isin(added)]
    was = set(old.loc[old["variant"] == last, "metric"])
    for v in added:
        assert set(new.loc[new["variant"] == v, "metric"]) == was, v
    assert set(new.loc[new["metric"] == "forward_ms", "gate"]) == {"pass"}
    psnr = after[after["metric"] == "psnr_db"].set_index("variant")["value"].astype(float)
    frames = len(FRAME_STEPS_SINCE)
    for v in added[:-frames]:  # the fold, the block step
        assert _same_psnr(float(psnr.get(v, math.inf)), float(psnr.get(last, math.inf)), bf16=True), v
    assert len({float(psnr.get(v, math.inf)) for v in added[-frames - 1:]}) == 1  # the block step's frames
    dec = "decoder: vae-stream-buffers + vae-channels-last"
    block = after[after["variant"] == dec + " + vae-block-step"]
    assert set(block["gate"].dropna()) == {"pass"}, block
    dpsnr = after[after["metric"] == "decoder_psnr_db"].set_index("variant")["value"].astype(float)
    assert _same_psnr(float(dpsnr.get(dec + " + vae-block-step", math.inf)), float(dpsnr.get(dec, math.inf)), False)
    added.append(dec + " + vae-block-step")
    old = old.copy()
    for v in {v for v in old["variant"] if not v.startswith("decoder:") and "vae-tiny" in v.split(" + ")}:
        parts = v.split(" + ")
        i = parts.index("vae-tiny")
        old.loc[old["variant"] == v, "variant"] = " + ".join([*parts[:i], *FRAME_STEPS_SINCE, *parts[i:]])
    return _keyed(after[~after["variant"].isin(added)]), _keyed(old)


def test_notebook_06_ladder_and_decoder_rows(before, tmp_path):
    old = _old(before, "06_cuda_graphs", "mg2")
    assert {"forward_ms", "psnr_db", "decoder_ms_per_block", "decoder_psnr_db"} <= set(old["metric"])
    parts = rows_06(tmp_path)
    _compare(*_since_06(_frame(parts), old))
    raw = pd.concat([pd.DataFrame(p) for p in parts if len(p)], ignore_index=True)
    ff = raw[raw["metric"] == "first_frame_ms"]  # a median over the end-to-end runs, stored with its spread
    assert len(ff) and ff["p20"].notna().all() and ff["p80"].notna().all()
    assert ((ff["p20"] <= ff["value"]) & (ff["value"] <= ff["p80"])).all()


@pytest.mark.filterwarnings("ignore:Profiler won't be using warmup")  # profile_warmup 0: one traced step is enough
def test_notebook_07_rows(before, tmp_path):
    old = _old(before, "07_motion_data_loading", "motion")
    assert {"bytes_per_step", "bytes_floor_ms", "scaling_fetch_ms"} <= set(old["metric"])
    _compare(_frame(rows_07(tmp_path)), old)


def test_notebook_08_stage_split_rows(before, tmp_path):
    old = _old(before, "08_multi_gpu", "mg2")
    assert {"wire_bytes_per_block", "frames_bit_equal"} <= set(old["metric"])
    _compare(_frame(rows_08(tmp_path)), old)
    assert torch.get_num_threads() == 1


def test_the_stored_rows_cover_every_notebook(before):
    """The stored file holds each notebook's rows (a recipe that lost one would leave its test comparing nothing)."""
    counts = before.groupby(["notebook", "workload"]).size().to_dict()
    assert set(counts) == {("03_step_reduction", "mg2"), ("03_step_reduction", "wma"), ("05_triton_kernels", "wma"),
                           ("06_cuda_graphs", "mg2"), ("07_motion_data_loading", "motion"), ("08_multi_gpu", "mg2")}
    assert min(counts.values()) >= 8
