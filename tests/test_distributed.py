"""wmbook.distributed on CPUs: gloo ranks started by torchrun, tiny presets, checked against the single-process run;
jobs refused before any process starts; failing, dying and hanging ranks end the job in bounded time, named."""

import time

import pytest
import torch

from wmbook.distributed import LAYOUTS, NO_MULTICAST_ENV, JobError, JobFailed, JobSpec, check_job, run_job
from wmbook.profiling.aggregate import aggregate_reports


def _spec(**kw):
    base = dict(workload="mg2", preset="tiny", layout="stage-split", nproc=2, device="cpu", stack=("bf16",),
                compile_backend="eager", blocks=3, warmup=1, repeats=2)
    return JobSpec(**{**base, **kw})


@pytest.mark.parametrize("change,message", [
    ({"layout": "ring"}, "layout='ring' is not allowed; allowed values: ['data-parallel', 'decoder-split', "
                         "'dit-pipeline', 'pipeline-split', 'stage-split']"),
    ({"layout": "pipeline-split", "nproc": 3}, "nproc=3 is not allowed for layout 'pipeline-split'; allowed values: "
                                              ">= 4"),
    ({"layout": "pipeline-split", "nproc": 5}, "nproc=5 is not allowed for layout 'pipeline-split' at preset 'tiny' "
                                              "(2 layers); allowed values: 4..4"),
    ({"layout": "decoder-split"}, "nproc=2 is not allowed for layout 'decoder-split'; allowed values: >= 3"),
    ({"layout": "decoder-split", "nproc": 10}, "nproc=10 is not allowed for layout 'decoder-split' at preset 'tiny' "
                                              "(8 latent rows); allowed values: 3..9"),
    ({"nproc": 3}, "nproc=3 is not allowed for layout 'stage-split'; allowed values: 2"),
    ({"nproc": 0}, "nproc=0 is not allowed; allowed values: an integer >= 1"),
    ({"layout": "dit-pipeline", "nproc": 4}, "nproc=4 is not allowed for layout 'dit-pipeline' at preset 'tiny' (2 "
                                            "layers); allowed values: 2..3"),
    ({"workload": "motion", "preset": "tiny-motion"}, "needs a workload with ['streaming_decoder']"),
    ({"workload": "wma", "preset": "tiny-wma"}, "allowed layouts for it: ['data-parallel']"),
    ({"preset": "wma"}, "preset='wma' is not a preset of workload 'mg2'"),
    ({"device": "cuda"}, "nproc=2 needs 2 GPUs (one per rank); this host has 0"),
    ({"device": "tpu"}, "device='tpu' is not allowed"),
    ({"blocks": 1}, "blocks=1 is not allowed; allowed values: an integer >= 2"),
    ({"batches": (1, 0)}, "batches=0 is not allowed"),
    ({"timeout_s": float("inf")}, "timeout_s=inf is not allowed; allowed values: a finite number of seconds > 0"),
    ({"stack": ("no-such-variant",)}, "stack: "),
    ({"fault": {"rank": 5, "at": "run", "kind": "raise"}}, "fault="),
])
def test_bad_jobs_refused_before_any_process(change, message, tmp_path):
    spec = _spec(**change)
    with pytest.raises(JobError) as e:
        check_job(spec, gpus=0)
    assert message in str(e.value)
    with pytest.raises(JobError):
        run_job(spec, tmp_path / "jobs", progress=False)
    # nothing started, nothing written
    assert not (tmp_path / "jobs").exists() or not any((tmp_path / "jobs").iterdir())


def test_layouts_and_multicast_off():
    assert set(LAYOUTS) == {"stage-split", "data-parallel", "dit-pipeline", "decoder-split", "pipeline-split"}
    assert NO_MULTICAST_ENV == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                "NVSHMEM_DISABLE_NVLS": "1"}


