"""Build a stripped notebook from a list of (kind, source) cells: `python tools/nbbuild.py SPEC.py OUT.ipynb`.

SPEC.py defines CELLS = [("md", "..."), ("params", "..."), ("code", "..."), ...].
"""

import runpy
import sys

import nbformat


def build(cells, path):
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                   "language_info": {"name": "python"}}
    for i, (kind, src) in enumerate(cells):
        src = src.strip("\n")
        if kind == "md":
            c = nbformat.v4.new_markdown_cell(src)
        else:
            c = nbformat.v4.new_code_cell(src)
            if kind == "params":
                c.metadata["tags"] = ["parameters"]
        c["id"] = f"cell-{i:02d}"  # stable ids keep diffs small
        nb.cells.append(c)
    nbformat.write(nb, path)


if __name__ == "__main__":
    build(runpy.run_path(sys.argv[1])["CELLS"], sys.argv[2])
