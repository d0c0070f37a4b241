"""The published numbers (the README's results at a glance, each published folder's page of tables) are generated
from the results store and kept in step with it."""

from wmbook import headlines, published


def test_readme_glance_and_folder_pages_match_the_stored_rows():
    stale = "stale: run `python -m wmbook.published --write`"
    assert published.readme_block() == published.glance().strip("\n"), f"README's glance table is {stale}"
    for folder, device in published.FOLDER_PAGES.items():
        page = folder / "README.md"
        got = published.readme_block(page, published.BEGIN, published.END)
        assert got == published.markdown(device=device, folder=folder).strip("\n"), f"{page} is {stale}"


def test_glance_reads_the_reference_device_first_and_every_cell_from_the_rows():
    lines = published.glance().splitlines()
    assert lines[0].startswith("| workload | eager | best single-GPU stack | speedup | quality | device | report |")
    devices = [ln.split(" | ")[5] for ln in lines[2:]]
    assert devices and all(d.startswith(("H200", "H100")) for d in devices)
    for ln in lines[2:]:  # the report of each row is a published file
        link = ln.rsplit("(", 1)[-1].split(")")[0]
        assert (published.REPO_ROOT / link).is_file(), ln


def test_published_tables_come_from_rows(tmp_path):
    from wmbook import results

    row = results.make_row(notebook="01_baseline_profiling", workload="mg2", preset="mg2-universal",
                           variant="eager", metric="fps", value=12.5, unit="frames/s",
                           params={"dtype": "bf16"}) | {"device_kind": "cuda", "device_name": "Test GPU"}
    path = tmp_path / "r.csv"
    results.append([row], path)
    md = published.markdown(path)
    assert "| mg2-universal | bf16 | 12.5 |" in md and "Test GPU" in md


def test_notebook_04_parts_combine(tmp_path):
    """04 runs in parts: the latest run with a ladder, and each compile configuration's latest measurement."""
    from wmbook import results

    def row(run, ts, variant, metric, value, **kw):
        return results.make_row(notebook="04_compile_autocast", workload="mg2", preset="mg2-universal",
                                variant=variant, metric=metric, value=value, unit="ms", params={}, **kw) | {
            "device_kind": "cuda", "device_name": "Test GPU", "run_id": run, "timestamp": ts, "git_commit": run}

    rows = [row("r1", "2026-01-01T00:00", "fp32-eager", "forward_ms", 300.0, gate="reference"),
            row("r1", "2026-01-01T00:00", "compile:whole model", "steady_forward_ms", 50.0),
            row("r2", "2026-01-02T00:00", "fp32-eager", "forward_ms", 290.0, gate="reference"),
            row("r2", "2026-01-02T00:00", "bf16", "forward_ms", 80.0, gate="pass"),
            row("r3", "2026-01-03T00:00", "compile:regional, after hygiene", "steady_forward_ms", 45.0),
            row("r4", "2026-01-04T00:00", "compile:whole model", "steady_forward_ms", 47.0)]
    path = tmp_path / "r.csv"
    results.append(rows, path)
    md = published.markdown(path)
    ladder = md.split("**04 · ladder")[1].split("**04 · compile")[0]
    assert "| fp32-eager | reference | - | 290.0 |" in ladder and "| bf16 |" in ladder and "300.0" not in ladder
    comp = md.split("**04 · compile")[1]
    assert "| regional, after hygiene |" in comp and "| 45.0 |" in comp and "| r3 |" in comp
    assert "| 47.0 |" in comp and "| r4 |" in comp and "| 50.0 |" not in comp  # the latest whole-model row


