"""Plug-ins as one file and one YAML line (`module.path:Name`, no packaging), and reruns that never reuse
stale output: the clean stage's fingerprint covers the code of the reader and filters it runs and the
project-local modules they import, so editing a custom reader or a helper a filter imports redoes the shards.
`filters: {defaults: true, extra: [...]}` extends the built-ins; a plain list that leaves them out says so."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from runconfig import load_config
from runconfig.filters import builtin_steps

ROOT = Path(__file__).resolve().parents[2]

READER = '''
"""`.lines` files: one document per non-empty line."""
from core.document import Document, stable_id


def read_lines(source, shard, src, errors, max_doc_bytes):
    with open(src.path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if line.strip():
                yield Document(id=stable_id(source.name, src.rel, i), text=line.strip(), source=source.name,
                               meta={"file": src.path, "offset": i})
'''

FILTER = """
from digit_rules import too_many_digits


class DropDigits:
    def __call__(self, doc):
        return (False, "digits:too_many") if too_many_digits(doc.text) else (True, None)
"""

HELPER = """
def too_many_digits(text):
    return sum(c.isdigit() for c in text) > 100
"""

LINES = ["Sales rose 12% in 2024.", "The committee met on Tuesday.", "Call 555 0100 now.", "Prices fell."]


def _project(tmp: Path, filters) -> Path:
    proj = tmp / "proj"
    proj.mkdir(exist_ok=True)
    (proj / "my_readers.py").write_text(READER)
    (proj / "my_filters.py").write_text(FILTER)
    (proj / "digit_rules.py").write_text(HELPER)
    data = tmp / "notes"
    data.mkdir(exist_ok=True)
    for i in range(2):
        (data / f"part{i}.lines").write_text("\n".join(LINES) + "\n")
    cfg = tmp / "run.yaml"
    cfg.write_text(
        json.dumps(
            {
                "inherit": [str(ROOT / "configs/roberta-tiny.yaml")],
                "run": {"output_dir": str(tmp / "out")},
                "data": {
                    "sources": [
                        {"name": "notes", "format": "my_readers:read_lines", "paths": [str(data / "*.lines")]}
                    ],
                    "clean": {"workers": 2, "progress": False, "filters": filters},
                },
            }
        )
    )
    return cfg


def _clean(tmp: Path, cfg: Path) -> tuple[subprocess.CompletedProcess, dict]:
    env = {"PYTHONPATH": f"{ROOT}:{tmp / 'proj'}", "PATH": "/usr/bin:/bin"}
    res = subprocess.run(
        [sys.executable, "-m", "data_pipeline", "clean", "--config", str(cfg)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return res, json.loads((tmp / "out/clean/stats.json").read_text())


def test_editing_a_reader_or_a_filters_helper_redoes_the_shards(tmp_path):
    cfg = _project(tmp_path, ["my_filters:DropDigits"])
    first, stats = _clean(tmp_path, cfg)
    assert stats["per_source"]["notes"]["kept"] == 8
    # A plain list replaces the built-in filters: the log says so, naming the form that extends them.
    assert "data.clean.filters replaces the built-in filters" in first.stderr
    assert "{defaults: true, extra: [...]}" in first.stderr

    # The helper the filter imports changes: every document now has "too many" digits.
    helper = tmp_path / "proj" / "digit_rules.py"
    helper.write_text(HELPER.replace("> 100", ">= 0"))
    second, stats = _clean(tmp_path, cfg)
    assert "redoing 2 finished shard(s) of notes: filter code changed: my_filters:DropDigits" in second.stderr
    assert stats["per_source"]["notes"]["kept"] == 0

    # The custom reader changes: one document per file now.
    reader = tmp_path / "proj" / "my_readers.py"
    reader.write_text(READER.replace("if line.strip():", "if line.strip() and i == 0:"))
    helper.write_text(HELPER)
    third, stats = _clean(tmp_path, cfg)
    assert "reader code changed: my_readers:read_lines" in third.stderr
    assert stats["per_source"]["notes"]["read"] == 2 and stats["per_source"]["notes"]["kept"] == 2

    # Nothing changed: nothing redone.
    fourth, _ = _clean(tmp_path, cfg)
    assert "redoing" not in fourth.stderr


def test_filters_can_extend_the_defaults():
    base = ROOT / "configs" / "roberta-tiny.yaml"
    cfg = load_config(base, ["data.clean.filters={defaults: true, extra: [my_filters:DropDigits]}"])
    assert [f.name for f in cfg.data.clean.filters] == [*builtin_steps(), "my_filters:DropDigits"]
    cfg = load_config(base, ["data.clean.filters={defaults: false, extra: [c4]}"])
    assert [f.name for f in cfg.data.clean.filters] == ["c4"]
    with pytest.raises(Exception, match="data.clean.filters"):
        load_config(base, ["data.clean.filters={defaults: true, more: [c4]}"])


LAZY_FILTER = """
class DropDigits:
    def __call__(self, doc):
        from digit_rules import too_many_digits  # imported where it is used, as docs/extending.md advises

        return (False, "digits:too_many") if too_many_digits(doc.text) else (True, None)