def test_stage_split_on_gloo_equals_the_single_process_run(tmp_path):
    # with decode-first, as notebook 06's stack: each block's latents leave before its cache refresh
    res = run_job(_spec(stack=("bf16", "decode-first")), tmp_path, progress=False, timeout_s=500)
    den, dec = res.ranks
    assert (den["rank"], den["role"], dec["role"]) == (0, "denoiser", "decoder")
    assert dec["bit_equal"] and dec["max_abs_diff"] == 0.0  # the split changes no arithmetic
    assert dec["frames_per_block"] == den["single"]["frames_per_block"] == [9, 12, 12]
    assert dec["fps"]["n"] == 2 and dec["fps"]["median"] > 0 and dec["first_frame_ms"]["median"] > 0
    assert den["wire"]["bytes"] == 1 * 16 * 3 * 4 * 8 * 4  # one block's clean latents, fp32 on the CPU
    for r in res.ranks:  # a timeline per rank, a session report per rank
        assert {s["what"] for s in r["spans"]} <= {"denoise", "wait", "decode"} and r["spans"]
    agg = aggregate_reports(res.job_dir / "sessions", write=False)
    assert agg.world_size == 2 and agg.missing_ranks == []
    waits = agg.stages.set_index("path")
    assert waits.filter(like="Wait_For_Latents", axis=0)["rank_1"].notna().all()  # the decoder's wait for data
    assert (res.job_dir / "job.json").exists()


def test_dit_pipeline_on_gloo_two_ranks_the_second_also_decodes(tmp_path):
    """Two ranks: layer 0 on rank 0, layer 1 and the decoder on rank 1; latents and frames bit-equal to the
    single-process run (the pipeline changes no arithmetic); the ranges come from rank 0's measured layer times."""
    res = run_job(_spec(layout="dit-pipeline", blocks=2, warmup=0, repeats=1), tmp_path, progress=False,
                  timeout_s=500)
    first, second = res.ranks
    assert (first["role"], second["role"]) == ("DiT layers 0-0", "DiT layers 1-1 + decoder")
    assert first["layer_ranges"] == second["layer_ranges"] == [[0, 1], [1, 2]] and len(first["layer_ms"]) == 2
    assert second["latents_bit_equal"] and second["bit_equal"] and second["max_abs_diff"] == 0.0
    assert first["hidden_dtype"] == "bfloat16"  # the stack's bf16: one block's hidden state [1, 3 x 16 tokens, 64]
    assert first["wire"]["bytes"] == 1 * 3 * 16 * 64 * 2
    assert {s["what"] for s in second["spans"]} == {"denoise", "decode", "wait"}


