"""Helpers shared by the test modules: tiny configs built in code (HF's own tests work the same way), random
inputs, a tokenizer trained in code, a process where ``hf_tiednorm`` cannot be imported, and the head's
independent reference scores. Every test module imports from here; ``conftest.py`` holds only the pytest setup."""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import torch

import hf_tiednorm

REPO_ROOT = Path(__file__).resolve().parents[1]
MULTI30K = REPO_ROOT.parent / "shared" / "data" / "multi30k"
TINY_VOCAB = 61
# Every model family of the package (hf_tiednorm/modeling/families/table.py); the family-level checks run over all of
# them.
FAMILIES = tuple(hf_tiednorm.FAMILIES)


# The sizes of every tiny test model: of our families here and of the transformers architectures in
# tiny_architectures.py alike.
TINY_ENCODER_DECODER = dict(
    vocab_size=TINY_VOCAB,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=64,
)
TINY_DECODER = dict(
    vocab_size=TINY_VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=64,
)


# The tests exercise a normalized head unless they name a mode (the package's default is baseline, docs/head.md).
TEST_HEAD_MODE = {"head_mode": "cosine"}


def tiny_seq2seq_config(**overrides) -> hf_tiednorm.TiedNormSeq2SeqConfig:
    return hf_tiednorm.TiedNormSeq2SeqConfig(**TINY_ENCODER_DECODER | TEST_HEAD_MODE | {"dropout": 0.0} | overrides)


def tiny_bart_config(**overrides) -> hf_tiednorm.TiedNormBartConfig:
    # scale_embedding=True (BART's default is False) so that the tests cover the in-module sqrt(d) scaling.
    fields = TINY_ENCODER_DECODER | TEST_HEAD_MODE | {"dropout": 0.0, "scale_embedding": True}
    return hf_tiednorm.TiedNormBartConfig(**fields | overrides)


def tiny_causal_config(**overrides) -> hf_tiednorm.TiedNormCausalConfig:
    return hf_tiednorm.TiedNormCausalConfig(**TINY_DECODER | TEST_HEAD_MODE | overrides)


# The tiny configs of families that differ from the plain tiny sizes; a new family needs no entry here.
_TINY_CONFIG_BUILDERS = {"seq2seq": tiny_seq2seq_config, "bart": tiny_bart_config, "causal": tiny_causal_config}


def tiny_config(family: str, **overrides):
    """The tiny config of one family of FAMILIES, with ``overrides`` applied (validated at construction)."""
    if family not in hf_tiednorm.FAMILIES:
        raise ValueError(f"unknown family {family!r}")
    if family in _TINY_CONFIG_BUILDERS:
        return _TINY_CONFIG_BUILDERS[family](**overrides)
    description = hf_tiednorm.FAMILIES[family]
    sizes = TINY_ENCODER_DECODER if description.is_encoder_decoder else TINY_DECODER
    return description.config_class(**sizes | TEST_HEAD_MODE | overrides)


def tiny_model(family: str, **overrides):
    """A tiny randomly initialized model of one family of FAMILIES, in eval mode."""
    config = tiny_config(family, **overrides)
    torch.manual_seed(0)
    return hf_tiednorm.FAMILIES[family].lm_class(config).eval()