def test_notebook_03_points_and_knees(tmp_path):
    """03: every point of the latest run (time with spread, speedup, deviation, truth where the preset has it) and
    each curve's knee named by the point it stands for (matched on the sampling arguments)."""
    from wmbook import results

    def row(variant, metric, value, params, **spread):
        return results.make_row(notebook="03_step_reduction", workload="mg2", preset="world-mg2", variant=variant,
                                metric=metric, value=value, unit="x", params=params) | spread | {
            "device_kind": "cuda", "device_name": "Test GPU", "run_id": "r1", "timestamp": "2026-01-01T00:00"}

    full = {"sampling": {"denoising_steps": [1000, 500]}, "curve": "euler", "reference": True, "forwards": 3}
    one = {"sampling": {"denoising_steps": [1000]}, "curve": "euler", "reference": False, "forwards": 2}
    knee = {"sampling": {"denoising_steps": [1000]}, "curve": "euler", "criterion": "PSNR within 0.2 dB"}
    rows = [row("steps:euler [1000,500]", "fps", 100.0, full, p20=98.0, p80=103.0),
            row("steps:euler [1000,500]", "speedup_vs_full", 1.0, full),
            row("steps:euler [1000,500]", "psnr_gt", 20.0, full),
            row("steps:euler [1000]", "fps", 150.0, one, p20=149.0, p80=155.0),
            row("steps:euler [1000]", "speedup_vs_full", 1.5, one),
            row("steps:euler [1000]", "psnr_vs_full", 24.25, one),
            row("steps:euler [1000]", "psnr_gt", 19.9, one),
            row("knee:euler", "fps", 150.0, knee), row("knee:euler", "knee_speedup", 1.5, knee),
            row("knee:euler", "knee_forwards", 2.0, knee)]
    path = tmp_path / "r.csv"
    results.append(rows, path)
    md = published.markdown(path)
    assert "**03 · step reduction, mg2 / world-mg2** (Test GPU" in md
    assert "| euler [1000,500] (full steps) | - | 100 (98-103) | 1.00x | - | 20.00 |" in md
    assert "| euler [1000] | - | 150 (149-155) | 1.50x | 24.2 | 19.90 |" in md
    assert "| euler | euler [1000] | 2 | 1.50x | PSNR within 0.2 dB |" in md
    assert "Timing noise" not in md  # no two points of equal work

    # a second solver at the same 2 forwards, 1.4x slower than euler's: the block and the index say the run's noise
    uni = {"sampling": {"denoising_steps": [1000], "solver": "unipc"}, "curve": "unipc", "reference": False,
           "forwards": 2}
    results.append([row("steps:unipc [1000]", "fps", 150.0 / 1.4, uni, p20=100.0, p80=110.0)], path)
    md = published.markdown(path)
    assert ("**Timing noise:** points doing the same work (2 forwards) should take about the same time, yet "
            "`euler [1000]` ran at 150 x and `unipc [1000]` at 107 x, 1.40x apart") in md
    from wmbook import headlines

    head = headlines.headline(results.read(path))
    assert head["timing noise"].startswith("equal-work points 1.40x apart")


def test_notebook_03_keeps_the_latest_sweep_of_each_pipeline(tmp_path):
    """03 on the eager pipeline and on a stack of notebooks 04-06 are two results: a later eager sweep does not hide
    the stacked one (a stack given as a list or as text is one pipeline)."""
    from wmbook import results

    def rows(run, ts, base, fps):
        p = {"sampling": {"solver": "ddim"}, "curve": "ddim", "reference": True, "forwards": 4, "base": base}
        return [results.make_row(notebook="03_step_reduction", workload="wma", preset="wma", variant="steps:ddim 2+2",
                                 metric="fps", value=fps, unit="x", params=p)
                | {"device_kind": "cuda", "device_name": "Test GPU", "run_id": run, "timestamp": ts}]

    path = tmp_path / "r.csv"
    results.append(rows("old", "2026-01-01T00:00", ["bf16", "cuda-graphs"], 9.0)
                   + rows("new", "2026-01-02T00:00", "eager", 2.0)
                   + rows("newer", "2026-01-03T00:00", "eager", 3.0), path)
    md = published.markdown(path)
    assert "on the `bf16+cuda-graphs` pipeline" in md and "on the `eager` pipeline" in md
    assert "| 9 |" in md and "| 3 |" in md and "| 2 |" not in md  # the latest eager sweep only