def test_decoder_split_on_gloo_two_strips_equal_the_whole_decoder(tmp_path):
    """Three ranks: rank 0 denoises, ranks 1 and 2 decode the top and bottom halves of the frame with halo exchange;
    the gathered frames are the single-process run's up to the convolutions' rounding on other shapes (gate 45 dB),
    and the last rank counts FPS and the first frame from the slower strip."""
    from wmbook.distributed.decoder_split import strip_rows

    res = run_job(_spec(layout="decoder-split", nproc=3, blocks=3, warmup=0, repeats=1), tmp_path, progress=False,
                  timeout_s=500)
    den, top, bottom = res.ranks
    assert (den["role"], top["role"], bottom["role"]) == ("denoiser", "decoder rows 0-3 of 8", "decoder rows 4-7 of 8")
    assert den["latents_bit_equal"]  # the denoiser's arithmetic is the single-GPU run's
    assert bottom["psnr_db"] >= 45 and bottom["frames_per_block"] == den["single"]["frames_per_block"] == [9, 12, 12]
    assert bottom["fps"]["n"] == 1 and bottom["fps"]["median"] > 0 and bottom["first_frame_ms"]["median"] > 0
    assert top["halo_exchanges_per_run"] == bottom["halo_exchanges_per_run"] > 0
    assert {s["what"] for s in top["spans"]} == {"wait", "decode"}
    agg = aggregate_reports(res.job_dir / "sessions", write=False)
    assert agg.world_size == 3 and agg.missing_ranks == []
    # the notebook's tables, sentences and rows of such a job; its bound: the decode shared by the two strips
    import pandas as pd

    from wmbook.studies import multi_gpu, multi_gpu_report

    cfg = multi_gpu.validate(workload="mg2", layout="decoder-split", device="cpu", blocks=3, warmup=0, repeats=1,
                             output_dir=str(tmp_path / "out"), results_path=str(tmp_path / "r.csv"))
    assert cfg.options.nproc == 3  # auto on a CPU: the layout's fewest ranks
    single = den["single"]
    want = single["frames_per_block"][-1] / max(single["denoise_ms"]["median"], single["decode_ms"]["median"] / 2)
    assert multi_gpu.stream_table(res).attrs["bound_fps"] == pytest.approx(want * 1e3)
    assert "decoder split over 3 GPUs" in multi_gpu.stream_table(res).index[1]
    assert any("2 strip ranks" in x for x in multi_gpu.interpretation(cfg, res))
    assert list(multi_gpu.rank_table(res)["role"]) == ["denoiser", "decoder rows 0-3 of 8", "decoder rows 4-7 of 8"]
    rows = pd.DataFrame(multi_gpu.result_rows(cfg, res.spec, dict(enumerate(res.ranks))))
    assert set(rows.loc[rows["metric"] == "fps", "variant"]) == {"one GPU", "decoder-split x3"}
    assert "slowest strip" in multi_gpu_report.findings(rows).next
    assert strip_rows(44, 2) == [(0, 22), (22, 44)] and strip_rows(44, 3) == [(0, 15), (15, 30), (30, 44)]
    with pytest.raises(ValueError, match="does not split into 45 strips"):
        strip_rows(44, 45)


@pytest.mark.slow
def test_decoder_split_takes_strips_of_unequal_rows(tmp_path):
    """Four ranks, three strips of the tiny preset's 8 latent rows (3, 3 and 2): the middle block's gather pads the
    shorter strip; the frames are the single-process run's within the gate. With vae-compile in the stack the strip
    decoders compile too, their graphs broken at the halo exchanges. (`make test`'s shorter cases: two equal strips,
    and the pipeline split's two halves.)"""
    res = run_job(_spec(layout="decoder-split", nproc=4, blocks=2, warmup=0, repeats=1, stack=("bf16", "vae-compile")),
                  tmp_path, progress=False, timeout_s=500)
    suffix = ", compiled between its halo exchanges"
    assert [r["role"] for r in res.ranks[1:]] == ["decoder rows 0-2 of 8" + suffix, "decoder rows 3-5 of 8" + suffix,
                                                  "decoder rows 6-7 of 8" + suffix]
    assert res.ranks[-1]["psnr_db"] >= 45 and res.ranks[0]["latents_bit_equal"]


@pytest.mark.slow  # four ranks on a 2-core box; its two halves are make test's dit-pipeline and decoder-split cases
def test_pipeline_split_on_gloo_four_ranks_two_stages_two_halves(tmp_path):
    """The 4-GPU layout: the DiT's two layers on ranks 0 and 1, the frame's halves decoded on ranks 2 and 3 with halo
    exchange; latents bit-equal, frames within the gate; the bound shares the decode between the halves."""
    from wmbook.studies import multi_gpu

    res = run_job(_spec(layout="pipeline-split", nproc=4, blocks=2, warmup=0, repeats=1), tmp_path, progress=False,
                  timeout_s=500)
    roles = [r["role"] for r in res.ranks]
    assert roles == ["DiT layers 0-0", "DiT layers 1-1", "decoder rows 0-3 of 8", "decoder rows 4-7 of 8"]
    assert res.ranks[1]["latents_bit_equal"] and res.ranks[3]["psnr_db"] >= 45
    assert res.ranks[3]["frames_per_block"] == [9, 12] and res.ranks[3]["fps"]["median"] > 0
    assert not multi_gpu.layer_table(res)["also decodes"].any()
    r0, single = res.ranks[0], res.ranks[0]["single"]
    shares = [sum(r0["layer_ms"][a:b]) / sum(r0["layer_ms"]) for a, b in r0["layer_ranges"]]
    want = multi_gpu.pipeline_bound(len(single["forward_ms"][-1]), single["denoise_ms"]["median"],
                                    single["decode_ms"]["median"] / 2, single["frames_per_block"][-1], shares, False)
    assert multi_gpu.stream_table(res).attrs["bound_fps"] == pytest.approx(want)
    assert multi_gpu.stream_table(res).index[1] == "DiT pipeline + decoder halves over 4 GPUs"


