"""A config field is described once (issue 23): its help text and its fine-tuning rule live in the field metadata of the
config mixins (``configuration_tiednorm.script_flag``), and the training scripts' flags, the fine-tune / architecture
field lists, run_translation.py's TiedNorm-only flags, the model card's field list and the grid's mode list are
derived from them. And the scripts' --help (issue 26) says how a config file is given, names the real defaults and has
a help text for every option."""

from __future__ import annotations

import dataclasses

import pytest
from script_helpers import load_script

from hf_tiednorm.conversion.field_help import flag_of, script_flag
from hf_tiednorm.modeling.families.configuration import TiedNormHeadConfigMixin
from hf_tiednorm.modeling.families.configuration_techniques import TiedNormTechniquesConfigMixin
from hf_tiednorm.modeling.head.settings import HeadSettings
from hf_tiednorm.registration.head_modes import HEAD_MODES
from hf_tiednorm.training.arguments import TiedNormModelArguments, argument_parser, model_arguments_class
from hf_tiednorm.training.precision import TiedNormSeq2SeqTrainingArguments, TiedNormTrainingArguments

TECHNIQUE_FIELDS = [field for field in dataclasses.fields(TiedNormTechniquesConfigMixin) if flag_of(field)]


@dataclasses.dataclass(init=False, repr=False, eq=False, kw_only=True)
class DummyTechniqueConfigMixin(TiedNormTechniquesConfigMixin):
    """A technique added to the config as a new one would be: one field with its metadata, nothing else."""

    dummy_strength: float | int = dataclasses.field(
        default=0.25, metadata=script_flag("strength of the dummy technique, a loss weight", finetune=True)
    )


def help_of(parser, flag: str) -> str:
    (action,) = [action for action in parser._actions if f"--{flag}" in action.option_strings]
    return parser._get_formatter()._expand_help(action)


def test_a_new_config_field_becomes_a_script_flag_with_its_help_and_fine_tuning_rule(tmp_path):
    arguments = model_arguments_class(TiedNormHeadConfigMixin, DummyTechniqueConfigMixin)
    parser = argument_parser((arguments,))
    assert help_of(parser, "dummy_strength") == (
        "strength of the dummy technique, a loss weight (default: 0.25, the config's)"
    )
    assert "dummy_strength" in arguments.config_fields and "dummy_strength" in arguments.finetune_fields
    assert "dummy_strength" not in arguments.architecture_fields()
    (parsed,) = parser.parse_args_into_dataclasses(args=["--dummy_strength", "0.5", "--head_mode", "l2"])
    assert parsed.config_overrides() == {"head_mode": "l2", "dummy_strength": 0.5}
    (unset,) = parser.parse_args_into_dataclasses(args=[])
    assert unset.config_overrides() == {}  # None keeps the config's defaults


def test_the_flags_are_the_config_fields_with_their_metadata():
    config_fields = {
        field.name: field for mixin in (TiedNormHeadConfigMixin, TiedNormTechniquesConfigMixin)
        for field in dataclasses.fields(mixin) if flag_of(field)
    }
    flags = {field.name: field for field in dataclasses.fields(TiedNormModelArguments) if field.name in config_fields}
    assert flags.keys() == config_fields.keys()
    assert "lossless_start" not in flags  # a config field without script_flag metadata is no flag
    assert "norm_eps" in flags  # the convert CLI derives --norm-eps from the same metadata (issue 41)
    for name, flag in flags.items():
        assert flag.default is None
        assert flag.metadata["help"].startswith(flag_of(config_fields[name])["help"])
    assert set(TiedNormModelArguments.finetune_fields) == {
        "label_smoothing", "projection_regularization", "weight_norm_regularization", "weight_norm_target",
        "loss_chunk_size", "loss_implementation",
    }
    assert TiedNormModelArguments.new_model_fields == ("weight_norm_init_sigma",)
    assert "weight_norm_init_sigma" not in TiedNormModelArguments.config_fields


def test_tiednorm_only_flags_are_every_technique_flag_but_the_contenders():
    translation = load_script("run_translation")
    assert set(translation.TIEDNORM_ONLY_FLAGS) == (
        {field.name for field in TECHNIQUE_FIELDS}
        | set(HeadSettings.field_names())
        | {"loss_implementation", "extra_terms"}  # extra_terms: the registered head terms a new model learns
    ) - {"label_smoothing", "embedding_init_std"}


def test_the_grid_runs_every_head_mode_of_the_paper():
    from paper_grid import cells  # experiments/paper_grid/ (on sys.path: conftest.py)

    # Written out from the paper (Liu, Zhai & Chen: eq. 1, 19, 22, 26, 27), not read from the package's registry.
    paper_modes = {"baseline", "l2", "square", "distance", "cosine"}
    assert paper_modes <= set(HEAD_MODES)
    assert paper_modes <= set(cells.TRANSLATION_VARIANTS)


@pytest.mark.parametrize("script", ["run_translation", "run_clm"])
def test_help_says_a_config_file_may_come_first_names_real_defaults_and_explains_every_option(script, capsys):
    module = load_script(script)
    training = TiedNormSeq2SeqTrainingArguments if script == "run_translation" else TiedNormTrainingArguments
    parser = argument_parser(
        (module.ModelArguments, module.DataArguments, module.RunArguments, module.OutputDirArguments, training),
        description=module.__doc__.split("\n\n")[0],
    )
    text = parser.format_help()
    assert text.startswith(f"usage: {parser.prog} [CONFIG.yaml | CONFIG.json] [--FLAG VALUE ...]")
    assert "config file may come first" in " ".join(text.split())
    head_mode = help_of(parser, "head_mode")
    assert "default: baseline" in head_mode and "default: None" not in head_mode
    assert f"one of {', '.join(HEAD_MODES)} (default: baseline" in " ".join(head_mode.split())
    missing = [action.dest for action in parser._actions if not (action.help or "").strip()]
    assert not missing, f"options without help: {missing}"
