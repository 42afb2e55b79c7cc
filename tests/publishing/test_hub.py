"""push_to_hub: the dry-run folder loads without hf_tiednorm, and the upload path sends exactly that folder."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Self

import pytest
import torch
from huggingface_hub import ModelCard, constants
from testing_utils import REPO_ROOT, model_inputs, run_without_package, tiny_model
from tiny_architectures import inputs_for, source_model
from tokenizers import Tokenizer, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from hf_tiednorm.convert import normalize_tied_head
from hf_tiednorm.publishing.hub import main, prepare_upload_folder, push_to_hub

REPO_ID = "tester/tiny-tiednorm"
LINES = ["a man rides a bike", "ein mann fährt fahrrad", "two dogs play in the snow", "zwei hunde spielen im schnee"]


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer with hf_tiednorm's special tokens <pad>=0, <s>=1, </s>=2, <unk>=3."""
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.train_from_iterator(LINES, trainers.WordLevelTrainer(special_tokens=["<pad>", "<s>", "</s>", "<unk>"]))
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )


def folder_digest(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in folder.rglob("*") if p.is_file()
    }


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module]]:
    """A saved tiny model of each family, with a tokenizer and a plot, as a training run leaves it."""
    saved = {}
    for family in ("seq2seq", "causal"):
        folder = tmp_path_factory.mktemp(f"checkpoint_{family}")
        model = tiny_model(family, head_mode="distance")
        model.save_pretrained(folder)
        tiny_tokenizer().save_pretrained(folder)
        (folder / "embedding_norms.png").write_bytes(b"\x89PNG\r\n\x1a\n fake histogram")
        saved[family] = folder, model
    return saved


def test_dry_run_folder_loads_without_package_and_reproduces_logits(checkpoints, tmp_path):
    script = "import torch\nfrom transformers import AutoTokenizer, AutoModelForCausalLM, AutoModelForSeq2SeqLM\n"
    expected = {}
    for family, (folder, model) in checkpoints.items():
        before = folder_digest(folder)
        upload = push_to_hub(folder, REPO_ID, dry_run_dir=tmp_path / family, dataset="bentrevett/multi30k")
        assert folder_digest(folder) == before  # the checkpoint is only read

        files = {p.name for p in upload.iterdir()}
        assert {"config.json", "model.safetensors", "tokenizer.json", "README.md", "embedding_norms.png"} <= files
        assert {"configuration_tiednorm.py", "modeling_tiednorm.py"} <= files  # the remote code travels along
        assert REPO_ID in (upload / "README.md").read_text()
        assert "local_files_only" not in json.loads((upload / "tokenizer_config.json").read_text())

        inputs = model_inputs(model)
        with torch.no_grad():
            expected[family] = model(**inputs).logits
        torch.save(inputs, tmp_path / f"{family}_inputs.pt")
        auto_class = "AutoModelForSeq2SeqLM" if family == "seq2seq" else "AutoModelForCausalLM"
        # One isolated process loads both folders: each Python start-up with torch costs seconds.
        script += f"""
model = {auto_class}.from_pretrained({str(upload)!r}, trust_remote_code=True).eval()
assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
tokenizer = AutoTokenizer.from_pretrained({str(upload)!r})
assert tokenizer("a man rides")["input_ids"][:3] == tokenizer.convert_tokens_to_ids(["a", "man", "rides"])
with torch.no_grad():
    logits = model(**torch.load({str(tmp_path / f"{family}_inputs.pt")!r})).logits
torch.save(logits, {str(tmp_path / f"{family}_logits.pt")!r})
"""
    run_without_package(script, cwd=tmp_path)
    for family, logits in expected.items():
        torch.testing.assert_close(torch.load(tmp_path / f"{family}_logits.pt"), logits, rtol=0, atol=0)


