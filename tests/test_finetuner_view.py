"""What a fine-tuner of a pretrained LLM sees (issue 43): cards that state only what is known, learned head terms
that stay fp32 and train under bf16 weights, one conversion route, wrapped configs that refuse own-family fields by
name, and run_clm's ``--validation_file None``."""

from __future__ import annotations

from script_helpers import load_script
from transformers import HfArgumentParser


def test_validation_file_none_means_no_evaluation():
    script = load_script("run_clm")
    (data,) = HfArgumentParser(script.DataArguments).parse_args_into_dataclasses(
        ["--validation_file", "None", "--test_file", "none"]
    )
    assert data.validation_file is None and data.test_file is None
    (data,) = HfArgumentParser(script.DataArguments).parse_args_into_dataclasses([])
    assert data.validation_file.endswith("val.en.gz")