def test_split_layers_balances_the_busiest_rank():
    from wmbook.distributed.pipeline import dit_ranks, split_layers

    assert split_layers([1.0] * 30, 3) == [(0, 10), (10, 20), (20, 30)]
    assert split_layers([1.0] * 30, 2, tail=10.0) == [(0, 20), (20, 30)]  # the rank that also decodes takes fewer
    assert split_layers([5.0, 1, 1, 1, 1, 1], 2) == [(0, 1), (1, 6)]
    assert [dit_ranks(n) for n in (2, 3, 4)] == [2, 2, 3]
    with pytest.raises(ValueError, match="parts=3 is not allowed; allowed values: 1..2"):
        split_layers([1.0, 1.0], 3)


def test_pipeline_bound_counts_the_chain_and_the_busiest_rank():
    """4 forwards of 20 ms, decode 60 ms: with a decoder rank of its own and 2 equal stages the chain (3 + 1/2
    forwards, 70 ms) sets the period; with the decode on the second stage the decode joins the chain (60 + 70)."""
    from wmbook.studies.multi_gpu_report import pipeline_bound

    assert pipeline_bound(4, 80.0, 60.0, 12, [0.5, 0.5], decoder_shares_last=False) == pytest.approx(12 / 70 * 1e3)
    assert pipeline_bound(4, 80.0, 60.0, 12, [0.5, 0.5], decoder_shares_last=True) == pytest.approx(12 / 130 * 1e3)


def test_data_parallel_rollouts_on_gloo(tmp_path):
    # no warm-up iteration: the test reads bit-equality and speeds > 0, not how fast (share_compiles still runs each
    # batch size once untimed on one rank)
    spec = _spec(workload="wma", preset="tiny-wma", layout="data-parallel", ddim_steps=2, batches=(1, 2), warmup=0,
                 repeats=1)
    res = run_job(spec, tmp_path, progress=False, timeout_s=500)
    for r in res.ranks:
        assert [b["batch"] for b in r["batches"]] == [1, 2]
        assert all(b["bit_equal_to_rank0"] and b["episodes_per_s"] > 0 for b in r["batches"])
    assert "alone_episodes_per_s" in res.ranks[0]["batches"][0]  # one rank alone, measured in the same job
    assert "alone_episodes_per_s" not in res.ranks[1]["batches"][0]
    # the sweep's compiles split over the ranks before it (one batch size each here), its frames unchanged by that
    assert [res.ranks[r]["compiled_batches"] for r in (0, 1)] == [[1], [2]]


# the fault tests' runs as short as a job allows: rank 0 runs its single-process reference before it waits on rank 1
FAULT_RUN = {"blocks": 2, "warmup": 0, "repeats": 1}


@pytest.mark.parametrize("kind,first", [("raise", "RuntimeError: injected fault on rank 1 at 'start'"),
                                        ("exit", "exited with code 13, without a result or an error of its own")])