def test_dry_run_of_converted_checkpoints_loads_without_package(tmp_path):
    """Converted (tiednorm_wrapped) folders of a causal LM and an encoder-decoder stage like our own families: the
    card describes the wrapped architecture, and the staged folder reloads from its own code (identical logits) and,
    for the encoder-decoder, serves the translation pipeline."""
    script = "import torch\nfrom transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM, pipeline\n"
    expected = {}
    for name, head_mode, auto_class in (("gpt2", "cosine", "AutoModelForCausalLM"),
                                        ("m2m_100", "l2", "AutoModelForSeq2SeqLM")):  # fmt: skip
        folder = tmp_path / f"converted_{name}"
        model = normalize_tied_head(source_model(name), head_mode, logit_scale_kind="scalar").eval()
        model.save_pretrained(folder)
        tiny_tokenizer().save_pretrained(folder)
        before = folder_digest(folder)
        upload = push_to_hub(folder, REPO_ID, dry_run_dir=tmp_path / f"upload_{name}", dataset="bentrevett/multi30k")
        assert folder_digest(folder) == before

        files = {p.name for p in upload.iterdir()}
        assert {"config.json", "model.safetensors", "tokenizer.json", "README.md"} <= files
        assert {"configuration_tiednorm.py", "modeling_tiednorm.py"} <= files
        card = ModelCard.load(upload / "README.md")
        assert {"tiednorm", head_mode, name} <= set(card.data.tags) and card.data.datasets == ["bentrevett/multi30k"]
        assert f"`{name}` model (transformers' own code)" in card.text and REPO_ID in card.text

        inputs = inputs_for(model)
        with torch.no_grad():
            expected[name] = model(**inputs).logits
        torch.save(inputs, tmp_path / f"{name}_inputs.pt")
        script += f"""
model = {auto_class}.from_pretrained({str(upload)!r}, trust_remote_code=True).eval()
assert type(model).__module__.startswith("transformers_modules"), type(model).__module__
with torch.no_grad():
    logits = model(**torch.load({str(tmp_path / f"{name}_inputs.pt")!r})).logits
torch.save(logits, {str(tmp_path / f"{name}_logits.pt")!r})
"""
    assert 'pipeline("tiednorm-translation"' in (tmp_path / "upload_m2m_100" / "README.md").read_text()
    script += f"""
translator = pipeline("tiednorm-translation", model={str(tmp_path / "upload_m2m_100")!r}, trust_remote_code=True)
(out,) = translator("ein mann fährt fahrrad", max_new_tokens=4)
assert isinstance(out["translation_text"], str), out
"""
    run_without_package(script, cwd=tmp_path)
    for name, logits in expected.items():
        torch.testing.assert_close(torch.load(tmp_path / f"{name}_logits.pt"), logits, rtol=0, atol=0)


class FakeHub:
    """The Hub endpoints that create_repo + upload_folder call for regular (non-LFS) files, on 127.0.0.1."""

    def __init__(self) -> None:
        self.created: list[dict] = []
        self.validated_cards: list[str] = []
        self.files: dict[str, bytes] = {}
        self.commit_messages: list[str] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep pytest output clean
                pass

            def _reply(self, payload: dict, status: int = 200) -> None:
                body = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.headers.get("Authorization") != "Bearer hf_fake_token":
                    return self._reply({"error": "Invalid credentials"}, status=401)
                if self.path == "/api/repos/create":
                    request = json.loads(body)
                    hub.created.append(request)
                    return self._reply({"url": f"{hub.endpoint}/{request['organization']}/{request['name']}"})
                if self.path == "/api/validate-yaml":  # upload_folder checks README.md's front matter first
                    hub.validated_cards.append(json.loads(body)["content"])
                    return self._reply({"errors": [], "warnings": []})
                if self.path.startswith(f"/api/models/{REPO_ID}/preupload/"):
                    files = json.loads(body)["files"]
                    modes = [{"path": f["path"], "uploadMode": "regular", "shouldIgnore": False} for f in files]
                    return self._reply({"files": modes})
                if self.path.startswith(f"/api/models/{REPO_ID}/commit/"):
                    for line in body.decode().splitlines():
                        item = json.loads(line)
                        if item["key"] == "header":
                            hub.commit_messages.append(item["value"]["summary"])
                        elif item["key"] == "file":
                            hub.files[item["value"]["path"]] = base64.b64decode(item["value"]["content"])
                    return self._reply(
                        {"commitUrl": f"{hub.endpoint}/{REPO_ID}/commit/{'0' * 40}", "commitOid": "0" * 40}
                    )
                return self._reply({"error": f"unexpected {self.path}"}, status=404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.1}, daemon=True)

    def __enter__(self) -> Self:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)


