#!/usr/bin/env bash
# Long GPU work on a machine whose commands are cut at a fixed limit (e.g. 10 minutes a command): run the steps
# detached, poll until they finish (returning as soon as they do, never sleeping past the end), pack what they wrote.
#
#   bash tools/gpu_job.sh start RES "step 1 command" "step 2 command" ...   # returns at once
#   bash tools/gpu_job.sh wait RES SECONDS      # until RES/done or SECONDS; exit 0 when done, 3 when still running
#   bash tools/gpu_job.sh pack RES OUT          # RES's logs and status (+ any *.tgz) into OUT as one results.tgz
#
# Steps run in order in the repository root (each with its own log RES/step-NN.log, its exit status appended to
# RES/status); a failed step does not stop the next. Example, one call that starts the job and waits 9 minutes, then
# a second call (while the machine is still held) that waits again and packs:
#   bash tools/gpu_job.sh start /root/res "NB_TIMEOUT=1500 bash tools/gpu_run.sh /root/res/nb '05 wma -p workload wma'" \
#     "python3 -m pytest tests/test_graphs.py -q" && bash tools/gpu_job.sh wait /root/res 540
#   bash tools/gpu_job.sh wait /root/res 540; bash tools/gpu_job.sh pack /root/res $OUT
set -uo pipefail
cmd=${1:?usage: gpu_job.sh start|wait|pack RES ...}; res=${2:?usage: gpu_job.sh $cmd RES ...}; shift 2
case "$cmd" in
  start)
    [ $# -ge 1 ] || { echo "gpu_job.sh start: give at least one step command" >&2; exit 2; }
    if [ -f "$res/started" ] && [ ! -f "$res/done" ]; then
      echo "gpu_job.sh: a job is already running in $res (no $res/done yet)" >&2; exit 2
    fi
    rm -rf "$res"; mkdir -p "$res"
    steps="$res/steps"; : > "$steps"
    for s in "$@"; do printf '%s\0' "$s" >> "$steps"; done
    date -u +%FT%TZ > "$res/started"
    # setsid + nohup: the job outlives the command that started it (the call's shell ends at once)
    setsid nohup bash -c '
      res=$1; i=0
      while IFS= read -r -d "" s; do
        i=$((i + 1)); n=$(printf "%02d" $i)
        echo "$(date -u +%T) step $n start: $s" >> "$res/status"
        bash -c "$s" > "$res/step-$n.log" 2>&1
        rc=$?
        echo "$(date -u +%T) step $n rc $rc" >> "$res/status"
      done < "$res/steps"
      date -u +%FT%TZ > "$res/done"' _ "$res" > /dev/null 2>&1 < /dev/null &
    echo "started $# step(s) in $res"
    ;;
  wait)
    limit=${1:?usage: gpu_job.sh wait RES SECONDS}
    t0=$(date +%s)
    while [ ! -f "$res/done" ] && [ $(( $(date +%s) - t0 )) -lt "$limit" ]; do sleep "${GPU_JOB_POLL:-5}"; done
    cat "$res/status" 2>/dev/null
    last=$(ls "$res"/step-*.log 2>/dev/null | tail -1)
    [ -n "$last" ] && { echo "--- tail of $last"; tail -5 "$last"; }
    [ -f "$res/done" ] && { echo "done"; exit 0; }
    echo "still running after ${limit}s"; exit 3
    ;;
  pack)
    out=${1:?usage: gpu_job.sh pack RES OUT}
    mkdir -p "$out"
    tar -C "$res" -czf "$out/results.tgz" . && ls -la "$out/results.tgz"
    ;;
  *)
    echo "gpu_job.sh: unknown command $cmd; allowed: start, wait, pack" >&2; exit 2
    ;;
esac
