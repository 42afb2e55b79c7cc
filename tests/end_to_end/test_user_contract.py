"""What a Hugging Face user gets from the scripts and a saved folder: a run that would do nothing fails and says
why (it exited 0 with an empty folder), and a saved folder's tokenizer loads without an interactive prompt in the
ways the docs and the card show."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest
from script_helpers import run_script, write_tiny_parallel
from testing_utils import _BLOCK_PACKAGE, tiny_model, tiny_tokenizer

PROMPT = "Do you wish to run the custom code"


def test_a_clm_run_without_do_train_do_eval_or_do_predict_fails_naming_them(tmp_path, monkeypatch):
    """Before: docs/training.md's `python scripts/run_clm.py --output_dir runs/clm_cosine --head_mode cosine` and
    docs/converting.md's GGUF fine-tuning command (no --do_train) logged "scored without training", left an empty
    folder and exited 0."""
    (tmp_path / "train.txt").write_text("a dog runs .\n" * 20)
    output_dir = tmp_path / "out"
    with pytest.raises(ValueError, match=r"none of --do_train, --do_eval, --do_predict is given.*add --do_train"):
        run_script("run_clm", ["--output_dir", output_dir, "--train_file", tmp_path / "train.txt", "--validation_file",
                               "", "--test_file", "", "--report_to", "none", "--head_mode", "cosine",
                               "--max_steps", "120"], monkeypatch)
    assert not output_dir.exists()  # refused before any work


def test_a_translation_run_without_an_action_fails_too(tmp_path, monkeypatch):
    flags = write_tiny_parallel(tmp_path)
    with pytest.raises(ValueError, match=r"none of --do_train, --do_eval, --do_predict is given"):
        run_script("run_translation", [*flags, "--output_dir", tmp_path / "out", "--report_to", "none",
                                       "--max_steps", "3"], monkeypatch)
    assert not (tmp_path / "out").exists()


CALLS = (  # the plain call first: a call with trust_remote_code=True registers the config class for the next ones
    "AutoTokenizer.from_pretrained({folder})",
    "AutoTokenizer.from_pretrained({folder}, trust_remote_code=False)",
    "AutoTokenizer.from_pretrained({folder}, trust_remote_code=True)",
)


def load_tokenizer_without_a_terminal(folder, cwd) -> list[str]:
    """Run each of ``CALLS`` in one process where hf_tiednorm cannot be imported, with stdin closed (no terminal to
    answer a prompt); returns what each call printed, ending with the token ids of a sentence."""
    code = _BLOCK_PACKAGE + "import sys\nfrom transformers import AutoTokenizer\n"
    for number, call in enumerate(CALLS):
        code += (f"print('=== call {number}', flush=True)\n"
                 f"tokenizer = {call.format(folder=repr(str(folder)))}\n"
                 "print('ids', tokenizer('a dog runs on the grass .').input_ids, flush=True)\n")
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
    result = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout + result.stderr
    return re.split(r"=== call \d\n", result.stdout)[1:]


def test_a_saved_folders_tokenizer_loads_without_a_prompt_the_documented_ways(tmp_path):
    """transformers' AutoTokenizer first loads the folder's config with AutoConfig, which asks before running the
    custom code that config.json's auto_map names (transformers/models/auto/tokenization_auto.py calls
    ``AutoConfig.from_pretrained(..., trust_remote_code=trust_remote_code)``; configuration_auto.py passes an unset
    value to dynamic_module_utils.resolve_trust_remote_code, which prompts). No file of the folder can avoid it
    while the model must load with trust_remote_code=True, so docs/converting.md and the card say which call does
    not prompt: any explicit trust_remote_code, or importing hf_tiednorm first."""
    folder = tmp_path / "saved"
    tiny_model("causal").save_pretrained(folder)
    tokenizer = tiny_tokenizer()
    tokenizer.save_pretrained(folder)
    expected = f"ids {tokenizer('a dog runs on the grass .').input_ids}"
    plain, *documented = load_tokenizer_without_a_terminal(folder, tmp_path)
    # The plain call prompts (and, without a terminal, goes on): what the docs warn of. Should transformers stop
    # asking for a tokenizer, this fails, and the docs' warning can go.
    assert PROMPT in plain and expected in plain
    for call, output in zip(CALLS[1:], documented, strict=True):
        assert PROMPT not in output and expected in output, (call, output)