def test_notebook_06_failed_row_keeps_the_run_table(tmp_path):
    """A row that failed (gate "error": no time, no end-to-end value) is listed with dashes under the run's
    end-to-end column; it broke the table before (the H100's wma run at f07412f)."""
    from wmbook import results

    def row(variant, metric, value, **kw):
        return results.make_row(notebook="06_cuda_graphs", workload="wma", preset="wma", variant=variant,
                                metric=metric, value=value, unit="ms", params={}, **kw) | {
            "device_kind": "cuda", "device_name": "Test GPU", "run_id": "r1", "timestamp": "2026-01-01T00:00"}

    base, fused = "bf16 + compile-whole", "bf16 + compile-whole + triton-fused"
    rows = [row(base, "forward_ms", 70.0, gate="pass"), row(base, "ddim_step_ms", 80.0),
            row(fused, "forward_ms", float("nan"), gate="error", note="InductorError: KeyError: 'op282'"),
            row(base + " + vae-compile", "forward_ms", 69.0, gate="pass")]
    path = tmp_path / "r.csv"
    results.append(rows, path)
    md = published.markdown(path).split("**06 · static caches and CUDA graphs, wma / wma**")[1]
    assert "| ms per DDIM step |" in md.splitlines()[1]
    assert "| triton-fused | error |" in md and "| 80 |" in md
    assert "| vae-compile | pass | 69.0 |" in md  # the row after it: one variant on the last row that ran


def test_a_cut_run_leaves_the_published_tables(tmp_path):
    """A run marked cut (its notebook stopped before the end, no report published) keeps its rows in the store, but
    the published tables and the index's runs fall back to the latest run that finished; bad input names the run."""
    import pytest

    from wmbook import results

    def row(run, ts, value):
        return results.make_row(notebook="06_cuda_graphs", workload="wma", preset="wma", variant="bf16",
                                metric="forward_ms", value=value, unit="ms", params={}, gate="pass") | {
            "device_kind": "cuda", "device_name": "Test GPU", "run_id": run, "timestamp": ts}

    path = tmp_path / "r.csv"
    results.append([row("done1", "2026-01-01T00:00", 61.0), row("cut22", "2026-01-02T00:00", 52.0)], path)
    assert "| 52.0 |" in published.markdown(path)  # the latest run, before it is marked
    with pytest.raises(ValueError, match="run_id='nope'"):
        results.mark_cut("nope", "machine taken back", path)
    with pytest.raises(ValueError, match="reason"):
        results.mark_cut("cut22", "", path)
    results.mark_cut("cut22", "device time ran out after row 4", path)
    md = published.markdown(path)
    assert "| 61.0 |" in md and "| 52.0 |" not in md
    df = results.read(path)
    assert (df["run_id"] == "cut22").sum() == 2  # its measurement and the mark stay in the store
    runs = headlines.published_runs(df)
    assert set(runs[("06_cuda_graphs", "wma", "wma")]["run_id"]) == {"done1"}


