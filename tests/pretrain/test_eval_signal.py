"""The transfer signal in the loop (issue 44 item 1, issue 68 item 3), end to end on 2 DeepSpeed CPU ranks: a GPT-2
trained on two sources (the WARC sample crawl and BBC News) logs, at every eval, the held-out loss of each source
beside the mixed one, a linear probe on the BBC task and the BBC task's lm-evaluation-harness tasks (eval.tasks) for
the current weights and, once at the start, for random init. Checked against a recomputation from the final
checkpoint (the harness on the export for the tasks), in TensorBoard's event files, in the plots, across a resume,
and against a run without the probe and the tasks (neither may move the training RNG: GPT-2 trains with dropout
here)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from pretrain.run.probe_eval import PROBE_MAX_EXAMPLES
from tests.pretrain.conftest import ROOT, run_module, torchrun

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed, pytest.mark.timeout(1800)]

# configs/gpt2-tiny.yaml keeps the demo's two sources (crawl, bbc with a labelled hold-out)
RUN_YAML = """\
inherit: [{root}/configs/gpt2-tiny.yaml]
run: {{name: it-evalsig, output_dir: {out}}}
data: {{clean: {{docs_per_shard: 400, workers: 2}}}}
tokenizer: {{vocab_size: 1500}}
packing: {{seq_len: 64}}
model: {{hidden_size: 64, num_layers: 2, num_heads: 2, ffn_size: 128}}
batch: {{global_batch_size: 8, micro_batch_size: 2}}
optim: {{lr: 1.0e-3}}
schedule: {{total_steps: 8, warmup_steps: 2}}
checkpoint: {{every_steps: 4, keep_last: 3}}
eval: {{every_steps: 4, max_batches: 3, probe_task: bbc, tasks: [lmstack], tasks_limit: 8}}
loader: {{num_workers: 1, eval_fraction: 0.1}}
logging: {{every_steps: 1, progress_bar: false, peak_flops: 1.0e+11, plots: true}}
finetune: {{source: bbc, max_length: 64, eval_batch_size: 32}}
"""


@pytest.fixture(scope="module")
def two_source_run(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("evalsig")
    cfg = root / "run.yaml"
    cfg.write_text(RUN_YAML.format(root=ROOT, out=root / "run"))
    run_module(["-m", "data_pipeline", "all", "--config", str(cfg)], timeout=600)
    return cfg


def _fresh(config: Path, folder: Path) -> str:
    """Its own run folder, sharing the prepared data."""
    out = folder / "run"
    out.mkdir(parents=True)
    for name in ("clean", "dedup", "tokenizer", "tokens"):
        (out / name).symlink_to((config.parent / "run" / name).resolve())
    return f"run.output_dir={out}"


def _rows(run: Path, split: str) -> dict[int, dict]:
    rows = [json.loads(x) for x in (run / "logs" / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r for r in rows if r["split"] == split}


def _recomputed(cfg, ckpt_dir: Path, tag: str) -> dict[str, tuple[float, int]]:
    """Each source's held-out loss of the checkpointed weights, on the batches every rank evaluates, outside
    DeepSpeed: (sample-weighted loss, samples)."""
    from transformers import AutoTokenizer

    from core.run_layout import RunLayout
    from data_pipeline.loader import PretrainLoader
    from data_pipeline.objectives import build_collator
    from pretrain.export.convert import load_trained_model

    tok = AutoTokenizer.from_pretrained(str(RunLayout(cfg).tokenizer))
    model = load_trained_model(cfg, ckpt_dir, tag, tok)
    out = {}
    loaders = [PretrainLoader(cfg, r, 2, split="eval", collate_fn=build_collator(cfg, tok)) for r in range(2)]
    for name in loaders[0].source_names:
        total, n = 0.0, 0
        with torch.no_grad():
            for ld in loaders:
                for w, batch in ld.iter_source(name, cfg.eval.max_batches):
                    if w:
                        total += float(model(**batch).loss) * w
                        n += w
        out[name] = (total / max(n, 1), n)
    return out


def _tensorboard_tags(logs: Path) -> dict[str, list[float]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logs))
    acc.Reload()
    return {tag: [e.value for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


@pytest.fixture(scope="module")
def runs(two_source_run, tmp_path_factory) -> dict[str, Path]:
    """The run with the probe and the tasks (8 steps, then resumed to 12 with `resumed` a copy of its rows at 8),
    and the same run without them; every test reads these, none depends on another having run."""
    from runconfig import load_config

    tmp = tmp_path_factory.mktemp("signal")
    overrides = [_fresh(two_source_run, tmp / "probe")]
    torchrun(two_source_run, overrides, timeout=600)
    run = Path(load_config(two_source_run, overrides).run.root)
    at_8 = tmp / "metrics_at_8.jsonl"
    at_8.write_text((run / "logs" / "metrics.jsonl").read_text())
    plain = [_fresh(two_source_run, tmp / "plain"), "eval.probe_task=null", "eval.tasks=[]"]
    torchrun(two_source_run, plain, timeout=600)
    torchrun(two_source_run, [*overrides, "schedule.total_steps=12"], timeout=600)
    return {
        "run": run,
        "at_8": at_8,
        "plain": Path(load_config(two_source_run, plain).run.root),
        "overrides": overrides,  # type: ignore[dict-item]
    }


def _rows_of(path: Path, split: str) -> dict[int, dict]:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    return {r["step"]: r for r in rows if r["split"] == split}


def test_per_source_loss_and_probe_in_the_loop(two_source_run, runs):
    from runconfig import load_config

    cfg = load_config(two_source_run, runs["overrides"])
    run = runs["run"]
    ev = _rows_of(runs["at_8"], "eval")
    assert sorted(ev) == [0, 4, 8]

    # the random-init probe, once, before the first step; then the current weights at each eval
    start = ev[0]
    assert start["probe/task"] == "bbc" and 0.0 <= start["probe/accuracy"] <= 1.0
    assert start["probe/random_init_accuracy"] == start["probe/accuracy"]
    for step in (4, 8):
        row = ev[step]
        assert 0.0 <= row["probe/accuracy"] <= 1.0 and 0.0 <= row["probe/train_accuracy"] <= 1.0
        assert row["probe/random_init_accuracy"] == start["probe/accuracy"]
        cap = PROBE_MAX_EXAMPLES
        assert 0 < row["probe/train_examples"] <= cap and 0 < row["probe/dev_examples"] <= cap
        assert 0 < row["probe/majority_accuracy"] < 1

    # per source: present, and what the checkpointed weights give on the same batches outside DeepSpeed
    want = _recomputed(cfg, Path(cfg.checkpoint_dir), "step00000008")
    assert set(want) == {"crawl", "bbc"} and all(n > 0 for _, n in want.values()), want
    for name, (loss, _) in want.items():
        assert ev[8][f"loss/{name}"] == pytest.approx(loss, rel=1e-4), name
        assert ev[8][f"perplexity/{name}"] == pytest.approx(math.exp(loss), rel=1e-3), name
    mixed = sum(loss * n for loss, n in want.values()) / sum(n for _, n in want.values())
    assert ev[8]["loss"] == pytest.approx(mixed, rel=1e-4)
    assert ev[8]["loss/crawl"] != pytest.approx(ev[8]["loss/bbc"], rel=1e-3)  # two figures, not one copied

    tags = _tensorboard_tags(run / "logs")
    for tag in ("eval/probe/accuracy", "eval/probe/random_init_accuracy", "eval/loss/bbc", "eval/loss/crawl"):
        assert tag in tags, sorted(tags)
    assert tags["eval/probe/accuracy"][:3] == pytest.approx([ev[s]["probe/accuracy"] for s in (0, 4, 8)])
    assert {"probe.png", "loss_by_source.png"} <= {p.name for p in (run / "logs" / "plots").iterdir()}

    # the probe and the tasks leave the training RNG alone: the same run without them trains the same losses
    losses = {s: r["loss"] for s, r in _rows_of(runs["at_8"], "train").items()}
    assert losses == {s: r["loss"] for s, r in _rows(runs["plain"], "train").items()}
    assert all("probe/accuracy" not in r for r in _rows(runs["plain"], "eval").values())

    # a resume takes the random-init figure from the checkpoint: nothing measured again at its start
    after = _rows(run, "eval")
    assert sorted(after) == [0, 4, 8, 12] and after[0] == start
    assert after[12]["probe/random_init_accuracy"] == start["probe/accuracy"]


TASKS = ("lmstack_bbc_choice", "lmstack_bbc_cloze", "lmstack_bbc_ppl")


def test_harness_tasks_in_the_loop_equal_the_harness_on_the_export(two_source_run, runs):
    """eval.tasks: each task's figures at every eval, the random-init ones measured once and carried across the
    resume, in TensorBoard and the plots; the last step's equal to `adapt evaluate` on the export (within 1e-3)."""
    from adapt.evaluate import evaluate
    from pretrain.run.harness import figures

    run = runs["run"]
    ev = _rows(run, "eval")
    start = ev[0]
    metrics = {"choice": ("acc", "acc_norm"), "cloze": ("acc", "perplexity"), "ppl": ("word_perplexity",)}
    for task in TASKS:
        for m in metrics[task.rsplit("_", 1)[1]]:
            key = f"tasks/{task}/{m}"
            assert start[key] == start[f"{key}_random_init"], key
            assert all(key in ev[s] and ev[s][f"{key}_random_init"] == start[key] for s in (4, 8, 12)), key
    assert all(0 < ev[s]["tasks/seconds"] < 60 for s in (0, 4, 8, 12))
    # trained for 12 steps, the perplexities have moved down from random init
    assert ev[12]["tasks/lmstack_bbc_ppl/word_perplexity"] < start["tasks/lmstack_bbc_ppl/word_perplexity"]
    assert "eval/tasks/lmstack_bbc_cloze/acc" in _tensorboard_tags(run / "logs")
    assert "tasks.png" in {p.name for p in (run / "logs" / "plots").iterdir()}
    assert all(not k.startswith("tasks/") for r in _rows(runs["plain"], "eval").values() for k in r)

    run_module(["-m", "pretrain", "export", "--config", str(two_source_run), *runs["overrides"]], timeout=600)
    export = figures(evaluate(run / "export", list(TASKS), limit=8, batch_size=8, device="cpu"))
    for task, row in export.items():
        for m, value in row.items():
            assert ev[12][f"tasks/{task}/{m}"] == pytest.approx(value, rel=1e-3, abs=1e-3), (task, m)


