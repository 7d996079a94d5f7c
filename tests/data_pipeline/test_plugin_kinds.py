"""Every data extension kind as ONE outside file: a reader that declares its traits (it splits large files at line
boundaries, so the planner cuts one file into several tasks without knowing the format's name), a filter that
brings its own typed settings (validated before any work, errors naming the key), and an executor from the
`lmstack.executors` entry point group that runs the dedup stage's tasks. All run through `python -m
data_pipeline`, the way a user runs them; the built-in filters' settings are typed by their specs and validated at
load, and no format name is compared outside the reader modules."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from runconfig import load_config

ROOT = Path(__file__).resolve().parents[2]

PLUGIN = '''
"""One outside file: a reader, a filter and an executor for lmstack."""
from pydantic import BaseModel, ConfigDict, Field

from core.document import Document, stable_id
from data_pipeline.executors.base import Executor, run_task_guarded
from data_pipeline.readers.base import ReaderTraits
from data_pipeline.readers.ranges import open_span, split_lines


def read_lines(source, shard, src, errors, max_doc_bytes):
    """`.lines` files: one document per non-empty line; reads only its piece when the planner split the file."""
    with (open_span(src) if src.span else open(src.path, "rb")) as fh:
        pos = fh.tell()
        for line in iter(fh.readline, b""):
            if line.strip():
                yield Document(id=stable_id(source.name, src.rel, pos), text=line.decode().strip(),
                               source=source.name, meta={"file": src.path, "offset": pos})
            pos = fh.tell()


read_lines.traits = ReaderTraits(split=split_lines)  # record = line: any large file may be cut at a newline


class DigitSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")
    max_digits: int = Field(ge=0)


class MaxDigits:
    """Drops a document with more than `max_digits` digits."""

    settings = DigitSettings

    def __init__(self, max_digits: int):
        self.max_digits = max_digits

    def __call__(self, doc):
        n = sum(c.isdigit() for c in doc.text)
        return (False, "digits:too_many", n) if n > self.max_digits else (True, None)


class InlineExecutor(Executor):
    """Runs every task in this process, one after another, and signs the task markers."""

    @classmethod
    def from_config(cls, cfg):
        return cls(cfg.data.task_retries, progress=False)

    def _run(self, stage, todo, progress):
        errors = {}
        for i in todo:
            _, _, err = run_task_guarded(stage, i, where="inline-executor")
            if err:
                errors[i] = err
            else:
                progress.update()
        return errors
'''

LINES = [f"Line {i:02d} of the notes, about the weather and the harvest in the valley." for i in range(40)]
LINES[7] = "Call 555 0100 or 555 0199 before 2024-05-01 for the offer."


def _install(root: Path) -> Path:
    """The one file on a path of its own, plus a dist-info naming the executor in its entry point group."""
    site = root / "site"
    site.mkdir(parents=True)
    (site / "ext_plugin.py").write_text(PLUGIN)
    info = site / "ext_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: ext-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[lmstack.executors]\ninline = ext_plugin:InlineExecutor\n")
    return site


def _config(root: Path, params: dict) -> Path:
    data = root / "notes"
    data.mkdir(exist_ok=True)
    (data / "all.lines").write_text("\n".join(LINES) + "\n")  # one file of ~3 KB
    cfg = root / "run.yaml"
    cfg.write_text(
        json.dumps(
            {
                "inherit": [str(ROOT / "configs/roberta-tiny.yaml")],
                "run": {"output_dir": str(root / "out")},
                "data": {
                    "sources": [
                        {"name": "notes", "format": "ext_plugin:read_lines", "paths": [str(data / "*.lines")]}
                    ],
                    "max_task_bytes": 1000,
                    "executor": "inline",
                    "clean": {
                        "workers": 1,
                        "progress": False,
                        "filters": [{"name": "ext_plugin:MaxDigits", "params": params}],
                    },
                },
            }
        )
    )
    return cfg


def _cli(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": f"{ROOT}:{site}", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "data_pipeline", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.timeout(300)
def test_outside_reader_filter_and_executor_through_the_cli(tmp_path):
    site = _install(tmp_path)
    cfg = _config(tmp_path, {"max_digits": 5})
    res = _cli(site, "clean", "--config", str(cfg))
    assert res.returncode == 0, res.stderr[-3000:]
    stats = json.loads((tmp_path / "out/clean/stats.json").read_text())
    # The reader's split trait cut the one 3 KB file into ~1 KB tasks; every line was read exactly once.
    shards = sorted((tmp_path / "out/clean/notes").glob("shard-*.done"))
    assert len(shards) >= 3, [p.name for p in shards]
    assert stats["per_source"]["notes"]["read"] == 40
    assert stats["dropped_by_reason"] == {"digits:too_many": 1} and stats["per_source"]["notes"]["kept"] == 39
    assert stats["source_settings"]["notes"]["filters"][0]["settings"] == {"max_digits": 5}

    res = _cli(site, "dedup", "--config", str(cfg))  # the executor the entry point names runs dedup's tasks
    assert res.returncode == 0, res.stderr[-3000:]
    markers = [json.loads(p.read_text()) for p in (tmp_path / "out").rglob("*.done") if "dedup" in str(p)]
    # executor task markers (dedup's output shards have their own)
    tasks = [m for m in markers if "task" in m]
    assert len(tasks) >= 3 and {m["where"] for m in tasks} == {"inline-executor"}, tasks


@pytest.mark.timeout(120)
def test_outside_filter_settings_are_checked_before_any_work(tmp_path):
    site = _install(tmp_path)
    cfg = _config(tmp_path, {"max_digit": 5})
    res = _cli(site, "clean", "--config", str(cfg))
    assert res.returncode != 0
    assert "data.clean.filters.0.params.max_digit" in res.stderr and "Traceback" not in res.stderr, (
        res.stderr[-2000:]
    )
    assert not (tmp_path / "out/clean/notes").exists()  # refused before a shard ran


@pytest.mark.timeout(60)
def test_builtin_filter_params_are_typed_by_the_spec_at_load():
    base = ROOT / "configs" / "roberta-tiny.yaml"
    with pytest.raises(Exception, match=r"data.clean.filters.0.params: min_sentences: Extra inputs"):
        load_config(base, ["data.clean.filters=[{name: c4, params: {min_sentences: 3}}]"])
    with pytest.raises(Exception, match=r"data.clean.filters.1.params: threshold: Input should be less than"):
        load_config(base, ["data.clean.filters=[unicode, {name: langid, params: {threshold: 2}}]"])
    cfg = load_config(base, ["data.clean.filters=[{name: c4, params: {min_num_sentences: 3}}]"])
    assert cfg.data.clean.filters[0].params == {"min_num_sentences": 3}
    # The sections of the built-ins keep their YAML keys; their type is derived from the step's constructor.
    from runconfig.filters import step_settings

    assert (
        type(cfg.data.clean.c4) is step_settings("c4") and cfg.data.clean.section("c4") is cfg.data.clean.c4
    )


@pytest.mark.timeout(60)
def test_no_format_name_is_compared_outside_the_reader_modules():
    """The planner (readers/__init__.py, ranges.py), preflight and the stages ask a reader's traits."""
    pattern = re.compile(r"""(format|fmt) ?(==|!=|in|not in) ?\(?["']""")
    hits = [
        f"{p.relative_to(ROOT)}:{n}"
        for p in (ROOT / "data_pipeline").rglob("*.py")
        for n, line in enumerate(p.read_text().splitlines(), 1)
        if pattern.search(line)
    ]
    assert hits == []