def test_notebook_06_with_kernels_in_the_base_names_notebook_04s_best_row(tmp_path):
    """Where notebook 06's base holds notebook 05's kernels, its comparison row of notebook 04's best stack alone is
    labelled by what it leaves out, and the index headline gives the run's speedup against it (the 2x goal)."""
    from wmbook import results

    def row(variant, metric, value):
        return results.make_row(notebook="06_cuda_graphs", workload="wma", preset="wma", variant=variant,
                                metric=metric, value=value, unit="ms", params={}, gate="pass") | {
            "device_kind": "cuda", "device_name": "Test GPU", "run_id": "r6", "timestamp": "2026-01-01T00:00"}

    base = "bf16 + triton-fused + head-conv-gemm + compile-whole"
    graphs, best04 = base + " + skip-unused-heads + cuda-graphs", "bf16 + compile-whole"
    rows = [row(base, "forward_ms", 120.0), row(base, "run_s", 11.0),
            row(base + " + skip-unused-heads", "forward_ms", 90.0), row(base + " + skip-unused-heads", "run_s", 8.0),
            row(graphs, "forward_ms", 52.0), row(graphs, "run_s", 5.0),
            row(best04, "forward_ms", 127.0), row(best04, "run_s", 12.0)]
    path = tmp_path / "r.csv"
    results.append(rows, path)
    md = published.markdown(path)
    assert "| base without triton-fused + head-conv-gemm | pass | 127.0 |" in md
    assert "| cuda-graphs | pass | 52.0 |" in md
    runs = headlines.published_runs(results.read(path))
    h = headlines.headline(runs[("06_cuda_graphs", "wma", "wma")])
    assert h["run s, notebook 04's best stack"] == "12" and h["run s (best row)"] == "5"
    assert h["run speedup vs notebook 04's best"] == "2.40x"


def test_notebook_06_decoder_table_falls_back_to_the_latest_run_that_has_one(tmp_path):
    """A run with decoder_table=False (the wma run that fits a session) leaves the decoder table of the latest run
    that measured it in the README block, labelled with that run's device and commit, instead of dropping it."""
    from wmbook import results

    def row(run, ts, variant, metric, value, commit):
        return results.make_row(notebook="06_cuda_graphs", workload="wma", preset="wma", variant=variant,
                                metric=metric, value=value, unit="ms", params={}, gate="pass") | {
            "device_kind": "cuda", "device_name": "Test GPU", "run_id": run, "timestamp": ts, "git_commit": commit}

    path = tmp_path / "r.csv"
    results.append([row("old", "2026-01-01T00:00", "bf16", "forward_ms", 60.0, "aaaaaaa"),
                    row("old", "2026-01-01T00:00", "decoder: vae-bf16", "decoder_ms_per_block", 5.7, "aaaaaaa"),
                    row("new", "2026-01-02T00:00", "bf16", "forward_ms", 44.0, "bbbbbbb")], path)
    md = published.markdown(path)
    graphs, decoder = md.split("**06 · the decoder, wma / wma**")
    assert "| 44.0 |" in graphs and "| 60.0 |" not in graphs  # the run table: the latest run
    assert "from an earlier run, old: Test GPU" in decoder.splitlines()[0]
    assert "commit aaaaaaa" in decoder.splitlines()[0]
    assert "| vae-bf16 | pass | 5.7 |" in decoder


