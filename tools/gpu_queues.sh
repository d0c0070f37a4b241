#!/usr/bin/env bash
# One detached job queue per GPU (tools/gpu_job.sh), run over a snapshot of the tree, for a remote GPU machine whose
# calls are cut at a time limit and whose next call re-sends the tree (the snapshot keeps the running steps' files):
#
#   bash tools/gpu_queues.sh launch SHA "q0 step;;q0 step" ["q1 step;;q1 step" ...]   # queue i on GPU i; returns
#   bash tools/gpu_queues.sh wait SECONDS OUT   # every queue, SECONDS in all; then packs OUT/q<i>.tgz
#
# SHA is the commit the tree was copied from (rows record it: WMBOOK_GIT_COMMIT). Steps are separated by ';;' and run
# in order in the snapshot (CUDA_VISIBLE_DEVICES=i); queue i packs its logs (ROOT/q<i>) and the folders ROOT/n<i>* and
# (a relative path, in the snapshot) n<i>*, kept at ROOT when a later launch replaces the snapshot; so give queue i's
# notebook runs output folders named that way, e.g.
#   bash tools/gpu_queues.sh launch $(git rev-parse HEAD) \
#     "NB_TIMEOUT=420 bash tools/gpu_run.sh /root/n0a '07 g1-4096 -p preset g1-4096'" &&
#     bash tools/gpu_queues.sh wait 500 $OUT
# Traces (*.json.gz), weights (*.pt) and per-iteration dumps stay on the machine.
# Environment: GPU_QUEUES_ROOT (default /root), WHEELS (a folder of wheels installed with --no-deps before the launch,
# left out of the snapshot), REQUIRE_GPU (launch aborts with exit 5 unless the first GPU's name contains it, e.g. H100),
# QUEUE_CPUS (N: queue i runs on cores i*N .. i*N+N-1 only (taskset), so queues of one host do not take each other's
# cores: a launch-bound timing in one queue is not slowed by another queue's compile workers, and each queue sees the
# cores of a one-GPU machine of the same family, e.g. 16; torch and inductor size their threads from that set).
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=${GPU_QUEUES_ROOT:-/root}
cmd=${1:?usage: gpu_queues.sh launch SHA "steps" ... | wait SECONDS OUT}; shift
case "$cmd" in
  launch)
    sha=${1:?usage: gpu_queues.sh launch SHA "q0 steps" ["q1 steps" ...]}; shift
    [ $# -ge 1 ] || { echo "gpu_queues.sh launch: give at least one queue of steps" >&2; exit 2; }
    if [ -n "${REQUIRE_GPU:-}" ]; then
      name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
      echo "GPU: ${name:-none found}"
      case "$name" in
        *"$REQUIRE_GPU"*) ;;
        *) echo "gpu_queues.sh: not a $REQUIRE_GPU; nothing launched" >&2; exit 5 ;;
      esac
    fi
    if [ -n "${WHEELS:-}" ]; then
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "$WHEELS"/*.whl || exit 1
      python3 -m ipykernel install --name python3 > /dev/null || exit 1
    fi
    for q in "$root"/q*; do
      [ -f "$q/started" ] && [ ! -f "$q/done" ] && { echo "gpu_queues.sh: $q is still running" >&2; exit 2; }
    done
    pin=()
    if [ -n "${QUEUE_CPUS:-}" ]; then
      case "$QUEUE_CPUS" in
        *[!0-9]*|0) echo "gpu_queues.sh: QUEUE_CPUS=$QUEUE_CPUS is not allowed; allowed: a positive number of cores a queue" >&2; exit 2 ;;
      esac
      cores=$(nproc --all)
      if [ $((QUEUE_CPUS * $#)) -gt "$cores" ]; then
        echo "gpu_queues.sh: QUEUE_CPUS=$QUEUE_CPUS for $# queue(s) needs $((QUEUE_CPUS * $#)) cores; this host has $cores" >&2; exit 2
      fi
      command -v taskset > /dev/null || { echo "gpu_queues.sh: QUEUE_CPUS needs taskset (util-linux)" >&2; exit 2; }
    fi
    # a step's relative output folders (snap/n<i>*, snap/cache) outlive the snapshot: moved next to it first
    for d in "$root"/snap/n[0-9]* "$root"/snap/cache; do
      [ -d "$d" ] || continue
      if [ -e "$root/$(basename "$d")" ]; then
        echo "gpu_queues.sh: $d not kept: $root/$(basename "$d") exists" >&2
      else
        mv "$d" "$root/" || exit 1
      fi
    done
    rm -rf "$root/snap" && mkdir -p "$root/snap" || exit 1
    tar -C . ${WHEELS:+--exclude="./${WHEELS#./}"} -cf - . | tar -C "$root/snap" -xf - || exit 1
    cd "$root/snap" || exit 1
    export WMBOOK_GIT_COMMIT=$sha
    i=0
    for q in "$@"; do
      mapfile -t steps < <(printf '%s\n' "${q//;;/$'\n'}" | sed '/^[[:space:]]*$/d')
      [ -n "${QUEUE_CPUS:-}" ] && pin=(taskset -c "$((i * QUEUE_CPUS))-$((i * QUEUE_CPUS + QUEUE_CPUS - 1))")
      CUDA_VISIBLE_DEVICES=$i "${pin[@]}" bash "$here/gpu_job.sh" start "$root/q$i" "${steps[@]}" || exit 1
      i=$((i + 1))
    done
    ;;
  wait)
    secs=${1:?usage: gpu_queues.sh wait SECONDS OUT}; out=${2:?usage: gpu_queues.sh wait SECONDS OUT}
    t0=$(date +%s); rc=0
    for q in "$root"/q*; do
      [ -d "$q" ] || { echo "gpu_queues.sh: no queue under $root" >&2; exit 2; }
      left=$((secs - $(date +%s) + t0)); [ "$left" -lt 1 ] && left=1
      echo "== $q"; bash "$here/gpu_job.sh" wait "$q" "$left" || rc=3
    done
    mkdir -p "$out"
    for q in "$root"/q*; do
      n=$(basename "$q"); i=${n#q}
      dirs=$(cd "$root" && ls -d "n$i"* "snap/n$i"* 2>/dev/null)  # absolute (ROOT/n<i>*) or relative to the snapshot
      # shellcheck disable=SC2086
      tar -C "$root" --exclude='*.json.gz' --exclude='*.pt' --exclude='*/iteration/*' -czf "$out/$n.tgz" "$n" $dirs
    done
    ls -la "$out"
    exit $rc
    ;;
  *)
    echo "gpu_queues.sh: unknown command $cmd; allowed: launch, wait" >&2; exit 2
    ;;
esac
