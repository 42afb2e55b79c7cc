#!/usr/bin/env bash
# The lowest torch and transformers versions setup.cfg declares, tested: a venv with exactly those two (the rest as
# pip resolves them) runs a representative slice of the suite on the CPU: a training step of every family and of
# the wrapper on every loss path in fp32 and bf16, generation, conversion, in-memory export and the Trainer loop
# (tests/modeling/test_emulated_accelerator.py), the fused and chunked losses, the head's row norms, the export and the
# converter. tests/test_lowest_versions.py (slow) runs this script.
#   bash .ci/lowest_versions.sh                 # venv in ${TMPDIR:-/tmp}/hf_tiednorm_lowest_venv, kept for reruns
#   LOWEST_VENV=/path bash .ci/lowest_versions.sh [pytest args]   # other venv; args replace the slice
#
# PyPI's Linux torch wheels before 2.13 are CUDA builds whose nvidia-* dependencies weigh GBs: torch is installed
# without its dependencies (and accelerate, which requires torch, too), and where the CUDA libraries it links are
# missing, .ci/stub_cuda_libs.py builds stubs of them (gcc) so that it imports and runs on the CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
lowest() { sed -n "s/^ *$1>=\([0-9][0-9.]*\).*/\1/p" setup.cfg | head -1; }
torch_version=$(lowest torch)
transformers_version=$(lowest transformers)
[[ -n $torch_version && -n $transformers_version ]] || { echo "setup.cfg declares no torch>=/transformers>= lowest version" >&2; exit 2; }
venv=${LOWEST_VENV:-${TMPDIR:-/tmp}/hf_tiednorm_lowest_venv}
py=$venv/bin/python
if [[ ! -x $py ]]; then
  python3 -m venv "$venv"
fi
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
installed() {  # the venv has distribution $1 at version $2 (2.11 == 2.11.0)
  "$py" -c "import importlib.metadata as m, sys; from packaging.version import Version as V; sys.exit(V(m.version('$1')) != V('$2'))" 2>/dev/null
}
if ! installed torch "$torch_version" || ! installed transformers "$transformers_version"; then
  "$py" -m pip install -q --upgrade pip
  # torch's own pure-Python dependencies, then torch itself without the nvidia-* ones.
  "$py" -m pip install -q typing_extensions filelock sympy networkx jinja2 fsspec numpy
  "$py" -m pip install -q --no-deps "torch==$torch_version"
  "$py" -m pip install -q "transformers==$transformers_version" "datasets>=3" "evaluate>=0.4" "tokenizers>=0.20" \
    "sacrebleu>=2.4" "safetensors>=0.4" "huggingface_hub>=$(lowest huggingface_hub)" "matplotlib>=3.8" "pyyaml>=6" psutil packaging pytest
  "$py" -m pip install -q --no-deps "accelerate>=1.0"
  "$py" -m pip install -q --no-deps -e .
fi
stubs=$venv/cuda-stubs
if ! "$py" -c "import torch" 2>/dev/null; then
  torch_lib=$("$py" -c "import importlib.util, pathlib; print(pathlib.Path(importlib.util.find_spec('torch').origin).parent / 'lib')")
  [[ -d $stubs ]] || "$py" .ci/stub_cuda_libs.py "$torch_lib" "$stubs"
  export LD_LIBRARY_PATH=$stubs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
"$py" -c "import torch, transformers; print('lowest versions: torch', torch.__version__, 'transformers', transformers.__version__)"
if [[ $# -eq 0 ]]; then
  set -- tests/modeling/test_emulated_accelerator.py tests/modeling/loss/test_fused_loss.py tests/modeling/head/test_row_norms.py tests/conversion/test_export.py \
    tests/conversion/test_convert.py
fi
exec "$py" -m pytest -q -p no:cacheprovider "$@"