def test_a_failing_or_dying_rank_ends_the_job_named(kind, first, tmp_path):
    t0 = time.monotonic()
    with pytest.raises(JobFailed) as e:
        run_job(_spec(fault={"rank": 1, "at": "start", "kind": kind}, **FAULT_RUN), tmp_path, progress=False,
                timeout_s=300)
    assert time.monotonic() - t0 < 120
    assert str(e.value).split("failed: ", 1)[1].startswith(f"rank 1: {first}")  # the root cause first
    assert set(e.value.failures) == {0, 1} and e.value.partial == {}  # the other rank was stopped: no result


def test_a_hanging_rank_ends_the_job_at_the_timeout(tmp_path):
    t0 = time.monotonic()
    with pytest.raises(JobFailed) as e:
        run_job(_spec(timeout_s=5, fault={"rank": 1, "at": "start", "kind": "hang"}, **FAULT_RUN), tmp_path,
                progress=False, timeout_s=300)
    assert time.monotonic() - t0 < 150
    assert "Timed out" in e.value.failures[0] and "signal 15" in e.value.failures[1]


def test_a_job_past_its_wall_limit_is_stopped(tmp_path):
    with pytest.raises(JobFailed, match="ran past timeout_s=3 s and was stopped"):
        run_job(_spec(fault={"rank": 1, "at": "start", "kind": "hang"}), tmp_path, progress=False, timeout_s=3)


def test_notebook_batches_parameter_takes_the_command_lines_forms():
    """`-p batches 4` arrives as an int and `-p batches 1,2,4` as a string: both are the list they spell; anything
    else is refused naming the parameter."""
    from wmbook.params import ParameterError
    from wmbook.studies import multi_gpu

    for given, want in ((4, (4,)), ("1,2,4", (1, 2, 4)), ([1, 2], (1, 2))):
        assert multi_gpu.validate(workload="wma", device="cpu", batches=given).options.batches == want
    for bad in ("1,x", "", 0, "1,0", True):
        with pytest.raises(ParameterError, match="batches="):
            multi_gpu.validate(workload="wma", device="cpu", batches=bad)


def _rollouts(psnrs, batches=(1,)):
    """A data-parallel job's result as its ranks return it: rank r's frames psnrs[r] dB from rank 0's (inf: equal)."""
    from pathlib import Path

    from wmbook.distributed import JobResult

    def summ(m):
        return {"median": m, "p20": m * 0.99, "p80": m * 1.01, "p95": m * 1.02, "n": 5}

    ranks = []
    for r, db in enumerate(psnrs):
        rows = []
        for b in batches:
            row = {"batch": b, "iteration_ms": summ(360.0 * b ** 0.5), "episodes_per_s": b / (0.36 * b ** 0.5),
                   "bit_equal_to_rank0": db == float("inf"), "psnr_vs_rank0_db": db}
            if r == 0:
                row |= {"alone_iteration_ms": summ(350.0 * b ** 0.5), "alone_episodes_per_s": b / (0.35 * b ** 0.5)}
            rows.append(row)
        ranks.append({"rank": r, "batches": rows, "busy_ms": {"median": 2000.0}, "wall_ms": {"median": 2100.0}})
    spec = _spec(workload="wma", preset="tiny-wma", layout="data-parallel", nproc=len(psnrs), batches=batches)
    return JobResult(spec=spec, job_dir=Path("."), ranks=ranks, wall_s=1.0)