def model_inputs(model, batch_size: int = 2, length: int = 7, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random non-special token ids (and decoder ids for seq2seq) for a forward pass."""
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(4, model.config.vocab_size, (batch_size, length), generator=generator)
    if model.config.is_encoder_decoder:
        decoder_vocab = model.config.decoder_vocab_size
        decoder_ids = torch.randint(4, decoder_vocab, (batch_size, length - 2), generator=generator)
        return {"input_ids": ids, "decoder_input_ids": decoder_ids}
    return {"input_ids": ids}


# Prepended to code run by `run_without_package`: makes `import hf_tiednorm` fail even when the package is
# installed, so only remote code can provide the classes. The package is blocked by what it is, never by a substring
# of a path (a clone named `hf_tiednorm`, as README's install block names it, keeps its venv's site-packages in a path
# holding that name): a meta-path blocker refuses the import, and the places it would come from are removed, namely
# every sys.path entry (the checkout root, the working folder) that holds the package, and every meta-path finder
# (an editable install's) that would find it.
_BLOCK_PACKAGE = """
import importlib.machinery, os, sys
def _holds_package(entry):
    folder = os.path.abspath(entry or os.getcwd())
    return os.path.isfile(os.path.join(folder, "hf_tiednorm", "__init__.py")) or os.path.isfile(
        os.path.join(folder, "hf_tiednorm.py"))
def _finds_package(finder):
    if finder is importlib.machinery.PathFinder or not hasattr(finder, "find_spec"):
        return False
    try:
        return finder.find_spec("hf_tiednorm", None) is not None
    except Exception:
        return False
sys.path = [p for p in sys.path if not _holds_package(p)]
sys.meta_path = [f for f in sys.meta_path if not _finds_package(f)]
class _BlockHfTiednorm:
    def find_spec(self, name, path=None, target=None):
        if name == "hf_tiednorm" or name.startswith("hf_tiednorm."):
            raise ImportError("hf_tiednorm is blocked in this process")
        return None
sys.meta_path.insert(0, _BlockHfTiednorm())
sys.path_importer_cache.clear()
try:
    import hf_tiednorm
except ImportError:
    pass
else:
    raise SystemExit("hf_tiednorm is importable in the isolated process")
"""


# The loop of the session's process without the package (``run_without_package``): it reads one request a line on
# stdin (JSON: code, working folder) and answers on the pipe ``fd`` (JSON: ok, stdout, error), running each code in a
# fresh namespace as a script, its prints captured, the remote-code modules of earlier requests forgotten and what a
# script may have changed (torch's threads, default dtype, grad mode and seed; registered attention; transformers'
# Auto tables) reset.
_WORKER_LOOP = """
import contextlib, io, json, os, sys, traceback
import torch, transformers
answers = os.fdopen(int(sys.argv[1]), "w")
# The requests arrive on stdin; a script reads an empty one, as a fresh process given /dev/null does: transformers'
# "run the custom code? [y/N]" prompt would otherwise wait out its 15 s timeout (or read the next request).
requests, sys.stdin = sys.stdin, open(os.devnull)
# What a script may change in the process, restored before the next one as a fresh process would have it.
threads, dtype, seed = torch.get_num_threads(), torch.get_default_dtype(), torch.initial_seed()
attention = dict(transformers.AttentionInterface._global_mapping)
from transformers.models.auto import auto_factory, configuration_auto, modeling_auto
# transformers' Auto tables: what a folder's code or transformers registers for it (issue 60: a causal LM's type)
auto_tables = [configuration_auto.CONFIG_MAPPING,
               *(table for table in vars(modeling_auto).values() if isinstance(table, auto_factory._LazyAutoMapping))]
registered = [dict(table._extra_content) for table in auto_tables]
names = {key: dict(table) for key, table in vars(modeling_auto).items() if key.endswith("_MAPPING_NAMES")}
for request in requests:
    request = json.loads(request)
    for name in [name for name in sys.modules if name.startswith("transformers_modules")]:
        del sys.modules[name]
    torch.set_num_threads(threads)
    torch.set_default_dtype(dtype)
    torch.set_grad_enabled(True)
    torch.manual_seed(seed)
    transformers.AttentionInterface._global_mapping.clear()
    transformers.AttentionInterface._global_mapping.update(attention)
    for table, entries in zip(auto_tables, registered):
        table._extra_content.clear()
        table._extra_content.update(entries)
    for key, entries in names.items():
        getattr(modeling_auto, key).clear()
        getattr(modeling_auto, key).update(entries)
    out, err, ok = io.StringIO(), io.StringIO(), True
    os.chdir(request["cwd"])
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            exec(compile(request["code"], "<run_without_package>", "exec"), {"__name__": "__main__"})
    except SystemExit as exit:
        ok = exit.code in (None, 0)
    except BaseException:
        ok = False
        err.write(traceback.format_exc())
    answers.write(json.dumps({"ok": ok, "stdout": out.getvalue(), "stderr": err.getvalue()}) + "\\n")
    answers.flush()
"""


class _PackagelessWorker:
    """One Python process where `hf_tiednorm` cannot be imported, started at the first request and kept for the
    session: the remote-code tests share it instead of each starting (and importing torch and transformers in) one
    of their own. A request that fails or times out is reported as before; one that times out ends the process (the
    next request starts another)."""

    def __init__(self):
        self.process = None

    def start(self) -> None:
        import subprocess
        import sys

        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        self.answers_fd, write_fd = os.pipe()
        self.process = subprocess.Popen(
            [sys.executable, "-c", _BLOCK_PACKAGE + _WORKER_LOOP, str(write_fd)], stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=REPO_ROOT.parent, text=True,
            pass_fds=(write_fd,),
        )
        os.close(write_fd)
        self.answers = os.fdopen(self.answers_fd, "r")

    def stop(self) -> None:
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            self.answers.close()
            self.process = None

    def run(self, code: str, cwd: Path, timeout: float) -> dict:
        import json
        import selectors

        if self.process is None or self.process.poll() is not None:
            self.start()
        self.process.stdin.write(json.dumps({"code": code, "cwd": str(cwd)}) + "\n")
        self.process.stdin.flush()
        with selectors.DefaultSelector() as selector:
            selector.register(self.answers, selectors.EVENT_READ)
            ready = selector.select(timeout)
        line = self.answers.readline() if ready else ""
        if not line:
            self.stop()
            raise AssertionError(f"isolated process {f'timed out after {timeout} s' if not ready else 'died'}")
        return json.loads(line)


_WORKER = _PackagelessWorker()
atexit.register(_WORKER.stop)


def run_without_package(code: str, cwd: Path, timeout: int = 300, python: str | None = None) -> str:
    """Run `code` as a script where `hf_tiednorm` cannot be imported; return what it printed. By default in the
    session's shared process (``_PackagelessWorker``: a fresh namespace each time, no remote-code module of an earlier
    call left); with ``python`` (another interpreter) in a fresh process of its own."""
    if python is None:
        result = _WORKER.run(code, cwd, timeout)
        if not result["ok"]:
            raise AssertionError(f"isolated process failed:\n{result['stdout']}\n{result['stderr']}")
        return result["stdout"]
    import subprocess

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    result = subprocess.run(
        [python, "-c", _BLOCK_PACKAGE + code],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    if result.returncode != 0:
        raise AssertionError(f"isolated process failed:\n{result.stdout}\n{result.stderr}")
    return result.stdout


def interrupted_run(finished_run: Path, checkpoint: str, output_dir: Path) -> Path:
    """A new ``output_dir`` holding only ``checkpoint`` of ``finished_run`` and its tokenizer: the run as if it had
    stopped there, for resume tests to finish and compare with the uninterrupted one."""
    output_dir.mkdir()
    shutil.copytree(finished_run / checkpoint, output_dir / checkpoint)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(finished_run / name, output_dir / name)
    return output_dir


def tiny_tokenizer(vocab_size: int = TINY_VOCAB):
    """A BPE tokenizer trained in code on a few sentences, with hf_tiednorm's special-token layout."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    sentences = [
        "a dog runs on the grass .", "ein hund läuft auf dem gras .", "two men play music in the street .",
        "zwei männer spielen musik auf der straße .", "a woman reads a book .", "eine frau liest ein buch .",
    ] * 5
    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
    tokenizer.decoder = decoders.Metaspace()
    special = ["<pad>", "<s>", "</s>", "<unk>"]
    tokenizer.train_from_iterator(sentences, trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special))
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 2)])
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def reference_scores(weight: torch.Tensor, hidden: torch.Tensor, head_mode: str, eps: float = 1e-6) -> torch.Tensor:
    """The equations of Liu, Zhai & Chen, written out directly (float64, no shared code with the head).

    A row whose norm is at most the documented ``norm_eps`` (a dead row, e.g. padding) counts as zero and scores 0.
    """
    w, h = weight.double(), hidden.double()
    norms = w.norm(dim=-1)
    norms = torch.where(norms > eps, norms, torch.inf)  # w / inf = 0
    if head_mode == "baseline":
        return h @ w.T
    if head_mode in ("l2", "cosine"):
        return h @ (w / norms[:, None]).T
    if head_mode == "square":
        return (h @ w.T) / norms**2
    if head_mode == "distance":
        return h @ w.T - 0.5 * (w * w).sum(-1)
    raise AssertionError(head_mode)


