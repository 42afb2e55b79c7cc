"""The two conversion routes give the same model: ``convert_checkpoint`` (CLI ``tiednorm-convert``) of a saved
marian / bart / llama source and ``normalize_tied_head`` of the same source loaded in memory, with the same head
options and the same ``generic`` switch, have the same class, the same state-dict keys and the same logits. A saved
conversion names its source by a Hub id only, never by a path of this machine."""

from __future__ import annotations

import json

import pytest
import torch
from tiny_architectures import CONFIGS, auto_class, inputs_for

from hf_tiednorm.convert import convert_checkpoint, normalize_tied_head, portable_name_or_path


@pytest.fixture(scope="module", params=["llama", "marian", "bart"])
def saved_source(request, tmp_path_factory):
    """A tiny tied source of ``request.param`` saved to a folder (zero final_logits_bias, as released models)."""
    torch.manual_seed(0)
    config = CONFIGS[request.param]
    model = auto_class(config).from_config(config).eval()
    folder = tmp_path_factory.mktemp(request.param)
    model.save_pretrained(folder)
    return folder, auto_class(config)


def _logits(model, _) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs_for(model)).logits


@pytest.mark.parametrize("generic", [False, True])
@pytest.mark.parametrize("head", [{"head_mode": "cosine"}, {"head_mode": "distance", "lossless_start": True}])
def test_both_routes_give_the_same_model(saved_source, generic, head, tmp_path):
    folder, auto = saved_source
    from_cli_route = convert_checkpoint(folder, generic=generic, **head).eval()
    in_memory = normalize_tied_head(auto.from_pretrained(folder), generic=generic, **head).eval()
    assert type(in_memory) is type(from_cli_route)
    assert list(in_memory.state_dict()) == list(from_cli_route.state_dict())
    for key, value in from_cli_route.state_dict().items():
        assert torch.equal(in_memory.state_dict()[key], value), key
    assert torch.equal(_logits(in_memory, auto), _logits(from_cli_route, auto))
    if not generic:  # the own family: keys of our family, not the wrapper's model.model.*
        assert type(in_memory).__name__.startswith("TiedNorm") and "Wrapped" not in type(in_memory).__name__
        in_memory.save_pretrained(tmp_path / "saved")
        reloaded = type(in_memory).from_pretrained(tmp_path / "saved").eval()
        assert torch.equal(_logits(reloaded, auto), _logits(from_cli_route, auto))


def test_generic_false_leaves_the_source_unchanged(saved_source):
    folder, auto = saved_source
    source = auto.from_pretrained(folder).eval()
    before = {key: value.clone() for key, value in source.state_dict().items()}
    normalize_tied_head(source, "cosine", generic=False)
    assert type(source) is auto._model_mapping[type(source.config)]
    assert all(torch.equal(source.state_dict()[key], value) for key, value in before.items())


def _names_or_paths(config: dict) -> list[str]:
    found = [config["_name_or_path"]] if "_name_or_path" in config else []
    return found + [name for value in config.values() if isinstance(value, dict) for name in _names_or_paths(value)]


@pytest.mark.parametrize("generic", [True, False])
def test_a_saved_conversion_carries_no_local_path(saved_source, generic, tmp_path):
    folder, auto = saved_source
    source = auto.from_pretrained(folder.resolve())  # _name_or_path: this machine's absolute folder
    assert source.config._name_or_path == str(folder.resolve())
    normalize_tied_head(source, "cosine", generic=generic).save_pretrained(tmp_path / "in_memory")
    convert_checkpoint(folder.resolve(), tmp_path / "from_folder", head_mode="cosine", generic=generic)
    for saved in ("in_memory", "from_folder"):
        text = (tmp_path / saved / "config.json").read_text()
        assert str(folder.resolve()) not in text and str(tmp_path) not in text, saved
        assert all(name == "" for name in _names_or_paths(json.loads(text))), saved


def test_a_hub_id_is_kept(saved_source, tmp_path):
    folder, auto = saved_source
    source = auto.from_pretrained(folder)
    source.config._name_or_path = "HuggingFaceTB/SmolLM2-135M"
    normalize_tied_head(source, "cosine", generic=True).save_pretrained(tmp_path)  # the wrapper's text_config
    assert _names_or_paths(json.loads((tmp_path / "config.json").read_text())) == ["HuggingFaceTB/SmolLM2-135M"]
    assert portable_name_or_path("gpt2") == "gpt2"
    for local in ("/home/user/models/x", str(folder), "../models/x", "C:\\models\\x"):
        assert portable_name_or_path(local) == "", local
