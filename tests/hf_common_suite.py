"""Hugging Face's own common model tests (``ModelTesterMixin``, ``ConfigTester``), loaded from the sdist of the
installed transformers, and the testers that feed them our tiny models (issue 46).

The transformers sdist ships ``tests/test_modeling_common.py`` and ``tests/test_configuration_common.py`` but not
the three modules they import from sibling folders (``generation/test_utils.py``, ``exporters/test_export.py``,
``utils/test_configuration_utils.py``). Those are stood in for here: the generation mixin by an empty class (our own
generation checks, tests/generation_checks.py, cover it for every family), the export mixins by empty classes (the
export tests are ours, tests/conversion/test_export*.py), and ``config_common_kwargs`` by the common
``PreTrainedConfig`` settings written below. Nothing of HF's test code is copied into this repository.

HF's real ``GenerationTesterMixin`` is used instead of the empty class where ``generation/test_utils.py`` stands beside
``test_modeling_common.py`` (taken from transformers' repository by hand: the manual check of docs/deploy.md,
"Generation"); its ``from tests.exporters.test_export import ExportGenerateTesterMixin`` gets the empty export mixin.

Where the tests come from: ``HF_COMMON_TESTS`` (a folder holding ``test_modeling_common.py``), by default
``.hf_tests/tests`` in the repository (ignored by git), which ``.ci/run`` fills with::

    python -m pip download --no-deps --no-binary :all: transformers==<installed version> -d <tmp>
    tar xzf <tmp>/transformers-<version>.tar.gz -C .hf_tests --strip-components=1 transformers-<version>/tests

Absent locally, the tests that use them skip with that command as the reason; CI sets ``HF_COMMON_TESTS_REQUIRED=1``
so that their absence fails there instead.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path
from unittest import mock

import pytest
import torch
import transformers
from testing_utils import REPO_ROOT

HF_TESTS = Path(os.environ.get("HF_COMMON_TESTS", REPO_ROOT / ".hf_tests" / "tests"))
FETCH = (
    f"python -m pip download --no-deps --no-binary :all: transformers=={transformers.__version__} -d /tmp/tf && "
    f"mkdir -p .hf_tests && tar xzf /tmp/tf/transformers-{transformers.__version__}.tar.gz -C .hf_tests "
    f"--strip-components=1 transformers-{transformers.__version__}/tests"
)
PACKAGE = "hf_sdist_tests"

# Settings every PreTrainedConfig takes, each at a value other than its default (ConfigTester checks they are kept).
CONFIG_COMMON_KWARGS = {
    "return_dict": False,
    "output_hidden_states": True,
    "output_attentions": True,
    "dtype": "float16",
    "architectures": ["SomeModel"],
    "finetuning_task": "translation",
    "id2label": {0: "label"},
    "label2id": {"label": "0"},
    "tokenizer_class": "SomeTokenizerFast",
    "problem_type": "regression",
}


def _stub(name: str, **attributes) -> None:
    module = types.ModuleType(f"{PACKAGE}.{name}")
    module.__dict__.update(attributes)
    sys.modules[module.__name__] = module
    parent, _, child = module.__name__.rpartition(".")
    if parent not in sys.modules:
        _stub(parent.removeprefix(f"{PACKAGE}."))
    setattr(sys.modules[parent], child, module)


def has_generation_tests() -> bool:
    """Whether HF's ``generation/test_utils.py`` stands at ``HF_TESTS`` (put there by hand; the sdist lacks it)."""
    return (HF_TESTS / "generation" / "test_utils.py").is_file()


def _import_generation_tests(export_mixins: dict[str, type]) -> None:
    """Import HF's ``generation/test_utils.py`` as ``hf_sdist_tests.generation.test_utils``. It imports the export
    mixin from ``tests.exporters.test_export`` (transformers' repository layout): an empty one, for that import only."""
    absolute = ("tests", "tests.exporters", "tests.exporters.test_export")
    added = [name for name in absolute if name not in sys.modules]
    for name in added:
        sys.modules[name] = types.ModuleType(name)
    sys.modules["tests.exporters.test_export"].__dict__.update(export_mixins)
    try:
        importlib.import_module(f"{PACKAGE}.generation.test_utils")
    finally:
        for name in added:
            del sys.modules[name]


