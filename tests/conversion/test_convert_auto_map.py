"""``tiednorm-convert`` of a source whose config carries its own ``auto_map`` under a built-in ``model_type``: the
converted config.json has the converted model's own top-level ``auto_map`` (nothing of the source's, also not in
``text_config``) and loads with ``trust_remote_code=True`` in a process where hf_tiednorm cannot be imported."""

from __future__ import annotations

import json

import torch
from testing_utils import run_without_package
from tiny_architectures import auto_class, inputs_for, source_model

from hf_tiednorm.convert import main

FOREIGN = {
    "AutoConfig": "someone/repo--configuration_x.XConfig",
    "AutoModelForCausalLM": "someone/repo--modeling_x.XForCausalLM",
    "AutoModelForSeq2SeqLM": "someone/repo--modeling_x.XForSeq2SeqLM",
}
# source architecture -> whether it is converted with --generic (the wrapper) or to our own family
SOURCES = {"gpt2": True, "t5": True, "llama": False}


def test_converted_folders_keep_their_own_auto_map_and_load_without_the_package(tmp_path):
    expected = {}
    for name, generic in SOURCES.items():
        source = source_model(name)
        source.save_pretrained(tmp_path / f"{name}-source")
        config_file = tmp_path / f"{name}-source" / "config.json"
        config_file.write_text(json.dumps(json.loads(config_file.read_text()) | {"auto_map": FOREIGN}))
        main(
            [str(tmp_path / f"{name}-source"), str(tmp_path / name), "--head-mode", "cosine"]
            + (["--generic"] if generic else [])
        )
        saved = json.loads((tmp_path / name / "config.json").read_text())
        auto_map = saved["auto_map"]
        assert auto_class(source.config).__name__ in auto_map and "AutoConfig" in auto_map, auto_map
        assert all(
            "--" not in value and value.split(".")[0].startswith(("modeling_tiednorm", "configuration_tiednorm"))
            for value in auto_map.values()
        ), auto_map
        assert "auto_map" not in (saved.get("text_config") or {})
        model = auto_class(source.config).from_pretrained(tmp_path / name).eval()
        inputs = inputs_for(model)
        with torch.no_grad():
            expected[name] = {
                "logits": model(**inputs).logits.tolist(),
                "auto": auto_class(source.config).__name__,
                "inputs": {k: v.tolist() for k, v in inputs.items()},
            }
    (tmp_path / "expected.json").write_text(json.dumps(expected))
    out = run_without_package(
        f"""
import json, torch, transformers
expected = json.load(open({str(tmp_path / "expected.json")!r}))
for name, case in expected.items():
    model = getattr(transformers, case["auto"]).from_pretrained({str(tmp_path)!r} + "/" + name, trust_remote_code=True)
    assert type(model).__name__.startswith("TiedNorm") and type(model).__module__.startswith("transformers_modules.")
    inputs = {{k: torch.tensor(v) for k, v in case["inputs"].items()}}
    with torch.no_grad():
        torch.testing.assert_close(model(**inputs).logits, torch.tensor(case["logits"]), rtol=0, atol=0)
    print(name, "ok")
""",
        cwd=tmp_path,
    )
    assert out.split() == [word for name in SOURCES for word in (name, "ok")]
