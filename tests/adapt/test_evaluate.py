"""`python -m adapt evaluate` and `python -m data_pipeline eval-tasks`: the harness's own HFLM and task system
on local tasks written from a fine-tune task's held-out splits; the same numbers from a plain `lm_eval` process;
every refusal one line, before any model loads."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from tests.hf_folder import TEXTS, gpt2_folder

pytest.importorskip("lm_eval")
pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOT = Path(__file__).resolve().parents[2]
LABELS = ["business", "sport", "politics", "film"]


def _config(tmp_path: Path):
    from runconfig import load_config

    rows = [
        {"text": t + f" Story {i} goes on for a while with more words here.", "label": LABELS[i % 4]}
        for i, t in enumerate(TEXTS[:40])
    ]
    data = tmp_path / "task.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return load_config(
        ROOT / "configs" / "gpt2-tiny.yaml",
        [f"run.output_dir={tmp_path}/run", f"finetune.tasks=[{{name: news, train: {data}}}]"],
    )


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """The tasks written and the export scored once per worker (every test reads the results; none depends on
    another test having run first)."""
    from adapt.evaluate import evaluate
    from data_pipeline.eval_tasks import write_eval_tasks

    tmp = tmp_path_factory.mktemp("evaluate")
    cfg = _config(tmp)
    report = write_eval_tasks(cfg)
    model = gpt2_folder(Path(cfg.run.root) / "export", positions=128)
    results = evaluate(model, ["lmstack"], limit=6, batch_size=4, device="cpu")  # the tag: all three
    return cfg, report, model, results


def test_the_local_tasks_are_written_from_the_held_out_splits(made):
    cfg, report, _, _ = made
    assert sorted(report["tasks"]) == ["lmstack_news_choice", "lmstack_news_cloze", "lmstack_news_ppl"]
    folder = Path(report["folder"])
    assert folder == Path(cfg.run.root) / "eval_tasks"
    test = [json.loads(x) for x in (folder / "lmstack_news_choice.test.jsonl").read_text().splitlines()]
    assert test and all(r["choices"] == sorted(LABELS) or set(r["choices"]) == set(LABELS) for r in test)
    cloze = [json.loads(x) for x in (folder / "lmstack_news_cloze.test.jsonl").read_text().splitlines()]
    assert all(r["target"].startswith(" ") and r["target"].strip().isalpha() for r in cloze)
    assert report["tasks"]["lmstack_news_choice"]["test"] == len(test)


def test_evaluate_runs_the_harness_and_writes_beside_the_export(made):
    from adapt.evaluate import RESULTS_JSON, RESULTS_TABLE

    _, _, model, res = made
    r = res["results"]
    assert {"lmstack_news_choice", "lmstack_news_cloze", "lmstack_news_ppl"} <= set(r)
    assert 0.0 <= r["lmstack_news_choice"]["acc,none"] <= 1.0
    assert math.isfinite(r["lmstack_news_ppl"]["word_perplexity,none"])
    saved = json.loads((model / RESULTS_JSON).read_text())
    assert (
        saved["results"]["lmstack_news_cloze"]["perplexity,none"]
        == r["lmstack_news_cloze"]["perplexity,none"]
    )
    assert "lmstack_news_choice" in (model / RESULTS_TABLE).read_text()


def test_a_plain_lm_eval_process_gives_the_same_numbers(made, tmp_path):
    """The folder and the YAMLs are all it takes: lm_eval's own CLI, in a process that imports no lmstack."""
    _, report, model, _ = made
    ours = json.loads((model / "lm_eval_results.json").read_text())["results"]
    cmd = [
        sys.executable,
        "-m",
        "lm_eval",
        "--model",
        "hf",
        "--model_args",
        f"pretrained={model},dtype=float32",
        "--tasks",
        "lmstack",
        "--include_path",
        report["folder"],
        "--limit",
        "6",
        "--batch_size",
        "4",
        "--device",
        "cpu",
        "--output_path",
        str(tmp_path / "out"),
    ]
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HOME": str(tmp_path)}
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert res.returncode == 0, res.stderr[-3000:]
    (out,) = list((tmp_path / "out").rglob("results_*.json"))
    theirs = json.loads(out.read_text())["results"]
    for task in ("lmstack_news_choice", "lmstack_news_cloze", "lmstack_news_ppl"):
        for k, v in ours[task].items():
            if isinstance(v, float) and "stderr" not in k:
                assert theirs[task][k] == pytest.approx(v, rel=1e-6), (task, k)