# Every head mode with the options that change its column terms (logit scale g, logit bias b), for the parity tests
# of the loss paths (issue 39): (head_mode, logit_scale, logit_bias).
HEAD_VARIANTS = tuple(
    (mode, scale, bias)
    for mode in ("baseline", "l2", "square", "distance", "cosine")
    for scale, bias in (("none", False), ("vector", True), ("scalar", False))
)


def variant_head(head_mode: str, logit_scale: str, logit_bias: bool, vocab: int = 37, dim: int = 8,
                 dtype=torch.float64, seed: int = 0):
    """A ``TiedNormHead`` with random W (a dead row 0), g and b (so that their gradients are non-trivial)."""
    torch.manual_seed(seed)
    settings = hf_tiednorm.HeadSettings(head_mode=head_mode, logit_scale_kind=logit_scale, logit_bias=logit_bias)
    head = hf_tiednorm.TiedNormHead(dim, vocab, settings=settings, dtype=dtype)
    with torch.no_grad():
        head.weight.normal_(0, 0.5)
        head.weight[0] = 0  # a dead (padding) row
        if head.logit_scale is not None:
            head.logit_scale.uniform_(0.5, 2.0)
        if head.logit_bias is not None:
            head.logit_bias.normal_(0, 0.3)
    return head.to(dtype)


