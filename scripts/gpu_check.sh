#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py): every GPU-facing path in one device call on one H100/H200, its report in
# results/gpu_<gpu>.json. On a lent machine that reaches no package index, carry .whl (the wheels
# ../shared/device-recipe.md lists) and .gpu_data (a copy of ../shared/data/multi30k); this script installs the first
# into /tmp/site and links the second where the recipes look.
#   bash scripts/gpu_check.sh                   # on a GPU
#   bash scripts/gpu_check.sh --tiny            # on a CPU, CI-sized
#   OUT=/path bash scripts/gpu_check.sh         # the device call's result folder: the report and one capped log per
#                                               # step (<= 8 files); run folders go to a temp folder, never there
# Further flags go to scripts/gpu_check.py (--budget_s, --only, --main_minutes, ...).
# A device call may run 600 s: this script ends itself after GPU_CHECK_CALL_S (580 s; 1800 s with --tiny, on a busy
# CPU) and every command in it has its own timeout (gpu_check.py's plan: setup + preflight + steps = 540 s).
set -uo pipefail
cd "$(dirname "$0")/.."

limit=${GPU_CHECK_CALL_S:-580}
[[ " $* " == *" --tiny "* ]] && limit=${GPU_CHECK_CALL_S:-1800}
if [[ -z ${GPU_CHECK_BOUNDED:-} ]]; then
  GPU_CHECK_BOUNDED=1 exec timeout -k 5 "$limit" bash "$0" "$@"
fi

py=${PYTHON:-python3}
if [[ -d .whl ]] && compgen -G ".whl/*.whl" > /dev/null; then
  timeout 45 "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || { echo "installing the carried wheels from .whl failed (or took over 45 s)" >&2; exit 1; }
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
if [[ ! -f ../shared/data/multi30k/train.de.gz && -d .gpu_data/multi30k ]]; then
  mkdir -p ../shared/data && ln -sfn "$PWD/.gpu_data/multi30k" ../shared/data/multi30k
fi
if [[ ! -f ../shared/data/multi30k/train.de.gz ]]; then
  echo "Multi30k not found at $(pwd)/../shared/data/multi30k (carry it as .gpu_data/multi30k)" >&2
  exit 1
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1

args=()
if [[ -n ${OUT:-} ]]; then
  args+=(--out_dir "$OUT")
fi
timeout -k 5 "$(( limit - SECONDS ))" "$py" scripts/gpu_check.py "${args[@]}" "$@"