def assert_received_the_preview(hub: FakeHub, preview: Path) -> None:
    assert hub.created == [{"name": REPO_ID.split("/")[1], "organization": "tester", "visibility": "public"}]
    assert hub.commit_messages == ["tiny upload"]
    assert hub.validated_cards == [(preview / "README.md").read_text()]
    assert {path: hashlib.sha256(data).hexdigest() for path, data in hub.files.items()} == folder_digest(preview)


CLI_ARGS = [REPO_ID, "--public", "--commit-message", "tiny upload", "--dataset", "bentrevett/multi30k"]


def test_upload_sends_every_file_of_the_dry_run_folder(checkpoints, tmp_path, monkeypatch):
    folder, _ = checkpoints["seq2seq"]
    preview = prepare_upload_folder(folder, tmp_path / "preview", repo_id=REPO_ID, dataset="bentrevett/multi30k")
    monkeypatch.setenv("HF_TOKEN", "hf_fake_token")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with FakeHub() as hub:
        # What HF_ENDPOINT sets when huggingface_hub is imported; test_upload_with_hf_endpoint_env sets the variable.
        monkeypatch.setattr(constants, "ENDPOINT", hub.endpoint)
        main([str(folder), *CLI_ARGS])
    assert_received_the_preview(hub, preview)


@pytest.mark.slow
def test_upload_with_hf_endpoint_env(checkpoints, tmp_path):
    """The same upload from a fresh process configured only through the environment, as a user runs it."""
    folder, _ = checkpoints["seq2seq"]
    preview = prepare_upload_folder(folder, tmp_path / "preview", repo_id=REPO_ID, dataset="bentrevett/multi30k")
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "PYTHONPATH")}
    env.update(HF_HUB_OFFLINE="0", HF_HOME=str(tmp_path / "hf_home"), PYTHONPATH=str(REPO_ROOT))
    env.update(HF_TOKEN="hf_fake_token", HF_HUB_DISABLE_PROGRESS_BARS="1")
    with FakeHub() as hub:
        env["HF_ENDPOINT"] = hub.endpoint
        command = [sys.executable, "-m", "hf_tiednorm.publishing.hub", str(folder), *CLI_ARGS]
        result = subprocess.run(
            command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
        )
    assert result.returncode == 0, result.stderr
    assert_received_the_preview(hub, preview)


def test_missing_token_and_unreachable_endpoint_fail_clearly_and_keep_the_checkpoint(
    checkpoints, tmp_path, monkeypatch
):
    folder, _ = checkpoints["causal"]
    before = folder_digest(folder)
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no_token"))
    with pytest.raises(OSError, match="no Hugging Face token found"):
        push_to_hub(folder, REPO_ID)
    # Port 9 (discard) is closed on 127.0.0.1: the connection is refused at once.
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(ConnectionError, match="cannot reach the Hub at http://127.0.0.1:9"):
        push_to_hub(folder, REPO_ID, token="hf_fake_token")
    assert folder_digest(folder) == before


def test_upload_folder_refuses_bad_targets(checkpoints, tmp_path):
    folder, _ = checkpoints["causal"]
    with pytest.raises(ValueError, match="outside the checkpoint folder"):
        prepare_upload_folder(folder, folder / "upload", repo_id=REPO_ID)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "keep.txt").write_text("mine")
    with pytest.raises(FileExistsError, match="not empty"):
        prepare_upload_folder(folder, tmp_path / "busy", repo_id=REPO_ID)
    assert (tmp_path / "busy" / "keep.txt").read_text() == "mine"
    with pytest.raises(FileNotFoundError, match="no tokenizer"):
        prepare_upload_folder(folder, tmp_path / "up", repo_id=REPO_ID, tokenizer=tmp_path)
