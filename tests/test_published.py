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