def test_data_parallel_gate_is_45_db_against_rank_0_and_rows_carry_iteration_spreads():
    """Ranks on different GPUs may round differently (kernels picked by timing them on each GPU): the rows' gate is
    45 dB of rank 0's frames, not bit-equality; the iteration times are stored with their spread; one batch size is
    not read as a sweep."""
    import pandas as pd

    from wmbook.studies import multi_gpu, multi_gpu_report

    cfg = multi_gpu.validate(workload="wma", device="cpu", batches="1")
    for psnrs, gate, shown in (((float("inf"), float("inf")), "pass", "bit-equal"),
                               ((float("inf"), 47.25), "pass", "47.2 dB, pass"),
                               ((float("inf"), 40.0), "fail", "40.0 dB, fail")):
        res = _rollouts(psnrs)
        t = multi_gpu.rollout_table(res)
        assert t.loc[1, "frames vs rank 0"] == shown and t.loc[1, "one GPU alone, iteration ms"] == "350 (346-354)"
        rows = multi_gpu.result_rows(cfg, res.spec, dict(enumerate(res.ranks)))
        total = next(r for r in rows if r["variant"] == "data-parallel x2, batch 1" and r["metric"] == "episodes_per_s")
        assert total["gate"] == gate
        assert any(r["metric"] == "psnr_vs_rank0_db" for r in rows) == (shown != "bit-equal")
        one = next(r for r in rows if r["variant"] == "one GPU, batch 1" and r["metric"] == "iteration_ms")
        assert (one["median"], one["p20"], one["p80"]) == (350.0, 346.5, 353.5)
        text = " ".join(multi_gpu.interpretation(cfg, res))
        assert "One batch size was run" in text and ("bit-equal to rank 0's" in text) == (shown == "bit-equal")
        f = multi_gpu_report.findings(pd.DataFrame(rows))  # the report's findings, read back from the rows
        assert ("bit-equal to rank 0's" if shown == "bit-equal" else f"{shown.split(',')[0]} (gate {gate})") \
            in f.headline and "One batch size was run" in f.next
    text = " ".join(multi_gpu.interpretation(cfg, _rollouts((float("inf"),) * 2, batches=(1, 2, 4))))
    assert "still grow at the largest batch run (4:" in text


def test_batch_sweep_says_where_one_gpus_throughput_stops_growing():
    """The knee: the last batch before a step of the sweep adds less than 10% (two H200s, notebook 06's wma stack at
    2+2: 2.83, 3.23, 3.26, 3.44 episodes/s at batches 1, 2, 4, 8: growth stops past batch 2); the notebook and the
    published findings say the same sentence."""
    import pandas as pd

    from wmbook.studies import multi_gpu_report

    eps = pd.Series({1: 2.83, 2: 3.23, 4: 3.26, 8: 3.44})
    assert multi_gpu_report.batch_knee(eps) == (2, False)
    assert multi_gpu_report.batch_knee(pd.Series({1: 1.0, 2: 1.5, 4: 2.0})) == (4, True)
    text = multi_gpu_report.sweep_sentence(eps)
    assert "stop growing past batch **2** (1.14x batch 1)" in text and "3.44 at batch 8" in text
    rows = [{"workload": "wma", "preset": "wma", "variant": v, "metric": "episodes_per_s", "value": x, "gate": g}
            for b, e in eps.items()
            for v, x, g in ((f"data-parallel x2, batch {b}", 2 * e, "pass"), (f"one GPU, batch {b}", e, ""))]
    assert multi_gpu_report.findings(pd.DataFrame(rows)).next == text


def test_layout_bounds_count_the_steps_that_wait_for_each_other():
    """A block of 4 forwards (3 steps + the refresh) over P DiT ranks: (3 + 1/P) forwards; the decoder over D ranks:
    decode / D; the bound is the slower of the two."""
    from wmbook.studies import multi_gpu

    b = multi_gpu.layout_bounds(4, denoise_ms=80.0, decode_ms=60.0, frames=12, max_gpus=4)
    assert list(b.index) == [(2, 1, 1), (3, 2, 1), (3, 1, 2), (4, 3, 1), (4, 2, 2), (4, 1, 3)]
    assert b.loc[(2, 1, 1), "bound FPS"] == pytest.approx(12 / 80.0 * 1e3)
    assert b.loc[(4, 3, 1), "DiT ms a block"] == pytest.approx(20.0 * (3 + 1 / 3))
    assert b.loc[(4, 2, 2), "decode ms a block"] == pytest.approx(30.0)
    assert (b["limited by"] == "DiT").all()  # 70 ms of denoising at best against 60 of decoding


