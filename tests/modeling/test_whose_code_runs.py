"""Issue 58, case 4: whose code runs. With the package installed, transformers builds our registered classes for a
folder even with ``trust_remote_code=True`` (a model type registered in the process wins over a folder's code), so a
folder saved by another version, or whose ``modeling_tiednorm.py`` was edited, loaded with the installed code and
nothing said so. A save records the package version whose code it wrote; a load whose folder's code differs from
what the installed package writes for it (``auto_map.saved_code_files``) logs once which code runs and how to run
the folder's own, and that advice runs it."""

from __future__ import annotations

import importlib.metadata
import json
import logging
import sys

import pytest
import torch
from testing_utils import FAMILIES, model_inputs, tiny_model
from tiny_architectures import source_model
from transformers import AutoModelForCausalLM
from transformers.dynamic_module_utils import get_class_from_dynamic_module

from hf_tiednorm.convert import normalize_tied_head

LOGGER = "hf_tiednorm.conversion.saved_code"
VERSION_FIELD = "hf_tiednorm_version"  # config.json's record of the version whose code the folder carries
OWN_CLASS = "modeling_tiednorm.TiedNormForCausalLM"


@pytest.mark.parametrize("family", [*FAMILIES, "wrapped"])
def test_a_save_records_the_version_whose_code_it_wrote(family, tmp_path):
    model = normalize_tied_head(source_model("gpt2"), "cosine") if family == "wrapped" else tiny_model(family)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved[VERSION_FIELD] == importlib.metadata.version("hf_tiednorm")  # bcb37a5: no version recorded
    assert VERSION_FIELD not in saved.get("text_config", {})


@pytest.fixture
def saved(tmp_path):
    model = tiny_model("causal").eval()
    model.save_pretrained(tmp_path / "model")
    return model, tmp_path / "model"


def _reports(caplog) -> list[str]:
    return [record.getMessage() for record in caplog.records if record.name == LOGGER and "carries its own code" in
            record.getMessage()]  # fmt: skip


def test_a_folder_with_the_installed_code_says_nothing(saved, caplog):
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        AutoModelForCausalLM.from_pretrained(saved[1], trust_remote_code=True)
    assert _reports(caplog) == []


def test_an_edited_folder_says_once_which_code_runs_and_how_to_run_its_own(saved, caplog):
    model, folder = saved
    code = folder / "modeling_tiednorm.py"
    code.write_text(code.read_text() + "\nEDITED_BY_THE_USER = True\n")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        loaded = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
        AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True)
    (report,) = _reports(caplog)  # bcb37a5: nothing; and once per folder
    version = importlib.metadata.version("hf_tiednorm")
    assert f"saved by hf_tiednorm {version}; edited since, or another build: modeling_tiednorm.py differs" in report
    assert f"the installed hf_tiednorm {version} runs it" in report
    advice = f"get_class_from_dynamic_module({OWN_CLASS!r}, {str(folder)!r}).from_pretrained({str(folder)!r})"
    assert advice in report
    assert type(loaded).__module__.startswith("hf_tiednorm.")  # what the report says runs
    # the advice runs the folder's own code
    own = get_class_from_dynamic_module(OWN_CLASS, str(folder)).from_pretrained(str(folder)).eval()
    assert getattr(sys.modules[type(own).__module__], "EDITED_BY_THE_USER", False)
    inputs = model_inputs(model)
    with torch.no_grad():
        assert torch.equal(own(**inputs).logits, model(**inputs).logits)


def test_a_folder_of_another_version_names_it_and_the_files_this_version_writes(saved, caplog):
    _, folder = saved
    config = json.loads((folder / "config.json").read_text())
    # a version that wrote its code under other names (issue 56 renames the generated modules per family)
    (folder / "modeling_tiednorm.py").rename(folder / "modeling_tiednorm_causal.py")
    config["auto_map"] = {key: value.replace("modeling_tiednorm.", "modeling_tiednorm_causal.")
                          for key, value in config["auto_map"].items()}  # fmt: skip
    (folder / "config.json").write_text(json.dumps({**config, VERSION_FIELD: "0.0.9"}))
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        AutoModelForCausalLM.from_pretrained(folder)
    (report,) = _reports(caplog)
    assert ("saved by hf_tiednorm 0.0.9: modeling_tiednorm_causal.py is not a file this version writes (it writes "
            "configuration_tiednorm.py, modeling_tiednorm.py)") in report
    assert "get_class_from_dynamic_module('modeling_tiednorm_causal.TiedNormForCausalLM'" in report


@pytest.mark.parametrize("family", [*FAMILIES, "wrapped"])
def test_a_plain_export_records_no_hf_tiednorm_version(family, tmp_path):
    """A plain export carries no hf_tiednorm code, so its config.json names no hf_tiednorm version (the own families'
    exports copied every other config key)."""
    from hf_tiednorm.export import export_plain

    model = normalize_tied_head(source_model("gpt2"), "cosine") if family == "wrapped" else tiny_model(family)
    model.save_pretrained(tmp_path / "model")
    export_plain(tmp_path / "model", tmp_path / "plain")
    exported = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert VERSION_FIELD not in exported and VERSION_FIELD not in exported.get("text_config", {})