def test_a_partial_run_gives_only_its_decoder_table(tmp_path):
    """A run marked partial (notebook 06 run for its decoder table, with one graph row) keeps its rows; the notebook's
    main table and headline stay with the latest full run, the decoder table (README and index) comes from the latest
    run that has one, named with its run id; bad input names the parameter."""
    import pytest

    from wmbook import results

    def row(run, ts, variant, metric, value):
        return results.make_row(notebook="06_cuda_graphs", workload="mg2", preset="mg2-universal", variant=variant,
                                metric=metric, value=value, unit="ms", params={}, gate="pass") | {
            "device_kind": "cuda", "device_name": "Test GPU", "run_id": run, "timestamp": ts}

    path = tmp_path / "r.csv"
    results.append([row("full1", "2026-01-01T00:00", "bf16", "forward_ms", 61.0),
                    row("full1", "2026-01-01T00:00", "bf16 + cuda-graphs", "forward_ms", 23.0),
                    row("full1", "2026-01-01T00:00", "decoder: vae-bf16", "decoder_ms_per_block", 185.0),
                    row("side2", "2026-01-02T00:00", "bf16", "forward_ms", 40.0),
                    row("side2", "2026-01-02T00:00", "decoder: vae-bf16", "decoder_ms_per_block", 171.0),
                    row("side2", "2026-01-02T00:00", "decoder: vae-bf16", "decoder_gpu_busy_ms", 170.0),
                    row("side2", "2026-01-02T00:00", "decoder: vae-bf16", "decoder_category_ms:convolution", 88.5)],
                   path)
    md = published.markdown(path)
    assert "| 40.0 |" in md and "| 61.0 |" not in md  # before it is marked: the latest run is the table
    with pytest.raises(ValueError, match="run_id='nope'"):
        results.mark_partial("nope", "decoder table only", path)
    with pytest.raises(ValueError, match="reason"):
        results.mark_partial("side2", "", path)
    results.mark_partial("side2", "decoder table only, one graph row", path)
    md = published.markdown(path)
    main, dec = md.split("**06 · the decoder")
    assert "| 61.0 |" in main and "| 23.0 |" in main and "| 40.0 |" not in main
    assert "from a later run, side2" in dec and "| 171.0 |" in dec and "| 185.0 |" not in dec
    assert "| 88.5 / 81.5 |" in dec  # kernel time of the profiled block: convolution / everything else
    run = headlines.published_runs(results.read(path))[("06_cuda_graphs", "mg2", "mg2-universal")]
    assert set(run.loc[run["metric"] == "forward_ms", "run_id"]) == {"full1"}
    assert set(run.loc[run["metric"] == "decoder_ms_per_block", "run_id"]) == {"side2"}
    assert headlines.headline(run)["decoder ms / block (best)"] == "171.0"


def test_folder_page_keeps_to_its_device(tmp_path):
    """Notebook 04's compile table takes each configuration's latest row; a later run on another device must not
    replace the H100's row on the H100 folder's page, which holds the H100's rows only."""
    from wmbook import results

    def row(run, ts, device, value):
        return results.make_row(notebook="04_compile_autocast", workload="wma", preset="wma",
                                variant="compile:whole model", metric="steady_forward_ms", value=value, unit="ms",
                                params={}) | {"device_kind": "cuda", "device_name": device, "run_id": run,
                                              "timestamp": ts, "git_commit": run}

    path = tmp_path / "r.csv"
    results.append([row("h1", "2026-01-01T00:00", "NVIDIA H100 80GB HBM3", 89.2),
                    row("h2", "2026-01-02T00:00", "NVIDIA H200", 67.7)], path)
    assert "| 67.7 |" in published.markdown(path)  # no device named: the latest row, whatever its machine
    md = published.markdown(path, device="H100")
    assert "| 89.2 |" in md and "67.7" not in md
    page = tmp_path / "README.md"
    page.write_text(f"x\n{published.BEGIN}\n{published.END}\n")
    assert published.replace_block(page, md) and "| 89.2 |" in page.read_text()
    assert "67.7" not in page.read_text() and not published.replace_block(page, md)


def test_of_device_is_a_plain_case_insensitive_substring():
    import pandas as pd

    from wmbook import results

    df = pd.DataFrame({"device_name": ["NVIDIA H100 80GB HBM3", "NVIDIA H200", "cpu", "A(1)"]})
    assert results.of_device(df, "h100")["device_name"].tolist() == ["NVIDIA H100 80GB HBM3"]
    assert results.of_device(df, "A(1")["device_name"].tolist() == ["A(1)"]  # not a regex
    assert len(results.of_device(df, None)) == len(results.of_device(df, "")) == 4


def _rows06(path, rows):
    from wmbook import results

    results.append([results.make_row(notebook=nb, workload="mg2", preset="mg2-universal", variant=v, metric=m,
                                     value=x, unit="ms", params=p, gate=g)
                    | {"device_kind": "cuda", "device_name": "Test GPU", "run_id": run, "timestamp": ts}
                    for nb, run, ts, v, m, x, g, p in rows], path)


