"""HF's own generation tests (``GenerationTesterMixin`` of transformers' ``tests/generation/test_utils.py``) on every
family and the wrapper, beside HF's Llama, Marian, BART, Qwen3 and GPT-2 as controls (issue 57).

The transformers sdist ships no ``tests/generation/``, so the mixin is taken by hand from transformers' repository
and put beside the sdist's ``test_modeling_common.py`` (docs/deploy.md, "Generation", says which file and how);
tests/hf_common_suite.py then loads the real mixin instead of its empty stand-in, and the test cases of
tests/modeling/families/test_hf_common_models.py (every family at cosine and baseline, the wrapper around Llama,
Qwen3, GPT-2 and BART, the controls) run it. This script runs only the mixin's tests, counts passed, skipped and
failed per class, and lists, for each of ours, every test its control passes that it fails and every test its control
runs that it skips: the check is that there is none::

    HF_COMMON_TESTS=/path/to/tests python experiments/hf_generation_tests.py [--only wrapped_llama control_llama]
        [--output results/hf_generation_tests.json]

The exit status is 1 when one of ours differs from its control, 2 when the mixin is not there.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TEST_FILE = REPO / "tests" / "modeling" / "families" / "test_hf_common_models.py"

# Each of ours -> the HF class it is compared with (tests/modeling/families/test_hf_common_models.py's cases).
CONTROL_OF = {
    "causal": "control_llama",
    "seq2seq": "control_marian",
    "bart": "control_bart",
    "wrapped_llama": "control_llama",
    "wrapped_qwen3": "control_qwen3_lm",
    "wrapped_gpt2": "control_gpt2_lm",
    "wrapped_bart": "control_bart",
}
MODES = ("cosine", "baseline")


def case_name(class_name: str) -> str:
    """``Test_wrapped_llama_cosine`` -> ``wrapped_llama_cosine``."""
    return class_name.removeprefix("Test_")


def control_of(case: str) -> str | None:
    """The control a case of ours is compared with (None for a control)."""
    for ours, control in CONTROL_OF.items():
        if case in (f"{ours}_{mode}" for mode in MODES):
            return control
    return None


class MixinTestsOnly:
    """A pytest plugin: keeps the tests that ``GenerationTesterMixin`` defines and records each one's outcome."""

    def __init__(self, only: list[str] | None):
        self.only = only
        self.outcomes: dict[str, dict[str, dict[str, str]]] = {}

    def pytest_configure(self, config):
        # The suite fails a test on a deprecation warning attributed to hf_tiednorm (setup.cfg). HF's tests pass
        # deprecated arguments themselves (generate(past_key_values=...)), and transformers attributes that warning to
        # the caller of the decorated generate: our families' generate, which calls it. Warnings count as HF counts
        # them (shown, never failing); an ini line added last takes precedence over the earlier ones.
        for category in ("DeprecationWarning", "FutureWarning"):
            config.addinivalue_line("filterwarnings", f"default::{category}:hf_tiednorm")

    def pytest_collection_modifyitems(self, config, items):
        import hf_common_suite

        mixin = sys.modules[f"{hf_common_suite.PACKAGE}.generation.test_utils"].GenerationTesterMixin
        names = {name for name in vars(mixin) if name.startswith("test_")}
        kept, dropped = [], []
        for item in items:
            parts = item.nodeid.split("::")
            case = case_name(parts[1]) if item.cls is not None and len(parts) == 3 else None
            wanted = case is not None and item.name in names
            if wanted and self.only:
                wanted = any(case in (name, *(f"{name}_{mode}" for mode in MODES)) for name in self.only)
            (kept if wanted else dropped).append(item)
        items[:] = kept
        config.hook.pytest_deselected(items=dropped)

    def pytest_runtest_logreport(self, report):
        if report.when == "call" or report.outcome != "passed":  # a setup skip or error counts too
            case = case_name(report.nodeid.split("::")[1])
            test = report.nodeid.split("::")[2]
            recorded = self.outcomes.setdefault(case, {})
            if test in recorded and recorded[test]["outcome"] != "passed":
                return  # a teardown after a failed call keeps the call's outcome
            detail = ""
            if report.outcome == "skipped" and isinstance(report.longrepr, tuple):
                detail = report.longrepr[2]
            elif report.outcome == "failed":
                detail = report.longreprtext.strip().splitlines()[-1][:300] if report.longreprtext else ""
            recorded[test] = {"outcome": report.outcome, "detail": detail}


def differences(outcomes: dict[str, dict[str, dict[str, str]]]) -> dict[str, list[str]]:
    """For each case of ours whose control ran: the tests its control passes that it fails (or errors), and the
    tests its control runs that it skips."""
    found = {}
    for case, tests in outcomes.items():
        control = control_of(case)
        if control is None or control not in outcomes:
            continue
        lines = []
        for test, result in sorted(tests.items()):
            theirs = outcomes[control].get(test, {}).get("outcome")
            if theirs == "passed" and result["outcome"] == "failed":
                lines.append(f"{test}: fails ({result['detail']}); {control} passes")
            elif theirs in ("passed", "failed") and result["outcome"] == "skipped":
                lines.append(f"{test}: skipped ({result['detail']}); {control} runs it ({theirs})")
        found[case] = lines
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", nargs="+", help="cases to run: a case (wrapped_llama_cosine, control_llama) or one "
                        "of ours at both modes (wrapped_llama) (default: all)")
    parser.add_argument("--output", default="results/hf_generation_tests.json", help="JSON written "
                        "(default: %(default)s)")
    parser.add_argument("pytest_args", nargs="*", help="more pytest arguments (after --)")
    args = parser.parse_args(argv)

    hf_tests = Path(os.environ.get("HF_COMMON_TESTS", REPO / ".hf_tests" / "tests")).resolve()
    mixin_file = hf_tests / "generation" / "test_utils.py"
    if not mixin_file.is_file():
        print(f"no {mixin_file}: put transformers' tests/generation/test_utils.py there (docs/deploy.md, "
              "'Generation'), or point HF_COMMON_TESTS at the folder that holds it", file=sys.stderr)
        return 2
    os.environ["HF_COMMON_TESTS"] = str(hf_tests)
    os.environ["HF_COMMON_TESTS_REQUIRED"] = "1"

    import pytest
    import torch
    import transformers

    plugin = MixinTestsOnly(args.only)
    # HF's mixin marks its tests "generate", a mark this repository does not declare.
    pytest.main([str(TEST_FILE), "-m", "slow or not slow", "-q", "-p", "no:cacheprovider",
                 "-W", "ignore::pytest.PytestUnknownMarkWarning", *args.pytest_args],
                plugins=[plugin])
    counts = {case: dict(Counter(result["outcome"] for result in tests.values()))
              for case, tests in sorted(plugin.outcomes.items())}
    found = differences(plugin.outcomes)

    print("\nGenerationTesterMixin, per class (passed / skipped / failed):")
    for case, count in counts.items():
        versus = f"   vs {control_of(case)}: {len(found[case])} differences" if case in found else ""
        print(f"  {case:28s} {count.get('passed', 0):3d} / {count.get('skipped', 0):3d} / "
              f"{count.get('failed', 0):3d}{versus}")
        for line in found.get(case, []):
            print(f"      {line}")

    import hashlib

    path = REPO / args.output
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({
        "mixin_sha256": hashlib.sha256(mixin_file.read_bytes()).hexdigest(),
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__,
                     "python": platform.python_version(), "cpu": platform.processor() or platform.machine()},
        "counts": counts, "differences": found, "outcomes": plugin.outcomes,
    }, indent=1) + "\n")
    return 1 if any(found.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
