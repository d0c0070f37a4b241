#!/usr/bin/env bash
# Reproduce the published notebook-01 GPU reports on a GPU host with no network (wheels in .whl/):
#   bash tools/gpu_run_01.sh OUT_DIR [PRESET ...]      (default presets: mg2-universal self-forcing)
set -uo pipefail
out=${1:?usage: gpu_run_01.sh OUT_DIR [PRESET ...]}; shift
presets=${*:-mg2-universal self-forcing}
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --find-links .whl papermill nbconvert ipykernel ipywidgets diffusers || exit 1
fi
python3 -m ipykernel install --name python3 >/dev/null
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv | tee "$out/nvidia-smi.csv"
work=$(mktemp -d)
rc=0
for p in $presets; do
  python3 -m wmbook run 01 --out "$work/$p" -p preset "$p" -p warmup 2 -p repeats 5 \
      -p results_path "$out/results.csv" -p output_dir "$work/$p/artifacts" || rc=1
  cp "$work/$p/01_baseline_profiling.html" "$out/01_baseline_profiling-$p.html" 2>/dev/null
  tr=$(ls "$work/$p/artifacts/"*.json.gz 2>/dev/null | head -1)
  [ -n "$tr" ] && [ "$(stat -c %s "$tr")" -lt 15000000 ] && cp "$tr" "$out/01_trace-$p.json.gz"
done
cp data/ceilings/*.json "$out/" 2>/dev/null
exit $rc