def test_best_row_reads_every_column_from_one_row(tmp_path):
    """The best row is the one the workload's end-to-end metric ranks best (FPS for mg2), and every number shown of
    it comes from that row: a slightly faster forward of another row does not lend it its FPS."""
    from wmbook import results

    nb, r, t = "06_cuda_graphs", "r06", "2026-01-01T00:00"
    a, b = "bf16 + cuda-graphs", "bf16 + cuda-graphs + vae-compile"
    _rows06(tmp_path / "r.csv", [
        (nb, r, t, "bf16", "forward_ms", 50.0, "pass", {}), (nb, r, t, "bf16", "fps", 20.0, "", {}),
        (nb, r, t, a, "forward_ms", 22.8, "pass", {}), (nb, r, t, a, "fps", 36.7, "", {}),
        (nb, r, t, a, "psnr_db", 53.0, "", {}),
        (nb, r, t, b, "forward_ms", 22.9, "pass", {}), (nb, r, t, b, "fps", 68.3, "", {}),
        (nb, r, t, b, "psnr_db", 48.8, "", {})])
    run = headlines.published_runs(results.read(tmp_path / "r.csv"))[(nb, "mg2", "mg2-universal")]
    h = headlines.headline(run)
    assert h["best row"] == "vae-compile" and h["FPS (best row)"] == "68.3" and h["forward ms (best row)"] == "22.9"
    assert h["frames PSNR dB"] == "48.8"
    f = headlines.findings(run)
    assert "**+ vae-compile**" in f.headline and "**68.3**" in f.headline
    assert "60 FPS with the full decoder: **met**" in f.goal


def test_random_weight_step_sweep_says_it_shows_solver_error(tmp_path):
    from wmbook import results

    nb, r, t = "03_step_reduction", "r03", "2026-01-01T00:00"
    full = {"sampling": {"denoising_steps": [1000, 500]}, "curve": "renoise", "reference": True, "forwards": 3}
    knee = {"sampling": {"denoising_steps": [1000, 500]}, "curve": "renoise", "criterion": "frames within 30 dB"}
    _rows06(tmp_path / "r.csv", [(nb, r, t, "steps:renoise [1000,500]", "fps", 17.5, "", full),
                                 (nb, r, t, "knee:renoise", "knee_speedup", 1.0, "", knee),
                                 (nb, r, t, "knee:renoise", "knee_forwards", 3.0, "", knee)])
    run = results.read(tmp_path / "r.csv")
    f = headlines.findings(run)
    assert "solver error" in f.headline and "not judged" in f.goal
    assert headlines.headline(run)["what it measures"].startswith("solver error")



def test_step_sweep_findings_give_the_fastest_point_beside_the_knee(tmp_path):
    """A sweep whose knee is the full-step run (random weights) still says what its fastest point measured: the time a
    reader reaches at fewer steps on that pipeline, with its speedup, forwards and deviation."""
    from wmbook import results

    nb, r, t = "03_step_reduction", "r03", "2026-01-01T00:00"
    full = {"sampling": {"denoising_steps": [1000, 500]}, "curve": "renoise", "reference": True, "forwards": 3}
    fast = {"sampling": {"denoising_steps": [1000]}, "curve": "renoise", "forwards": 2}
    knee = {"sampling": {"denoising_steps": [1000, 500]}, "curve": "renoise", "criterion": "frames within 30 dB"}
    a, b = "steps:renoise [1000,500]", "steps:renoise [1000]"
    rows = [(nb, r, t, a, "fps", 17.5, "", full), (nb, r, t, a, "forwards", 3.0, "", full),
            (nb, r, t, b, "fps", 26.0, "", fast), (nb, r, t, b, "speedup_vs_full", 26.0 / 17.5, "", fast),
            (nb, r, t, b, "forwards", 2.0, "", fast), (nb, r, t, b, "psnr_vs_full", 21.5, "", fast),
            (nb, r, t, "knee:renoise", "knee_speedup", 1.0, "", knee),
            (nb, r, t, "knee:renoise", "knee_forwards", 3.0, "", knee)]
    _rows06(tmp_path / "r.csv", rows)
    f = headlines.findings(results.read(tmp_path / "r.csv"))
    assert "Fastest point measured: `renoise [1000]`, **26 FPS**, 1.49x the full-step run (2 forwards;" in f.headline
    assert "21.5 dB from the full-step run's" in f.headline
    # as many forwards as the knee: a faster time there is timing noise, not a point of its own
    _rows06(tmp_path / "s.csv", [x if x[3:5] != (b, "forwards") else (*x[:5], 3.0, *x[6:]) for x in rows])
    assert "Fastest point" not in headlines.findings(results.read(tmp_path / "s.csv")).headline

