#!/usr/bin/env bash
# The published set (python -m wmbook regenerate) on a remote GPU machine that is available for a limited time and
# whose commands are cut at a time limit: one slice of the set per allocation, resumed on the next machine from the
# set's file, each slice's runs brought back and merged into the set folder here, where the complete set is published.
#
#   bash tools/gpu_set.sh tree SHA                                  # here: .set-tree, the commit's files (carry it)
#   bash tools/gpu_set.sh start SHA SET MINUTES [regenerate args]   # there: start the slice detached, return
#   bash tools/gpu_set.sh wait SECONDS [OUT]                        # there: progress until it ends or SECONDS pass;
#                                                                   #   with OUT, then the slice so far packed into it
#   bash tools/gpu_set.sh pack OUT                                  # there: the slice -> OUT/set-part-* (7 MiB parts)
#   bash tools/gpu_set.sh unpack DIR SET                            # here: join the parts under DIR into SET
#
# SET is the set folder here, inside the repository (sets/ is ignored by git, e.g. sets/h200); carry SET/set.json to
# the machine, where `start` copies it into the slice's folder: the runs it records as done are not run again, and
# the runs' folders stay here. SHA is the commit the tree was copied from (rows record it: WMBOOK_GIT_COMMIT); every
# slice of a set must run that commit's code: `tree SHA` checks here that the working tree is SHA's and writes the
# commit's file list (.set-tree, git-ignored), and `start` refuses a copied tree that differs from it
# (tools/set_tree.py); a later slice of a set of an older commit runs from that commit checked out. MINUTES goes to
# `regenerate --time-limit`: no run starts that is expected to end after it, one still going then is stopped (and run
# again by the next slice). The slice runs in a snapshot of the tree (the tree may be replaced while it runs), its set
# folder outside it; compile caches, traces and weights stay on the machine (the compile cache passes to the next
# slice started there). Environment: GPU_SET_ROOT (default /root), WHEELS (a folder of wheels installed with
# --no-deps first; default .whl when present), PYTHON (here, for unpack: the interpreter with wmbook's requirements;
# default python3).
# Keep each slice's last pack (its set-part-* files, small enough to commit to git) until the set is published: the set
# folder is rebuilt from them, on this machine or another, by unpacking them into an empty SET in the order they were
# made.
# A machine may be taken back between two commands, its slice with it: give every `wait` an OUT, so each command
# brings back the runs finished so far (a later part holds the earlier ones; joining a run twice adds it once).
#   e.g. here: bash tools/gpu_set.sh tree $(git rev-parse HEAD)   (then carry .set-tree and SET/set.json)
#        bash tools/gpu_set.sh start $(git rev-parse HEAD) sets/h200 25 --device-name H200 \
#          && bash tools/gpu_set.sh wait 540 $OUT   (--device-name: a host of another card refuses the slice at once)
#        ... bash tools/gpu_set.sh wait 500 $OUT
#        here: bash tools/gpu_set.sh unpack FILES_AT sets/h200, and when the set is complete:
#        python -m wmbook regenerate --out sets/h200 --publish data/reports/h200
set -uo pipefail
root=${GPU_SET_ROOT:-/root}
run="$root/set-slice"  # the slice: snap/ (the tree), set/ (its set folder), log, pid, rc
cmd=${1:?usage: gpu_set.sh tree SHA | start SHA SET MINUTES [args] | wait SECONDS [OUT] | pack OUT | unpack DIR SET}
shift
here=$(cd "$(dirname "$0")" && pwd)
case "$cmd" in
  tree)
    # at the repository's root, where the tree is copied from and `start` looks for .set-tree
    cd "$here/.." && exec python3 "$here/set_tree.py" write "${1:?usage: gpu_set.sh tree SHA}"
    ;;
  start)
    sha=${1:?usage: gpu_set.sh start SHA SET MINUTES [regenerate args]}
    set_dir=${2:?usage: gpu_set.sh start SHA SET MINUTES [regenerate args]}
    minutes=${3:?usage: gpu_set.sh start SHA SET MINUTES [regenerate args]}; shift 3
    # the rows will record SHA: the copied tree must be its (before anything is installed or moved)
    python3 "$here/set_tree.py" verify "$sha" || exit 2
    if [ -f "$run/pid" ] && [ ! -f "$run/rc" ] && kill -0 "$(cat "$run/pid")" 2>/dev/null; then
      echo "gpu_set.sh: a slice is still running (pid $(cat "$run/pid"))" >&2; exit 2
    fi
    wheels=${WHEELS:-.whl}
    if [ -d "$wheels" ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$wheels"/*.whl || exit 1
      python3 -m ipykernel install --name python3 > /dev/null || exit 1
    fi
    # a slice before on this machine leaves its compile cache to this one (the runs left compile what it compiled)
    [ -d "$run/set/cache" ] && { rm -rf "$root/set-cache.kept"; mv "$run/set/cache" "$root/set-cache.kept"; }
    rm -rf "$run" && mkdir -p "$run/snap" "$run/set" || exit 1
    [ -d "$root/set-cache.kept" ] && mv "$root/set-cache.kept" "$run/set/cache"
    # no .git (the commit is SHA) and no virtual environment of this host
    tar -C . --exclude="./${wheels#./}" --exclude=./sets --exclude=./.git --exclude=./.venv -cf - . |
      tar -C "$run/snap" -xf - || exit 1
    [ -f "$set_dir/set.json" ] && cp "$set_dir/set.json" "$run/set/"
    echo "$set_dir" > "$run/name"
    date -u +%Y%m%dT%H%M%S > "$run/started"
    (
      cd "$run/snap" || exit 1
      export WMBOOK_GIT_COMMIT=$sha PYTHONPATH=$run/snap PYTHONUNBUFFERED=1
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
      # python -m wmbook with SIGINT restored: this background command starts with it ignored (POSIX), and the
      # slice and its runs are stopped as Ctrl-C stops them (wmbook.cli restores it too; a set of an earlier
      # commit may not)
      setsid bash -c 'python3 -c "import runpy, signal; signal.signal(signal.SIGINT, signal.default_int_handler)
runpy.run_module(\"wmbook\", run_name=\"__main__\")" regenerate --out "$0" --time-limit "$1" "${@:2}" \
                        > "$0/../log" 2>&1; echo $? > "$0/../rc"' "$run/set" "$minutes" "$@" < /dev/null > /dev/null 2>&1 &
      echo $! > "$run/pid"
    )
    sleep 5; cat "$run/log" 2>/dev/null
    ;;
  wait)
    secs=${1:?usage: gpu_set.sh wait SECONDS [OUT]}; out=${2:-}
    [ -d "$run" ] || { echo "gpu_set.sh: no slice under $root" >&2; exit 2; }
    t0=$(date +%s); shown=0
    while :; do
      n=$(wc -l < "$run/log" 2>/dev/null || echo 0)
      [ "$n" -gt "$shown" ] && sed -n "$((shown + 1)),${n}p" "$run/log" && shown=$n
      [ -f "$run/rc" ] && { echo "the slice ended (exit $(cat "$run/rc"))"; break; }
      [ $(($(date +%s) - t0)) -ge "$secs" ] && { echo "the slice is still running"; break; }
      sleep 10
    done
    [ -z "$out" ] || exec bash "$0" pack "$out"
    ;;
  pack)
    out=${1:?usage: gpu_set.sh pack OUT}
    [ -d "$run/set" ] || { echo "gpu_set.sh: no slice under $root" >&2; exit 2; }
    # named by the slice's start: each pack of a slice replaces its log with the longer one
    cp "$run/log" "$run/set/slice-$(cat "$run/started" 2>/dev/null || date -u +%Y%m%dT%H%M%S).log" 2>/dev/null
    mkdir -p "$out" && rm -f "$out"/set-part-*  # an earlier pack's parts would join this one's
    tar -C "$run/set" --exclude=./cache --exclude='*.json.gz' --exclude='*.pt' -czf - . | split -b 7m - "$out/set-part-"
    ls -la "$out"
    ;;
  unpack)
    dir=${1:?usage: gpu_set.sh unpack DIR SET}; set_dir=${2:?usage: gpu_set.sh unpack DIR SET}
    ls "$dir"/set-part-* > /dev/null 2>&1 || { echo "gpu_set.sh: no set-part-* under $dir" >&2; exit 2; }
    # joined, not unpacked over the set: a slice's own times file and logs hold only its runs (regenerate --merge
    # checks the part's commit, device and plan, then copies its finished runs and adds its times to the set's)
    part=$(mktemp -d) && cat "$dir"/set-part-* | tar -C "$part" -xzf - || exit 1
    mkdir -p "$set_dir" && cp "$part"/slice-*.log "$set_dir"/ 2>/dev/null
    ${PYTHON:-python3} -m wmbook regenerate --out "$set_dir" --merge "$part"; rc=$?
    [ "$rc" -le 1 ] && rm -rf "$part"  # 1: joined, the set not complete yet
    [ "$rc" -le 1 ] || { echo "gpu_set.sh: the part stays in $part" >&2; exit "$rc"; }
    ;;
  *) echo "gpu_set.sh: unknown command $cmd; allowed: tree, start, wait, pack, unpack" >&2; exit 2 ;;
esac