def test_stage_split_findings_bound_four_gpus_from_the_stored_stage_times():
    """The published findings read the bound of 4 GPUs from a streaming run's rows (one GPU's stage times; a steady
    block's frames from the preset); rows without them say nothing."""
    import pandas as pd

    from wmbook.studies import multi_gpu_report

    def row(variant, metric, value):
        return {"workload": "mg2", "preset": "mg2-universal", "variant": variant, "metric": metric, "value": value}

    run = pd.DataFrame([row("one GPU", "denoise_ms_per_block", 90.0), row("one GPU", "decode_ms_per_block", 73.8),
                        row("stage-split x2", "bound_fps", 12 / 90.0 * 1e3)])
    text = multi_gpu_report._more_gpus(run)
    assert "4 GPUs 160 FPS (3 DiT + 1 decoder ranks, limited by the DiT)" in text and "only to 3 + 1/P" in text
    assert multi_gpu_report._more_gpus(run.iloc[:1]) == ""  # no decode time stored


def test_published_block_keeps_each_layouts_latest_run():
    """A newer run of one layout does not hide another layout's run of the same workload and preset."""
    import json

    import pandas as pd

    from wmbook import results
    from wmbook.studies import multi_gpu_report

    rows = []
    for run, layout, when, fps in (("r1aaaaaaaaaa", "stage-split", "2026-01-01", 134.0),
                                   ("r2aaaaaaaaaa", "dit-pipeline", "2026-01-02", 82.0)):
        for variant, value in ((f"{layout} x2", fps), ("one GPU", 72.0)):
            rows.append(results.make_row(notebook="08_multi_gpu", workload="mg2", preset="mg2-universal",
                                         variant=variant, metric="fps", value=value, unit="frames/s",
                                         params={"layout": layout})
                        | {"device_kind": "cuda", "device_name": "GPU A", "run_id": run, "timestamp": when,
                           "git_commit": "abc", "params": json.dumps({"layout": layout})})
    text = "\n".join(multi_gpu_report.published(pd.DataFrame(rows)))
    assert "| stage-split x2 | 134 |" in text and "| dit-pipeline x2 | 82 |" in text


@pytest.mark.parametrize("visible,local,gpu", [(None, 1, "1"), ("4,5,6", 2, "6"), ("GPU-a, GPU-b", 1, "GPU-b"),
                                               ("3", 0, "3")])
def test_each_rank_starts_over_seeing_its_own_gpu_as_cuda0(visible, local, gpu):
    """A rank's GPU becomes its only visible one (so compiled graphs, keyed by their inputs' device, are `cuda:0`
    graphs in every rank and load from the cache another rank filled), in the environment the rank starts over with
    (CUDA reads the visible set once per process); the host's numbering (or UUIDs) kept; no second start."""
    from wmbook.distributed.worker import RANK_GPU_ENV, own_gpu, own_gpu_env

    env = {"PATH": "/bin"} | ({} if visible is None else {"CUDA_VISIBLE_DEVICES": visible})
    new = own_gpu_env(local, env)
    assert new == env | {"CUDA_VISIBLE_DEVICES": gpu, RANK_GPU_ENV: gpu}
    assert own_gpu_env(local, new) is None
    if torch.cuda.device_count() != 1:
        with pytest.raises(RuntimeError, match="exactly its own GPU, it sees"):
            own_gpu(new)


def test_every_layout_has_its_runner():
    """A rank imports its layout's module when it runs it (worker.RUNNERS): every layout names one that exists."""
    from wmbook.distributed import worker

    assert set(worker.RUNNERS) == set(LAYOUTS)
    assert all(callable(worker.runner(name)) for name in LAYOUTS)
