#!/usr/bin/env bash
# README command 1: make or reuse the project venv ./.venv, install into it, train the default small TiedNorm model
# de→en on Multi30k, score sacreBLEU on test_2016_flickr with beam 4, and save model + tokenizer + card + predictions.
#   bash scripts/main_job.sh                      # full recipe (scripts/configs/multi30k_de_en.yaml)
#   bash scripts/main_job.sh --quick              # a couple of minutes (scripts/configs/multi30k_de_en_quick.yaml)
#   bash scripts/main_job.sh --output_dir runs/x  # any further flag overrides the config
# Everything is installed into the repository's own virtual environment .venv (created on the first run, reused after;
# TIEDNORM_VENV=path picks another one), never into the Python that happens to be active.
set -euo pipefail
cd "$(dirname "$0")/.."

config=scripts/configs/multi30k_de_en.yaml
if [[ "${1:-}" == "--quick" ]]; then
  config=scripts/configs/multi30k_de_en_quick.yaml
  shift
fi
data=../shared/data/multi30k
if [[ ! -f "$data/train.de.gz" ]]; then
  echo "Multi30k not found at $(pwd)/$data (expected train/val/test_2016_flickr .de.gz/.en.gz)" >&2
  exit 1
fi

venv=${TIEDNORM_VENV:-.venv}
if [[ ! -x "$venv/bin/python" ]]; then
  echo "creating the project virtual environment $venv" >&2
  python3 -m venv "$venv"
fi
# shellcheck disable=SC1091
. "$venv/bin/activate"

# torch first, so that the package's dependencies resolve against this exact version.
python -m pip install torch==2.13.0
python -m pip install -e .

export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
python scripts/run_translation.py "$config" "$@"
