"""lm-evaluation-harness tasks made from the run's own evaluation text: `python -m data_pipeline eval-tasks`.

For every fine-tune task (`finetune.tasks`) the stage writes, into `<run>/eval_tasks/`, the harness's own YAML
task files and the JSONL files they read, so that `lm_eval --include_path <run>/eval_tasks` (or
`python -m adapt evaluate`) runs them unchanged and offline:

- `lmstack_<task>_choice`: zero-shot (or few-shot) multiple choice over the task's labels, each label verbalised
  as its own name after the head of the text ("<text>\\nTopic: business"; at most half the run's sequence length
  in words, so the model reads the start), scored by acc and acc_norm;
- `lmstack_<task>_cloze`: a LAMBADA-style last-word cloze: the passage's last word given the words before it,
  scored by acc (the greedy continuation is the word) and perplexity;
- `lmstack_<task>_ppl`: rolling log-likelihood of each text (word and byte perplexity, bits per byte).

The text is the task's test split, and its dev split is the few-shot pool: the same rows, split by the same id
hash, that `adapt transfer` scores and that decontamination (`data.decontaminate.tasks`) keeps out of the
pretraining corpus. A task from a source's hold-out (`finetune.tasks[].source`) is therefore text pretraining
never saw. Every file is tagged `lmstack`, so `--tasks lmstack` runs them all. A pair or regression task gets
the cloze and the perplexity of its first text, not the choice (its labels are not words to choose).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml

from core.io import atomic_write
from core.log import get_logger
from core.run_layout import RunLayout
from runconfig.finetune import HARNESS_TAG, harness_task_base, harness_task_names

log = get_logger(__name__)

TAG = HARNESS_TAG
CLOZE_MIN_WORDS = 8  # a passage shorter than this gives the cloze too little to go on
CLOZE_MAX_WORDS = 64  # LAMBADA's passages are about 4-5 sentences
# The head of a long text, for the choice: its topic shows early (a news article's first sentence), and a context
# longer than the model's window is cut from the LEFT by the harness, which would drop exactly that. So at most
# half the run's sequence length in words (about two thirds of it in tokens, the question and label after it).
CHOICE_MAX_WORDS = 200
_WORD = re.compile(r"^([A-Za-z]+)[.,;:!?\"')\]]*$")


def cloze_item(text: str) -> dict[str, str] | None:
    """{context, target}: the passage (the text's first CLOZE_MAX_WORDS words) up to its last plain word, and
    that word with its leading space (as LAMBADA's harness task scores it); None for a text too short."""
    words = text.split()[:CLOZE_MAX_WORDS]
    for k in range(len(words) - 1, CLOZE_MIN_WORDS - 2, -1):
        m = _WORD.match(words[k])
        if m:
            return {"context": " ".join(words[:k]), "target": " " + m.group(1)}
    return None


def _head(text: str, n: int) -> str:
    words = text.split()
    return text if len(words) <= n else " ".join(words[:n])


def _task_yaml(name: str, files: dict[str, Path], body: dict[str, Any], version: int = 1) -> dict[str, Any]:
    """The harness's task config: local JSON files through `datasets`' json builder (nothing downloaded)."""
    splits = {"test_split": "test"} | ({"fewshot_split": "dev"} if "dev" in files else {})
    return {
        "task": name,
        "tag": [TAG],
        "dataset_path": "json",
        "dataset_kwargs": {"data_files": {k: str(v) for k, v in files.items()}},
        **splits,
        **body,
        "metadata": {"version": version},
    }


CHOICE = {
    "output_type": "multiple_choice",
    "doc_to_text": "{{text}}\n{{question}}:",
    "doc_to_choice": "choices",  # the column: the harness reads a list from it
    "doc_to_target": "label",
    "metric_list": [
        {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
        {"metric": "acc_norm", "aggregation": "mean", "higher_is_better": True},
    ],
}
CLOZE = {
    "output_type": "loglikelihood",
    "doc_to_text": "{{context}}",
    "doc_to_target": "{{target}}",
    "target_delimiter": "",
    "metric_list": [
        {"metric": "perplexity", "aggregation": "perplexity", "higher_is_better": False},
        {"metric": "acc", "aggregation": "mean", "higher_is_better": True},
    ],
}
PPL = {
    "output_type": "loglikelihood_rolling",
    "doc_to_text": "",
    "doc_to_target": "{{text}}",
    "metric_list": [
        {"metric": m, "aggregation": a, "higher_is_better": False}
        for m, a in (
            ("word_perplexity", "weighted_perplexity"),
            ("byte_perplexity", "weighted_perplexity"),
            ("bits_per_byte", "bits_per_byte"),
        )
    ],
}


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    atomic_write(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))


def _one_task(folder: Path, name: str, splits: dict[str, list[dict[str, Any]]], body: dict[str, Any]) -> int:
    files = {}
    for split, rows in splits.items():
        if rows:
            files[split] = folder / f"{name}.{split}.jsonl"
            _write_jsonl(files[split], rows)
    atomic_write(folder / f"{name}.yaml", yaml.safe_dump(_task_yaml(name, files, body), sort_keys=False))
    return len(splits.get("test", []))


def _choice_rows(data, split: str, question: str, words: int) -> list[dict[str, Any]]:
    return [
        {
            "text": _head(row[1], words),
            "question": question,
            "choices": data.labels,
            "label": data.labels.index(row[2]),
        }
        for row in getattr(data, split)
    ]


def write_eval_tasks(cfg) -> dict[str, Any]:
    """Writes every fine-tune task's harness tasks into the run's eval_tasks/ folder; returns the report."""
    from data_pipeline.labelled import load_task

    folder = RunLayout(cfg).eval_tasks
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, Any] = {"folder": str(folder), "tasks": {}, "skipped": {}}
    if not cfg.finetune.tasks:
        out["skipped"]["finetune.tasks"] = "no fine-tune task configured: nothing to build the tasks from"
    for i, task in enumerate(cfg.finetune.tasks):
        data = load_task(cfg, i)
        origin = f"finetune.tasks.{i} ({task.name}): {data.origin}"
        names = {kind: name for name, kind in harness_task_names(task).items()}
        texts = {s: [row[1] for row in getattr(data, s)] for s in ("dev", "test")}
        cloze = {s: [c for c in map(cloze_item, t) if c] for s, t in texts.items()}
        made = {
            names["cloze"]: (cloze, CLOZE),
            names["ppl"]: ({"test": [{"text": t} for t in texts["test"]]}, PPL),
        }
        if "choice" not in names:
            out["skipped"][f"{harness_task_base(task)}_choice"] = (
                "a pair or regression task: its labels are not words to choose"
            )
        else:
            question = "Topic" if task.source else "Label"
            words = min(CHOICE_MAX_WORDS, max(16, cfg.packing.seq_len // 2))
            rows = {s: _choice_rows(data, s, question, words) for s in ("dev", "test")}
            made[names["choice"]] = (rows, CHOICE)
        for name, (splits, body) in made.items():
            n = _one_task(folder, name, splits, body)
            out["tasks"][name] = {"test": n, "fewshot_pool": len(splits.get("dev", [])), "from": origin}
    atomic_write(folder / "tasks.json", json.dumps(out, indent=1) + "\n")
    log.info(f"[eval-tasks] {len(out['tasks'])} harness tasks in {folder}")
    return out
