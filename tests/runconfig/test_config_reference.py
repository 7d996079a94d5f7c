"""docs/config-reference.md is generated from the schema; these tests keep the two from drifting apart."""

import subprocess
import sys
from pathlib import Path

import pytest

from runconfig.reference import render
from runconfig.run import RunConfig

pytestmark = pytest.mark.timeout(120)  # each under 3 s; the CLI test starts one interpreter

ROOT = Path(__file__).resolve().parents[2]
REFERENCE = ROOT / "docs" / "config-reference.md"


def test_config_reference_is_current():
    """Fails after a schema change until `python -m runconfig.reference > docs/config-reference.md` is rerun."""
    assert REFERENCE.read_text(encoding="utf-8") == render(), (
        "docs/config-reference.md is stale: run `python -m runconfig.reference > docs/config-reference.md`"
    )


def _all_keys(model, prefix=""):
    from runconfig.reference import _nested

    for name, field in model.model_fields.items():
        if field.exclude:
            continue
        key = f"{prefix}.{name}" if prefix else name
        yield key
        for suffix, sub in _nested(field.annotation):
            yield from _all_keys(sub, key + suffix)


def test_every_schema_key_is_in_the_reference():
    """Every key the schema accepts, nested sections and list items included, has its own row (a top-level
    section its own heading)."""
    text = render()
    keys = list(_all_keys(RunConfig))
    assert len(keys) > 200 and "data.clean.workers" in keys and "launch.slurm.partition" in keys
    missing = [k for k in keys if f"| `{k}` |" not in text and f"\n## `{k}`\n" not in text]
    assert not missing, f"keys without a row: {missing}"


def test_field_comments_become_descriptions():
    """The text of a key is the comment written at its field in runconfig/ (above it or beside it)."""
    text = render()
    row = next(line for line in text.splitlines() if line.startswith("| `data.task_retries` |"))
    assert "retried this many times" in row
    row = next(line for line in text.splitlines() if line.startswith("| `run.output_dir` |"))
    assert "fsspec URL" in row and '`"runs/run"`' in row


def test_cli_prints_the_reference_without_torch():
    """The generator runs without torch: it imports nothing above runconfig itself; the built-in specs it documents
    come through their entry points, whose modules import no ML framework (and, of adapt, only the adaptation
    methods' spec files that the entry points name; nothing from launch)."""
    code = (
        "import sys, runconfig.reference as r; r.main(); "
        "from core.registry import ADAPT_METHODS; "
        "specs = {'adapt', 'adapt.methods', *(ep.value.split(':')[0] for ep in "
        "__import__('core.registry').registry.group_entry_points(ADAPT_METHODS.group))}; "
        "bad = [m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'transformers', 'deepspeed', 'tokenizers', 'datasets', 'peft', 'launch') "
        "or (m.split('.')[0] == 'adapt' and m not in specs)]; "
        "assert not bad, bad; assert 'adapt.methods.lora' in sys.modules"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout == REFERENCE.read_text(encoding="utf-8")


def test_every_family_and_objective_option_is_documented_with_type_and_default():
    """Each typed `model.options` / `objective.options` key of a registered family or objective has a row (issue
    47, item 2): the generic dict[str, any] row alone told a user nothing."""
    from core.registry import FAMILIES, OBJECTIVES
    from runconfig.reference import _fmt_default, _fmt_type

    text = REFERENCE.read_text(encoding="utf-8")
    for key, registry in (("model.options", FAMILIES), ("objective.options", OBJECTIVES)):
        for name, spec in registry.items():
            if spec.options is None:
                continue
            assert f"## `{key}` of {registry.kind} `{name}`" in text
            for field_name, field in spec.options.model_fields.items():
                row = f"| `{key}.{field_name}` | {_fmt_type(field.annotation).replace('|', chr(92) + '|')} | {_fmt_default(field)} |"
                assert row in text, f"{key}.{field_name} of {name}: no row {row!r}"
