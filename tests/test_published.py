"""The README's published numbers are generated from the results store and kept in step with it."""

from wmbook import published


def test_readme_block_matches_the_stored_rows():
    want = published.markdown().strip("\n")
    assert published.readme_block() == want, "README is stale: run `python -m wmbook.published --write`"


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