def test_a_task_file_gone_stops_every_rank_in_one_line(two_source_run, tmp_path):
    """Hostile input at run time: the tasks' folder is there but a data file is not. Rank 0 finds it before the
    first step and every rank stops with its name, instead of the others waiting for rank 0 at the first eval."""
    from runconfig import load_config

    overrides = [_fresh(two_source_run, tmp_path), "schedule.total_steps=4"]
    run_module(["-m", "data_pipeline", "eval-tasks", "--config", str(two_source_run), *overrides])
    gone = (
        Path(load_config(two_source_run, overrides).run.root) / "eval_tasks" / "lmstack_bbc_cloze.test.jsonl"
    )
    gone.unlink()
    res = torchrun(two_source_run, overrides, timeout=300, check=False)
    said = res.stdout + res.stderr
    assert (
        res.returncode != 0
        and f"[train] CannotContinueError: eval.tasks: (rank 0) {gone.with_suffix('').with_suffix('.yaml')}"
        in said
    )
    # the ranks exit with CANNOT_CONTINUE and no traceback of their own (`launch run` turns the plain torchrun's
    # ChildFailedError here into one line with that code: tests/launch)
    assert "exitcode: 65" in said and "[rank0]: Traceback" not in said and "[rank1]: Traceback" not in said
    assert not list((gone.parents[1] / "checkpoints").glob("step*")), "it trained before refusing"
