"""Tasks beyond one text (issue 48 item 5): sentence pairs (two text columns) and regression (a float label,
scored by Pearson's r and Spearman's rho), read from every labelled file format, refused with the key and file
named before any work, and fine-tuned end to end through `adapt.finetune` on tiny exports."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer, T5Config

from adapt.arms import Arms
from adapt.finetune import finetune
from adapt.inputs import save_finetuned_tokenizer
from adapt.scoring import collapse, score, spearman
from adapt.transfer import prepare_task
from data_pipeline.labelled import LabelledDataError, load_task
from pretrain.families import family_names
from runconfig import ConfigError
from tests.adapt.test_finetune import TINY, _export, _labelled_rows, _task_cfg

TOPIC_SCORE = {"business": 0.5, "sports": 2.5, "tech": 4.5}  # a float label the text determines


def _pair_rows(per_label: int = 12) -> list[dict[str, str]]:
    """(first half, second half) of BBC articles, with the topic and a topic-determined score."""
    out = []
    for rid, text, topic in _labelled_rows(per_label=per_label, chars=400):
        out.append(
            {"id": rid, "a": text[:200], "b": text[200:], "topic": topic, "score": str(TOPIC_SCORE[topic])}
        )
    return out


def _write_table(
    path: Path, rows: list[dict[str, str]], columns: tuple[str, ...], delimiter: str = ","
) -> str:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh, delimiter=delimiter)
        w.writerow(columns)
        for r in rows:
            w.writerow([r[c] for c in columns])
    return str(path)


def _write_jsonl(path: Path, rows: list[dict[str, str]], columns: tuple[str, ...]) -> str:
    path.write_text("".join(json.dumps({"id": r["id"], **{c: r[c] for c in columns}}) + "\n" for r in rows))
    return str(path)


def _write_hf(path: Path, rows: list[dict[str, str]], columns: tuple[str, ...]) -> str:
    from datasets import Dataset

    Dataset.from_dict({c: [r[c] for r in rows] for c in columns}).save_to_disk(str(path))
    return str(path)


def _layouts(tmp_path: Path, rows, columns: tuple[str, ...]) -> dict[str, str]:
    return {
        "csv": _write_table(tmp_path / "p.csv", rows, columns),
        "tsv": _write_table(tmp_path / "p.tsv", rows, columns, "\t"),
        "jsonl": _write_jsonl(tmp_path / "p.jsonl", rows, columns),
        "hf_dataset": _write_hf(tmp_path / "hf", rows, columns),
    }


@pytest.mark.parametrize("problem", ["classification", "regression"])
def test_pair_tasks_read_the_same_examples_from_every_format(tmp_path, problem):
    rows = _pair_rows()
    label = "topic" if problem == "classification" else "score"
    seen = {}
    for fmt, path in _layouts(tmp_path, rows, ("a", "b", label)).items():
        task = dict(train=path, text_column="a", text_pair_column="b", label_column=label, problem=problem)
        data = load_task(_task_cfg("roberta-tiny", TINY, **task), 0)
        assert data.pair and data.regression == (problem == "regression"), fmt
        assert data.labels == ([] if problem == "regression" else sorted(TOPIC_SCORE)), fmt
        seen[fmt] = sorted((r[1], r[3], r[2]) for r in data.train + data.dev + data.test)
    expected = sorted((r["a"], r["b"], r[label]) for r in rows)
    for fmt, got in seen.items():
        # the HF dataset stores the float label as a string column here, as written; every format gives the same
        assert got == expected, fmt


def test_regression_from_a_numeric_hf_column_and_a_folder_per_value(tmp_path):
    from datasets import Dataset

    rows = _pair_rows(per_label=12)
    Dataset.from_dict({"text": [r["a"] for r in rows], "y": [float(r["score"]) for r in rows]}).save_to_disk(
        str(tmp_path / "hf")
    )
    data = load_task(
        _task_cfg("roberta-tiny", TINY, train=str(tmp_path / "hf"), label_column="y", problem="regression"), 0
    )
    assert sorted({float(r[2]) for r in data.train}) == sorted(TOPIC_SCORE.values())
    for r in rows:  # a folder per label: the folder's name is the number
        f = tmp_path / "folder" / r["score"] / Path(r["id"]).name
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(r["a"])
    data = load_task(_task_cfg("roberta-tiny", TINY, train=str(tmp_path / "folder"), problem="regression"), 0)
    assert data.regression and {float(r[2]) for r in data.test} <= set(TOPIC_SCORE.values())


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl", "hf_dataset"])
def test_a_pair_task_whose_second_column_is_absent_is_refused_naming_key_and_file(tmp_path, fmt):
    path = _layouts(tmp_path, _pair_rows(per_label=4), ("a", "topic"))[fmt]
    cfg = _task_cfg(
        "roberta-tiny", TINY, train=path, text_column="a", text_pair_column="b", label_column="topic"
    )
    with pytest.raises(LabelledDataError) as e:
        load_task(cfg, 0)
    assert "finetune.tasks.0.text_pair_column" in str(e.value) and "'b'" in str(e.value)
    assert Path(path).name in str(e.value)


@pytest.mark.parametrize("fmt", ["csv", "tsv", "jsonl", "hf_dataset"])
def test_a_regression_label_that_is_not_a_number_is_refused_naming_key_row_and_file(tmp_path, fmt):
    rows = _pair_rows(per_label=4)
    rows[5]["score"] = "high"
    path = _layouts(tmp_path, rows, ("a", "score"))[fmt]
    cfg = _task_cfg(
        "roberta-tiny", TINY, train=path, text_column="a", label_column="score", problem="regression"
    )
    with pytest.raises(LabelledDataError) as e:
        load_task(cfg, 0)
    msg = str(e.value)
    assert "finetune.tasks.0.label_column" in msg and "'high'" in msg and Path(path).name in msg


def test_pairs_from_a_source_or_a_folder_and_unknown_problems_are_refused_at_load(tmp_path):
    for task, key in (
        (dict(source="bbc", text_pair_column="b"), "text_pair_column"),
        (dict(train=str(tmp_path), format="folder", text_pair_column="b"), "text_pair_column"),
        (dict(train=str(tmp_path), problem="ranking"), "problem"),
    ):
        with pytest.raises(ConfigError, match=key):
            _task_cfg("roberta-tiny", TINY, **task)


def test_regression_with_a_text_to_text_family_is_refused_before_training(tmp_path):
    T5Config(vocab_size=64, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8).save_pretrained(tmp_path)
    with pytest.raises(ValueError, match="finetune.tasks.problem: regression"):
        Arms(tmp_path, [], 0, regression=True)


def test_regression_scores_are_pearson_and_spearman_and_constant_predictions_collapse():
    gold = np.array([0.0, 1.0, 2.0, 3.0])
    pred = np.array([0.1, 0.9, 2.2, 2.8])
    assert score(pred, gold, regression=True) == pytest.approx(np.corrcoef(pred, gold)[0, 1])
    assert spearman(np.array([0.0, 5.0, 6.0, 7.0]), gold) == pytest.approx(1.0)
    assert score(np.full(4, 1.5), gold, regression=True) == 0.0  # undefined r: no credit
    assert collapse(np.full(4, 1.5), gold, regression=True) == {"constant": 1.5}
    assert collapse(np.array([0.1, 0.9, 2.2, 2.8]), gold, regression=True) is None


SCORE_ALONE = r"""
import json, sys, torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer
assert "adapt" not in sys.modules and "pretrain" not in sys.modules
folder, max_length = sys.argv[1], int(sys.argv[2])
pairs = json.loads(sys.stdin.read())
tok = AutoTokenizer.from_pretrained(folder)
model = AutoModelForSequenceClassification.from_pretrained(folder).eval()
out = []
with torch.no_grad():
    for a, b in pairs:  # one pair at a time, the standard way: tokenizer(a, b), then the model
        logits = model(**tok(a, b, truncation=True, max_length=max_length, return_tensors="pt")).logits[0]
        out.append(float(logits[0]) if model.config.problem_type == "regression" else int(logits.argmax()))