def head_loss_and_grads(head, hidden: torch.Tensor, labels: torch.Tensor, loss_fn) -> dict[str, torch.Tensor]:
    """``loss_fn(head, hidden, labels)`` and, after its backward, the gradients of W, g, b and h by name."""
    head.zero_grad(set_to_none=True)
    hidden = hidden.detach().clone().requires_grad_(True)
    loss = loss_fn(head, hidden, labels)
    loss.backward()
    out = {"loss": loss.detach(), "W": head.weight.grad, "h": hidden.grad}
    if head.logit_scale is not None:
        out["g"] = head.logit_scale.grad
    if head.logit_bias is not None:
        out["b"] = head.logit_bias.grad
    return out


def assert_same_loss_and_grads(got: dict, expected: dict, rtol: float = 1e-9, atol: float = 1e-11) -> None:
    """Every entry of ``expected`` (``head_loss_and_grads``) equals ``got``'s to the tolerances, naming the tensor."""
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(
            got[name].to(value.dtype), value, rtol=rtol, atol=atol, msg=lambda m, n=name: f"{n}: {m}"
        )


@contextlib.contextmanager
def bind_mounted(source: Path, mount_point: Path, monkeypatch, simulate: bool = False) -> Iterator[str]:
    """``mount_point`` showing the folder ``source`` under another path, as ``mount --bind source mount_point`` does
    (no spelling relates the two; device and inode do). A real bind mount where this process may mount (root, as in
    this sandbox) unless ``simulate``; else a copy of ``source`` whose ``os.stat`` (what the package's identity checks
    call) answers with the identity of the file it stands for. Yields ``"mount"`` or ``"simulated"``."""
    mount_point.mkdir(parents=True, exist_ok=True)
    mounted = not simulate and shutil.which("mount") is not None and subprocess.run(
        ["mount", "--bind", str(source), str(mount_point)], capture_output=True).returncode == 0
    if mounted:
        try:
            yield "mount"
        finally:
            subprocess.run(["umount", str(mount_point)], check=True)
        return
    shutil.copytree(source, mount_point, dirs_exist_ok=True)
    real_stat, root = os.stat, os.path.abspath(mount_point)

    def stat(path, *args, **kwargs):
        if isinstance(path, (str, os.PathLike)):
            absolute = os.path.abspath(path)
            if absolute == root or absolute.startswith(root + os.sep):
                path = os.path.join(source, os.path.relpath(absolute, root))
        return real_stat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    yield "simulated"
