#!/usr/bin/env bash
# The GPU check (scripts/gpu_check.py): every GPU-facing path in one device call of at most 8 minutes on one
# H100/H200, its report in results/gpu_<gpu>.json. On a lent machine that reaches no package index, carry .whl (the
# wheels ../shared/device-recipe.md lists) and .gpu_data (a copy of ../shared/data/multi30k); this script installs
# the first into /tmp/site and links the second where the recipes look.
#   bash scripts/gpu_check.sh                   # on a GPU
#   bash scripts/gpu_check.sh --tiny            # on a CPU, CI-sized
#   OUT=/path bash scripts/gpu_check.sh         # logs and run folders under $OUT (the device call's result folder)
# Further flags go to scripts/gpu_check.py (--budget_s, --only, --main_minutes, ...).
set -uo pipefail
cd "$(dirname "$0")/.."

py=${PYTHON:-python3}
if [[ -d .whl ]] && compgen -G ".whl/*.whl" > /dev/null; then
  timeout 120 "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    .whl/*.whl || { echo "installing the carried wheels from .whl failed" >&2; exit 1; }
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

work=${OUT:-}
args=()
if [[ -n "$work" ]]; then
  args+=(--work_dir "$work/gpu_check" --log_dir "$work/logs")
fi
"$py" -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count())"
"$py" scripts/gpu_check.py "${args[@]}" "$@"
status=$?
if [[ -n "$work" ]]; then
  cp results/gpu_*.json "$work/" 2>/dev/null || true
fi
exit $status