@pytest.mark.compat
@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_a_side_venv_with_only_lm_eval_and_transformers_reproduces_them(made, tmp_path):
    """The same, from a venv that holds lm-eval, transformers and torch and no lmstack at all (built once from
    PyPI and cached, as the export-compatibility venvs are): the export folder and the task YAMLs are the whole
    hand-over."""
    import transformers

    from launch.side_venv import ensure_venv

    _, report, model, _ = made
    python = ensure_venv(
        ROOT / ".venv-compat-lmeval",
        ["torch==2.13.0", "lm-eval[hf]==0.4.13", f"transformers=={transformers.__version__}"],
        probe="import lm_eval, transformers",
    )
    env = {"PATH": "/usr/bin:/bin", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "HOME": str(tmp_path)}
    alone = subprocess.run(
        [str(python), "-c", "import runconfig"], cwd=tmp_path, env=env, capture_output=True
    )
    assert alone.returncode != 0, "the side venv sees lmstack"
    ours = json.loads((model / "lm_eval_results.json").read_text())["results"]
    out = tmp_path / "out"
    cmd = [str(python), "-m", "lm_eval", "--model", "hf", "--model_args", f"pretrained={model},dtype=float32"]
    cmd += ["--tasks", "lmstack", "--include_path", report["folder"], "--limit", "6", "--batch_size", "4"]
    cmd += ["--device", "cpu", "--output_path", str(out)]
    res = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    (found,) = list(out.rglob("results_*.json"))
    theirs = json.loads(found.read_text())["results"]
    for task in ("lmstack_news_choice", "lmstack_news_cloze", "lmstack_news_ppl"):
        for k, v in ours[task].items():
            if isinstance(v, float) and "stderr" not in k:
                assert theirs[task][k] == pytest.approx(v, rel=1e-6), (task, k)


def _refusal(args: list[str]) -> str:
    res = subprocess.run(
        [sys.executable, "-m", "adapt", "evaluate", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert res.returncode == 2, res.stderr[-2000:]
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    return lines[0]


def test_bad_input_is_refused_before_any_model_loads(made, tmp_path):
    _, report, model, _ = made
    enc = tmp_path / "enc"
    enc.mkdir()
    (enc / "config.json").write_text(
        json.dumps({"model_type": "roberta", "architectures": ["RobertaForMaskedLM"]})
    )
    assert "not a causal LM" in _refusal(["--model", str(enc), "--tasks", "lmstack"])
    line = _refusal(["--model", str(model), "--tasks", "lmstack_news_chioce"])
    assert "unknown task 'lmstack_news_chioce'" in line and "did you mean 'lmstack_news_choice'" in line
    assert "lmstack_news_ppl" in line  # the local tasks are listed
    line = _refusal(["--model", str(model), "--tasks", "lmstack_news_choice", "--num-fewshot", "500"])
    assert "--num-fewshot 500" in line and "few-shot examples" in line
    moved = tmp_path / "moved"
    moved.mkdir()
    for f in Path(report["folder"]).glob("*.yaml"):
        (moved / f.name).write_text(f.read_text().replace(report["folder"], str(tmp_path / "gone")))
    line = _refusal(["--model", str(model), "--tasks", "lmstack_news_cloze", "--tasks-dir", str(moved)])
    assert "does not exist" in line and "eval-tasks" in line


def test_the_card_takes_the_results_for_these_weights_only(made, tmp_path):
    """`pretrain card` reads lm_eval_results.json into model-index entries and a table, only while the weights
    it scored are the folder's."""
    import shutil

    from huggingface_hub import ModelCardData

    from pretrain.export.card_lm_eval import bound_lm_eval, lm_eval_card

    _, _, made_model, _ = made
    model = tmp_path / "export"  # a copy: the stale-results case below must not touch the shared folder
    shutil.copytree(made_model, model)
    results = bound_lm_eval(model)
    assert results is not None
    entries, lines = lm_eval_card(results)
    names = {(e.task_name, e.metric_type) for e in entries}
    assert ("lmstack_news_choice", "acc") in names and ("lmstack_news_ppl", "bits_per_byte") in names
    assert all(e.source_name.startswith("lm-evaluation-harness ") for e in entries)
    text = ModelCardData(model_name="m", eval_results=entries).to_yaml()
    assert "model-index" in text and "lmstack_news_cloze" in text and "0-shot" in text
    assert any("| lmstack_news_choice |" in ln for ln in lines) and "6 examples per task" in "\n".join(lines)
    saved = json.loads((model / "lm_eval_results.json").read_text())
    saved["lmstack"]["weights_sha256"] = "0" * 64  # results of other weights: stale
    (model / "lm_eval_results.json").write_text(json.dumps(saved))
    assert bound_lm_eval(model) is None
