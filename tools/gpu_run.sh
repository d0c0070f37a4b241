#!/usr/bin/env bash
# Run notebooks on a GPU host (no network: wheels in .whl/) and bundle what they produce:
#   [NB_TIMEOUT=seconds] bash tools/gpu_run.sh OUT_DIR "NB TAG [-p name value ...]" ["NB TAG ..." ...]
# e.g. bash tools/gpu_run.sh /tmp/out "02 mg2-universal -p preset mg2-universal -p num_blocks 3"
# A copy of the repository on another host may carry a stale .git: pass the commit it was copied from as
# WMBOOK_GIT_COMMIT=<sha> (results rows record it).
# Each run renders <OUT>/reports/<NB>-<TAG>.html, appends rows to <OUT>/results.csv and keeps its
# artifacts (session reports, GIFs; not the traces) under <OUT>/artifacts/<NB>-<TAG>/; everything is packed
# into <OUT>/bundle.tgz. Exit status: non-zero if any notebook failed.
set -uo pipefail
out=${1:?usage: gpu_run.sh OUT_DIR "NB TAG [-p name value ...]" ...}; shift
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --find-links .whl papermill nbconvert ipykernel ipywidgets diffusers || exit 1
  # the optional extras of notebook 05's low-precision rows (fp8: torchao; quant-attn: sageattention), where wheeled
  for extra in torchao sageattention; do
    ls .whl | grep -qi "^$extra-" && python3 -m pip install -q --no-index --find-links .whl "$extra"
  done
fi
python3 -m ipykernel install --name python3 >/dev/null
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
rm -rf "$out"; mkdir -p "$out/reports" "$out/artifacts"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv > "$out/nvidia-smi.csv"
# each notebook's own run folder inside OUT: a run cut before it finishes (the machine taken back, a killed call)
# still leaves papermill's executed notebook, saved after every cell with its cells' durations, where OUT is packed
work="$out/work"; mkdir -p "$work"
rc=0
for spec in "$@"; do
  read -r nb tag rest <<< "$spec"
  art="$out/artifacts/$nb-$tag"
  mkdir -p "$art"
  # shellcheck disable=SC2086
  timeout "${NB_TIMEOUT:-3600}" python3 -m wmbook run "$nb" --out "$work/$nb-$tag" -q $rest \
      -p results_path "$out/results.csv" -p output_dir "$art" || rc=1
  cp "$work/$nb-$tag/"[0-9][0-9]_*.html "$out/reports/$nb-$tag.html" 2>/dev/null
  # the executed notebook too, so a run cut short still shows how far it got
  cp "$work/$nb-$tag/executed/"*.ipynb "$art/" 2>/dev/null
  # a run killed by the timeout leaves papermill's partial notebook (saved after every cell): keep it
  cp "$work/$nb-$tag/executed/".*.partial.ipynb "$art/" 2>/dev/null
  # traces stay on the device (tens of MB at real shapes); their breakdowns are in the session reports
  find "$art" -name '*.json.gz' -delete
  find "$art" -path '*/iteration/*' -delete 2>/dev/null
  cp data/ceilings/*.json "$out/" 2>/dev/null
  # bundle after every notebook: what finished comes back even if a later one is killed
  tar -C "$out" --exclude=bundle.tgz --exclude=./work -czf "$out.tgz" . && mv "$out.tgz" "$out/bundle.tgz"
done
exit $rc
