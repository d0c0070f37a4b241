"""The tree a set's slice runs, checked against the set's commit on the machine that runs it (tools/gpu_set.sh).

A set's rows record the commit given to `gpu_set.sh start` (WMBOOK_GIT_COMMIT); the machine gets a copy of a working
tree without its .git, so nothing there could tell that tree from another commit's. Here, `write` takes the commit's
file list with each file's git blob id (`git ls-tree -r`) into a manifest, after checking that the working tree is that
commit's; there, `verify` hashes the copied files as git does and refuses a tree that differs: a file changed or
missing (but the published record, OPTIONAL, which may be left behind), or a source file under the code folders that
the commit does not hold. Standard library only: it runs before
anything is installed.

    python3 tools/set_tree.py write SHA [MANIFEST]     # here, in the repository (default MANIFEST: .set-tree)
    python3 tools/set_tree.py verify SHA [MANIFEST]    # there, in the copied tree's root
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

MANIFEST = ".set-tree"
# folders whose every source file must come from the commit: a stray module or notebook there would change what runs
CODE_DIRS = ("wmbook", "notebooks", "tools")
# (code and its settings only: what a run writes beside it, e.g. a JSON file, is not refused)
SOURCE_SUFFIXES = (".py", ".ipynb", ".sh", ".toml", ".cfg")
SKIP_DIRS = {"__pycache__", ".ipynb_checkpoints", ".pytest_cache", "wmbook_cache"}  # git-ignored where they are
# the published record, which no run reads (a set's runs write their rows and reports into the set's folder): it may
# be left out of the copy to keep it small, and is checked where it is there
OPTIONAL = ("data/reports/", "data/results/")


def blob_id(data: bytes) -> str:
    """The git blob id of a file's bytes (sha1 of "blob <size>\\0" + bytes)."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


def write(sha: str, repo: Path, manifest: Path) -> None:
    """The manifest of commit `sha` (its first line names the full commit), after checking that `repo`'s working tree
    is that commit's: no tracked file differs from it and no file git does not ignore is untracked."""
    full = _git("rev-parse", "--verify", f"{sha}^{{commit}}", cwd=repo).strip()
    diff = _git("diff", "--name-status", "--no-renames", full, "--", cwd=repo).splitlines()
    changed = [path for status, path in (line.split("\t", 1) for line in diff)
               if not (status == "D" and path.startswith(OPTIONAL))]
    untracked = _git("ls-files", "--others", "--exclude-standard", cwd=repo).split()
    if changed or untracked:
        raise SystemExit(f"set_tree: the working tree is not commit {full[:7]}'s: "
                         + "; ".join(x for x in (f"changed: {', '.join(changed[:8])}" if changed else "",
                                                 f"untracked: {', '.join(untracked[:8])}" if untracked else "") if x)
                         + f" (check out {full[:7]} with a clean tree, e.g. `git checkout {full[:7]}`)")
    listing = _git("ls-tree", "-r", "--full-tree", full, cwd=repo)
    tmp = manifest.with_name(manifest.name + ".tmp")
    tmp.write_text(f"commit {full}\n{listing}")
    os.replace(tmp, manifest)
    print(f"{manifest}: {len(listing.splitlines())} files of commit {full[:7]}; carry it with the tree")


def verify(sha: str, root: Path, manifest: Path) -> list[str]:
    """What in the tree at `root` differs from the manifest's commit, which must be `sha` (a prefix will do): empty
    when the tree is that commit's."""
    if not manifest.is_file():
        return [f"no {manifest.name}: write it where the repository is (python3 tools/set_tree.py write {sha}) and "
                "carry it"]
    head, _, listing = manifest.read_text().partition("\n")
    full = head.removeprefix("commit ").strip()
    if not (head.startswith("commit ") and len(sha) >= 7 and full.startswith(sha)):
        return [f"{manifest.name} is of commit {full[:12] or '?'}, not of {sha}"]
    problems, listed = [], set()
    for line in listing.splitlines():
        meta, _, path = line.partition("\t")
        mode, kind, obj = meta.split()
        if kind != "blob":  # a submodule's commit: its files are not this tree's
            continue
        listed.add(path)
        p = root / path
        if mode == "120000":
            ok = p.is_symlink() and blob_id(os.readlink(p).encode()) == obj
        else:
            ok = p.is_file() and blob_id(p.read_bytes()) == obj
        if not ok and not (path.startswith(OPTIONAL) and not p.exists()):
            problems.append(f"{path}: {'differs from the commit' if p.exists() or p.is_symlink() else 'missing'}")
    for top in CODE_DIRS:
        for dirpath, dirnames, filenames in os.walk(root / top):
            dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS]
            for name in filenames:
                rel = (Path(dirpath) / name).relative_to(root).as_posix()
                if name.endswith(SOURCE_SUFFIXES) and rel not in listed:
                    problems.append(f"{rel}: not in the commit")
    return problems


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3) or argv[0] not in ("write", "verify"):
        print("usage: set_tree.py write SHA [MANIFEST] | verify SHA [MANIFEST]", file=sys.stderr)
        return 2
    manifest = Path(argv[2] if len(argv) == 3 else MANIFEST)
    if argv[0] == "write":
        try:
            write(argv[1], Path.cwd(), manifest)
        except subprocess.CalledProcessError as e:  # not a repository, or SHA names no commit
            print(f"set_tree: git {' '.join(e.cmd[1:])}: {e.stderr.strip()}", file=sys.stderr)
            return 2
        return 0
    problems = verify(argv[1], Path.cwd(), manifest)
    if problems:
        n = f"{len(problems)} difference{'s' if len(problems) > 1 else ''}"
        print(f"set_tree: this tree is not commit {argv[1]}'s ({n}), so its rows would record a commit they do not "
              "come from:", file=sys.stderr)
        for p in problems[:20]:
            print(f"  {p}", file=sys.stderr)
        if len(problems) > 20:
            print(f"  ... and {len(problems) - 20} more", file=sys.stderr)
        return 2
    print(f"the tree is commit {argv[1]}'s ({manifest.name} verified)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