@pytest.mark.timeout(60)
def test_executor_may_be_named_by_reference_as_every_other_kind():
    base = ROOT / "configs" / "roberta-tiny.yaml"
    cfg = load_config(base, ["data.executor=my_executors:Inline"])  # validated by form, not imported at load
    assert cfg.data.executor == "my_executors:Inline"
    with pytest.raises(Exception, match=r"data.executor: unknown executor 'lcoal'"):
        load_config(base, ["data.executor=lcoal"])


CONVENTION = '''
"""One outside file: a tokenizer convention (ChatML-style specials, no BOS/EOS wrapping), for byte-level BPE."""
from data_pipeline.tokenizers import Convention

CHATML = Convention(["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                    dict(bos_token="<|endoftext|>", eos_token="<|im_end|>", unk_token="<|endoftext|>",
                         pad_token="<|endoftext|>", additional_special_tokens=["<|im_start|>", "<|im_end|>"]),
                    "PreTrainedTokenizerFast", padding_side="left",
                    added_tokens=("<|endoftext|>", "<|im_start|>", "<|im_end|>"))
'''


@pytest.mark.timeout(300)
def test_outside_tokenizer_convention_through_the_tokenizer_stage(tmp_path):
    from transformers import AutoTokenizer

    from tests.data_pipeline.tokens_fixtures import bbc_config

    site = tmp_path / "site"
    site.mkdir()
    (site / "my_conventions.py").write_text(CONVENTION)
    overrides = ["tokenizer.vocab_size=600", "tokenizer.convention=my_conventions:CHATML"]
    cfg = bbc_config(tmp_path / "run", "gpt2-tiny", overrides, limit=150)  # writes the cleaned shards
    run_yaml = tmp_path / "run.yaml"
    run_yaml.write_text(
        json.dumps(
            {
                "inherit": [str(ROOT / "configs/gpt2-tiny.yaml")],
                "run": {"output_dir": str(tmp_path / "run")},
                "data": {"sources": [s.model_dump(mode="json") for s in cfg.data.sources]},
                "tokenizer": {"vocab_size": 600, "convention": "my_conventions:CHATML"},
            }
        )
    )
    res = _cli(site, "train-tokenizer", "--config", str(run_yaml))
    assert res.returncode == 0, res.stderr[-3000:]
    folder = tmp_path / "run" / "tokenizer"
    meta = json.loads((folder / "training_meta.json").read_text())
    assert meta["convention"] == "my_conventions:CHATML"
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [0, 1, 2]
    assert tok.eos_token == "<|im_end|>" and tok.padding_side == "left"
    text = "<|im_start|>user The BBC said shares rose.<|im_end|>"
    ids = tok(text)["input_ids"]  # specials stay whole and no wrapping is added
    assert ids[0] == 1 and ids[-1] == 2 and tok.decode(ids) == text

    with pytest.raises(Exception, match=r"tokenizer.convention: unknown tokenizer convention 'chatml'"):
        load_config(ROOT / "configs/gpt2-tiny.yaml", ["tokenizer.convention=chatml"])
