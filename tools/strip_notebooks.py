#!/usr/bin/env python3
"""Strip outputs from the workbook's notebooks so they are committed clean.

    python tools/strip_notebooks.py            # strip notebooks/*.ipynb in place
    python tools/strip_notebooks.py --check    # exit 1 if any notebook is not stripped
    python tools/strip_notebooks.py a.ipynb    # specific files

Removes: cell outputs, execution counts, widget state (notebook metadata ``widgets``),
papermill/execution bookkeeping in notebook and cell metadata. Keeps everything else,
in particular cell tags (the ``parameters`` tag papermill needs) and the kernelspec.
Needs only ``nbformat``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]

# notebook-level metadata written by running, not by authoring
VOLATILE_NB_METADATA = ("widgets", "papermill", "execution")
# cell-level metadata written by running (papermill, JupyterLab's execution timing, ExecuteTime)
VOLATILE_CELL_METADATA = ("papermill", "execution", "ExecuteTime", "widgets")


def problems(nb: nbformat.NotebookNode) -> list[str]:
    """What would be stripped from ``nb`` (empty list: already clean)."""
    found = []
    for key in VOLATILE_NB_METADATA:
        if key in nb.metadata:
            found.append(f"notebook metadata '{key}'")
    for i, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            if cell.get("outputs"):
                found.append(f"cell {i}: outputs")
            if cell.get("execution_count") is not None:
                found.append(f"cell {i}: execution_count")
        for key in VOLATILE_CELL_METADATA:
            if key in cell.get("metadata", {}):
                found.append(f"cell {i}: metadata '{key}'")
    return found


def strip(nb: nbformat.NotebookNode) -> nbformat.NotebookNode:
    for key in VOLATILE_NB_METADATA:
        nb.metadata.pop(key, None)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs = []
            cell.execution_count = None
        md = cell.get("metadata", {})
        for key in VOLATILE_CELL_METADATA:
            md.pop(key, None)
    return nb


def default_notebooks() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("*.ipynb"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("notebooks", nargs="*", type=Path,
                    help="notebooks to process (default: notebooks/*.ipynb)")
    ap.add_argument("--check", action="store_true",
                    help="change nothing; exit 1 if any notebook has outputs or run metadata")
    args = ap.parse_args(argv)

    paths = args.notebooks or default_notebooks()
    dirty = 0
    for path in paths:
        nb = nbformat.read(path, as_version=nbformat.NO_CONVERT)
        found = problems(nb)
        if not found:
            continue
        dirty += 1
        if args.check:
            shown = "; ".join(found[:5]) + (f"; ... ({len(found)} in all)" if len(found) > 5 else "")
            print(f"{path}: not stripped: {shown}", file=sys.stderr)
        else:
            nbformat.write(strip(nb), path)
            print(f"stripped {path}")
    if args.check and dirty:
        print(f"{dirty} notebook(s) need stripping: run `make strip`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