"""


def test_a_helper_imported_inside_the_filter_function_is_fingerprinted(tmp_path):
    """Issue 43 friction 1: the helper is not in the filter module's globals, so the import walk cannot see
    it; the fingerprint covers every module in the plug-in's own folder instead."""
    cfg = _project(tmp_path, {"defaults": False, "extra": ["my_filters:DropDigits"]})
    (tmp_path / "proj" / "my_filters.py").write_text(LAZY_FILTER)
    first, stats = _clean(tmp_path, cfg)
    assert stats["per_source"]["notes"]["kept"] == 8
    assert "not covered" not in first.stderr
    (tmp_path / "proj" / "digit_rules.py").write_text(HELPER.replace("> 100", ">= 0"))
    second, stats = _clean(tmp_path, cfg)
    assert "redoing 2 finished shard(s) of notes: filter code changed: my_filters:DropDigits" in second.stderr
    assert stats["per_source"]["notes"]["kept"] == 0


def _doc_filters_example() -> str:
    """The `filters:` list of docs/data.md's example, as a user copies it (its `shouting` filter, registered by
    the package the example goes on to show, as a `module:Name` reference instead)."""
    text = (ROOT / "docs" / "data.md").read_text()
    start = text.index("filters: [")
    line = " ".join(text[start : text.index("]\n", start) + 1].split())
    return line.removeprefix("filters: ").replace("name: shouting", "name: my_pkg:ShoutingFilter")


def test_a_filters_list_that_drops_some_built_ins_names_them():
    """Issue 43 friction 2: the note fired only when every built-in was left out; docs/data.md's example left
    out langid and both Gopher filters without a word."""
    from data_pipeline.filters.registry import replaced_defaults_note

    base = ROOT / "configs" / "roberta-tiny.yaml"
    some = load_config(base, ["data.clean.filters=[unicode, c4, my_filters:DropDigits]"]).data.clean
    note = replaced_defaults_note(some)
    assert note is not None and "data.clean.filters leaves out the built-in filters " in note
    named = note.split("leaves out the built-in filters ")[1].split(":")[0].split(", ")
    on = [b for b in builtin_steps() if getattr(some, b).enabled]  # fineweb is off by default
    assert named == [b for b in on if b not in ("unicode", "c4")] and "langid" in named, note
    assert "{defaults: true, extra: [...]}" in note
    every = load_config(base, [f"data.clean.filters=[{', '.join(on)}, my_filters:DropDigits]"])
    assert replaced_defaults_note(every.data.clean) is None
    # the guide's own example keeps every built-in that runs by default
    doc = load_config(base, [f"data.clean.filters={_doc_filters_example()}"]).data.clean
    assert {f.name for f in doc.filters} >= set(on), _doc_filters_example()
    assert replaced_defaults_note(doc) is None