print(json.dumps({"predictions": out, "labels": model.config.id2label}))
"""


def _score_alone(folder: Path, pairs: list[list[str]], max_length: int) -> dict:
    """`folder` scored in a fresh process with plain transformers (no lmstack module importable)."""
    import subprocess
    import sys

    from tests.pretrain.conftest import child_env

    env = {k: v for k, v in child_env().items() if k != "PYTHONPATH"}
    res = subprocess.run(
        [sys.executable, "-c", SCORE_ALONE, str(folder), str(max_length)],
        input=json.dumps(pairs),
        capture_output=True,
        text=True,
        env=env,
        cwd="/",
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.integration  # five tiny exports, two tasks each, and a fresh process per saved model: ~3 min under load
@pytest.mark.timeout(600)
@pytest.mark.parametrize(
    "preset", ["roberta-tiny", "gpt2-tiny", "llama-tiny", "modernbert-tiny", "electra-tiny"]
)
def test_pair_classification_and_regression_fine_tune_end_to_end(tmp_path, preset):
    """A pair task and a regression pair task through `adapt.finetune` (issue 66 item 1): the pair is framed as
    the tokenizer frames it (a separator between the texts even where GPT-2's and Llama's put none), the
    regression head has one output, and each saved folder, scored the standard way in a fresh process with plain
    transformers (`tokenizer(a, b, truncation=True)`, AutoModelForSequenceClassification), predicts what the run
    recorded in result.json, with the label names."""
    rows = _pair_rows(per_label=8)
    export, overrides = _export(tmp_path, preset, [r["a"] + r["b"] for r in rows])
    path = _write_jsonl(tmp_path / "pairs.jsonl", rows, ("a", "b", "topic", "score"))
    tasks = [
        {"name": "nli", "train": path, "text_column": "a", "text_pair_column": "b", "label_column": "topic"},
        {
            "name": "sts",
            "train": path,
            "text_column": "a",
            "text_pair_column": "b",
            "label_column": "score",
            "problem": "regression",
        },
    ]
    from runconfig import load_config

    cfg = load_config(f"configs/{preset}.yaml", [*overrides, f"finetune.tasks={json.dumps(tasks)}"])
    res = {r["task"]: r for r in finetune(cfg, export, "pretrained", tmp_path / "ft", log=lambda *_: None)}
    assert res["nli"]["metric"] == "accuracy" and 0.0 <= res["nli"]["accuracy_by_seed"][0]["test"] <= 1.0
    assert res["sts"]["metric"] == "pearsonr" and -1.0 <= res["sts"]["accuracy_by_seed"][0]["test"] <= 1.0
    for i, name in enumerate(("nli", "sts")):
        folder = tmp_path / "ft" / name / "pretrained" / "seed0"
        record = json.loads((folder / "result.json").read_text())
        data = load_task(cfg, i)
        alone = _score_alone(folder, [[r[1], r[3]] for r in data.test], cfg.finetune.max_length)
        if name == "nli":
            assert alone["predictions"] == record["predictions"]["test"]
            assert alone["labels"] == {str(k): v for k, v in enumerate(data.labels)}
        else:
            assert record["metric"] == "pearsonr" and set(record["spearman"]) == {"dev", "test"}
            assert alone["predictions"] == pytest.approx(record["predictions"]["test"], abs=1e-4)
    model = AutoModelForSequenceClassification.from_pretrained(str(folder))
    assert model.config.num_labels == 1 and model.config.problem_type == "regression"


def test_predict_scores_every_label_of_the_head_even_where_a_split_lacks_the_last_one():
    """A small dev or test split that never shows the highest label index: the logits still have a column per
    label (a smoke-size BBC split found `_predict` sizing its scores from the split's labels)."""
    from transformers import ElectraConfig, ElectraForSequenceClassification

    from adapt.transfer import _predict
    from runconfig.finetune import FinetuneConfig
    from tests.adapt.tiny_text import TINY_ELECTRA, word_examples, word_tokenizer

    tok = word_tokenizer()
    torch.manual_seed(0)
    model = ElectraForSequenceClassification(ElectraConfig(**TINY_ELECTRA, num_labels=5))
    enc = word_examples(tok, 12, np.array([0, 1, 2] * 4))  # labels 3 and 4 absent from this split
    pred = _predict(model, tok, enc, FinetuneConfig(eval_batch_size=4), False, None)
    with torch.no_grad():
        ids = [torch.tensor([f["input_ids"]]) for f in enc.features]
        expected = [int(model(input_ids=i).logits.argmax(-1)) for i in ids]
    assert pred.tolist() == expected
    # regression: one output, the value itself
    model = ElectraForSequenceClassification(
        ElectraConfig(**TINY_ELECTRA, num_labels=1, problem_type="regression")
    )
    values = _predict(model, tok, word_examples(tok, 6, np.linspace(0, 1, 6)), FinetuneConfig(), False, None)
    assert values.dtype == float and values.shape == (6,)


@pytest.mark.parametrize("family", family_names())
def test_the_saved_tokenizer_frames_a_pair_as_training_did(tmp_path, family):
    """Issue 66 item 1: GPT-2 and Llama pair models trained on `a <|endoftext|> b` while the folder's tokenizer gave
    `tokenizer(a, b)` = `a b`, so a model fed the standard way saw other inputs. The tokenizer a fine-tuned folder
    saves, reloaded alone, must give every training feature from `tokenizer(a, b, truncation=True, max_length=L)`:
    the same ids (a separator between the texts) and, where it returns them, the same segment ids (ELECTRA)."""
    rows = _pair_rows(per_label=4)
    export, overrides = _export(tmp_path, f"{family}-tiny", [r["a"] + r["b"] for r in rows])
    path = _write_jsonl(tmp_path / "pairs.jsonl", rows, ("a", "b", "topic"))
    cfg = _task_cfg(
        f"{family}-tiny", overrides, train=path, text_column="a", text_pair_column="b", label_column="topic"
    )
    data = load_task(cfg, 0)
    task = prepare_task(cfg.finetune, data, AutoTokenizer.from_pretrained(str(export)), export)
    save_finetuned_tokenizer(task.tok, tmp_path / "ft", export)
    saved = AutoTokenizer.from_pretrained(str(tmp_path / "ft"))
    a = saved("hello world", add_special_tokens=False)["input_ids"]
    b = saved("good morning", add_special_tokens=False)["input_ids"]
    assert _between(saved("hello world", "good morning")["input_ids"], a, b), "nothing between the two texts"
    for split in ("train", "test"):
        rows_ = getattr(data, split)
        enc = saved([r[1] for r in rows_], [r[3] for r in rows_], truncation=True, max_length=task.max_len)
        feats = task.enc[split].features
        assert [f["input_ids"] for f in feats] == enc["input_ids"], split
        if "token_type_ids" in enc:
            assert [f.get("token_type_ids", [0] * len(f["input_ids"])) for f in feats] == enc[
                "token_type_ids"
            ]


def _between(ids: list[int], a: list[int], b: list[int]) -> list[int]:
    """The tokens between the first text and the second in a framed pair (what tells the model where `a` ends)."""
    for i in range(len(ids) - len(a) + 1):
        if ids[i : i + len(a)] == a:
            for j in range(i + len(a), len(ids) - len(b) + 1):
                if ids[j : j + len(b)] == b:
                    return ids[i + len(a) : j]
    raise AssertionError(f"{a} then {b} not in {ids}")


def test_a_pair_task_on_a_tokenizer_that_cannot_separate_the_texts_is_refused_before_training(tmp_path):
    """A tokenizer with no sep or eos token (and a pair template that puts nothing between the texts) would
    concatenate a pair's texts: refused with the key and the folder named, before any model is trained."""
    from core.errors import ConfigError
    from tests.adapt.tiny_text import word_tokenizer
    from tests.hf_folder import gpt2_folder

    folder = gpt2_folder(tmp_path / "model", tokenizer=False, head="GPT2ForSequenceClassification")
    word_tokenizer().save_pretrained(folder)
    path = _write_jsonl(tmp_path / "pairs.jsonl", _pair_rows(per_label=4), ("a", "b", "topic"))
    cfg = _task_cfg(
        "gpt2-tiny", TINY, train=path, text_column="a", text_pair_column="b", label_column="topic"
    )
    with pytest.raises(ConfigError, match="finetune.tasks.text_pair_column") as e:
        finetune(cfg, folder, "pretrained", tmp_path / "ft", log=lambda *_: None)
    assert str(folder) in str(e.value) and "\n" not in str(e.value)
    assert not (tmp_path / "ft").exists()