def load() -> types.SimpleNamespace:
    """HF's ``ModelTesterMixin``, ``ConfigTester`` and ``ids_tensor``; skips the calling test module (fails it under
    ``HF_COMMON_TESTS_REQUIRED=1``) when the sdist's tests are not at ``HF_TESTS``."""
    if not (HF_TESTS / "test_modeling_common.py").is_file():
        reason = f"Hugging Face's common model tests are not at {HF_TESTS}; fetch them with: {FETCH}"
        if os.environ.get("HF_COMMON_TESTS_REQUIRED") == "1":
            raise RuntimeError(reason)
        pytest.skip(reason, allow_module_level=True)
    try:
        import parameterized  # noqa: F401  (HF's common tests import it)
    except ImportError:
        reason = "HF's common tests import parameterized: python -m pip install -e '.[dev]'"
        if os.environ.get("HF_COMMON_TESTS_REQUIRED") == "1":
            raise RuntimeError(reason) from None
        pytest.skip(reason, allow_module_level=True)
    if PACKAGE not in sys.modules:
        package = types.ModuleType(PACKAGE)
        package.__path__ = [str(HF_TESTS)]
        sys.modules[PACKAGE] = package
        export_mixins = {"ExportTesterMixin": type("ExportTesterMixin", (), {}),
                         "ExportGenerateTesterMixin": type("ExportGenerateTesterMixin", (), {})}
        _stub("exporters.test_export", **export_mixins)
        _stub("utils.test_configuration_utils", config_common_kwargs=CONFIG_COMMON_KWARGS)
        if has_generation_tests():
            _import_generation_tests(export_mixins)
        else:
            _stub("generation.test_utils", GenerationTesterMixin=type("GenerationTesterMixin", (), {}))
    modeling = importlib.import_module(f"{PACKAGE}.test_modeling_common")
    # test_configuration_common imports "transformers" from its own folder (the repository's src/ layout, absent
    # from the sdist) into a name it never uses: the installed transformers stands in.
    with mock.patch("transformers.utils.direct_transformers_import", lambda *_a, **_k: transformers):
        configuration = importlib.import_module(f"{PACKAGE}.test_configuration_common")
    return types.SimpleNamespace(
        ModelTesterMixin=modeling.ModelTesterMixin,
        GenerationTesterMixin=modeling.GenerationTesterMixin,
        ConfigTester=configuration.ConfigTester,
    )


class TinyModelTester:
    """What ``ModelTesterMixin`` reads of a model tester: the sizes, and a config with inputs. ``make_config`` builds
    the config (our family's, the wrapper's, or HF's own for a control) at these sizes."""

    batch_size = 3
    seq_length = 7
    vocab_size = 99
    hidden_size = 32
    num_hidden_layers = 2
    num_attention_heads = 4
    is_training = True

    def __init__(self, parent, make_config, is_encoder_decoder: bool):
        self.parent = parent
        self.make_config = make_config
        self.is_encoder_decoder = is_encoder_decoder
        if is_encoder_decoder:
            self.encoder_seq_length = self.seq_length
            self.decoder_seq_length = self.seq_length

    def get_config(self):
        return self.make_config(self)

    def prepare_config_and_inputs_for_common(self):
        from transformers.testing_utils import torch_device

        size = (self.batch_size, self.seq_length)
        input_ids = torch.randint(3, self.vocab_size, size, device=torch_device)  # no special token (0, 1, 2)
        # Left-aligned masks of different lengths (HF's testers use the same lower-triangular pattern).
        attention_mask = torch.tril(torch.ones_like(input_ids))
        attention_mask[:, 0] = 1
        inputs = {"input_ids": input_ids, "attention_mask": attention_mask}
        if self.is_encoder_decoder:
            inputs["decoder_input_ids"] = torch.randint(3, self.vocab_size, size, device=torch_device)
            inputs["decoder_attention_mask"] = torch.ones_like(inputs["decoder_input_ids"])
        return self.get_config(), inputs


__all__ = ["CONFIG_COMMON_KWARGS", "FETCH", "HF_TESTS", "TinyModelTester", "has_generation_tests", "load"]