def test_summary_stacks_the_stages_in_one_metric_from_the_rows(tmp_path):
    """eager (01, at the precision upstream runs) -> 04 -> 06: each stage's FPS at its best gated row over eager's;
    a step sweep on the eager pipeline is a row of its own, not a bar; the chart is inline SVG."""
    from wmbook import results, summary, workloads

    t = "2026-01-01T00:00"
    _rows06(tmp_path / "r.csv", [
        ("01_baseline_profiling", "r1", t, "eager", "fps", 20.0, "", {"dtype": "bf16"}),
        ("04_compile_autocast", "r4", t, "fp32-eager", "forward_ms", 280.0, "reference", {}),
        ("04_compile_autocast", "r4", t, "fp32-eager", "fps", 9.0, "reference", {}),
        ("04_compile_autocast", "r4", t, "bf16 + compile-regional", "forward_ms", 30.0, "pass", {}),
        ("04_compile_autocast", "r4", t, "bf16 + compile-regional", "fps", 40.0, "pass", {}),
        ("06_cuda_graphs", "r6", t, "bf16 + compile-regional", "forward_ms", 40.0, "pass", {}),
        ("06_cuda_graphs", "r6", t, "bf16 + compile-regional + cuda-graphs", "forward_ms", 22.0, "pass", {}),
        ("06_cuda_graphs", "r6", t, "bf16 + compile-regional + cuda-graphs", "fps", 60.0, "pass", {})])
    rows = summary.stages(results.read(tmp_path / "r.csv"), workloads.get("mg2"))
    got = [(r.stage.label, r.stage.value, round(r.speedup, 2)) for r in rows]
    assert got == [("eager bf16", 20.0, 1.0), ("+ precision and compile (04)", 40.0, 2.0),
                   ("+ static caches and CUDA graphs (06)", 60.0, 3.0)]
    assert summary.best(rows).stage.notebook == "06_cuda_graphs"
    svg = summary.chart_svg(rows, "mg2")
    assert svg.startswith("<svg") and "3.00x" in svg and "<script" not in svg and 'href="http' not in svg
    assert summary.chart_svg(rows, "mg2") == svg  # no date, fixed ids: the same rows, the same page


def test_notebook_05_findings_name_the_base_the_ladder_built_on():
    """A notebook-05 run given its own `base` does not call it notebook 04's best stack (the stored H200 runs: one
    with base given, one of the set)."""
    import pandas as pd

    from wmbook import results
    from wmbook.studies import kernels_report

    df = pd.read_csv(results.default_path(), low_memory=False)
    runs = df[(df["notebook"] == "05_triton_kernels") & (df["workload"] == "mg2")
              & df["device_name"].astype(str).str.contains("H200")]
    given = runs[runs["params"].astype(str).str.contains('"base": "tf32')]
    assert len(given) and len(given) < len(runs)
    own = kernels_report.findings(runs[runs["run_id"] == given["run_id"].iloc[0]])
    assert "On the run's own base stack (its `base` parameter), `action-norm-rope`" in own.headline
    auto = runs[~runs["run_id"].isin(given["run_id"])]
    first = kernels_report.findings(auto[auto["run_id"] == auto["run_id"].iloc[-1]])
    assert "On notebook 04's best stack" in first.headline
