"""Issue 64 item 10 (adapt and the CLIs): a missing --model is one line naming the folder, never a hub lookup; null
class labels are a counted, named skip and equal numbers one class; an empty dev split names its ways out;
`key=value` overrides may stand anywhere on the command line."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from core.exit_codes import USAGE
from data_pipeline.labelled import LabelledDataError, load_task
from tests.adapt.test_finetune import TINY, _labelled_rows, _task_cfg, _write_csv


def _task_argv(tmp_path: Path) -> list[str]:
    rows = _labelled_rows(per_label=12, chars=100)
    train = _write_csv(tmp_path / "train.csv", rows)
    return [
        "--config",
        "configs/demo.yaml",
        f"run.output_dir={tmp_path}/run",
        f"finetune.tasks=[{{name: t, train: {train}}}]",
    ]


@pytest.mark.parametrize("command", ["finetune", "transfer", "continue"])
def test_a_missing_model_folder_is_one_line_naming_it_and_no_hub_lookup(tmp_path, capsys, command):
    """`adapt finetune --model <missing>` raised transformers' 'Repo id must be in the form' traceback and
    `--model gpt2` tried the hub for 53 s; transfer and continue raised a raw FileNotFoundError."""
    from adapt.__main__ import main

    argv = _task_argv(tmp_path)
    for model in (str(tmp_path / "no-such-export"), "gpt2"):
        capsys.readouterr()
        t0 = time.monotonic()
        code = main([command, *argv, "--model", model])
        err = capsys.readouterr().err.strip()
        assert code == USAGE and len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert f"{model}: no model here (no config.json" in err and "downloads nothing" in err, err
        assert time.monotonic() - t0 < 30  # no hub lookup (53 s before); generous for a loaded machine


def _jsonl(path: Path, rows: list[tuple[str, object]]) -> Path:
    texts = [r[1] for r in _labelled_rows(per_label=8, chars=100)]
    path.write_text(
        "".join(
            json.dumps({"id": f"r{i}", "text": texts[i % len(texts)], "label": y}) + "\n"
            for i, (_, y) in enumerate(rows)
        )
    )
    return path


def test_null_labels_are_a_named_skip_and_equal_numbers_one_class(tmp_path, capsys):
    """A null class label became a class named 'None', and labels 1 and 1.0 became two classes."""
    rows = [("", 1), ("", 1.0), ("", 2), ("", 2.0)] * 10 + [("", None), ("", None), ("", "")]
    train = _jsonl(tmp_path / "train.jsonl", rows)
    capsys.readouterr()
    data = load_task(_task_cfg("roberta-tiny", TINY, train=str(train)), 0)
    err = capsys.readouterr().err
    assert data.labels == ["1", "2"]
    assert {r[2] for r in data.train + data.dev + data.test} <= {"1", "2"}
    assert (
        f"finetune.tasks.0.train: skipped 3 row(s) of {train} with a null or empty label: r40, r41, r42"
        in err
    )


def test_an_empty_dev_split_names_the_ways_out(tmp_path):
    rows = [(f"a{i}", f"text number {i}", "x" if i % 2 else "y") for i in range(4)]
    train = _write_csv(tmp_path / "train.csv", rows)
    cfg = _task_cfg("roberta-tiny", TINY, train=str(train), dev_fraction=0.01)
    with pytest.raises(LabelledDataError) as e:
        load_task(cfg, 0)
    msg = str(e.value)
    assert msg.startswith("finetune.tasks.0: the dev split is empty"), msg
    for way in ("finetune.tasks.0.dev", "finetune.tasks.0.dev_fraction (0.01", "more training examples"):
        assert way in msg, msg


@pytest.mark.parametrize("package", ["adapt", "pretrain"])
def test_overrides_are_accepted_anywhere_on_the_command_line(tmp_path, package):
    """`adapt` and `pretrain` refused overrides placed before an option ('unrecognized arguments: k=v')."""
    import argparse

    from runconfig.cli import Command, dispatch

    seen: list[argparse.Namespace] = []

    def run(args: argparse.Namespace) -> int:
        seen.append(args)
        return 0

    def arguments(p: argparse.ArgumentParser) -> None:
        p.add_argument("--model", default=None)

    commands = (Command("x", "a command", run, arguments),)
    argv = ["x", "a=1", "--config", "c.yaml", "b.c=2", "--model", "m", "d=3", "e=[1, 2]"]
    assert dispatch(f"python -m {package}", None, commands, argv) == 0
    (args,) = seen
    assert (
        args.overrides == ["a=1", "b.c=2", "d=3", "e=[1, 2]"]
        and args.model == "m"
        and args.config == "c.yaml"
    )
    with pytest.raises(SystemExit):  # anything else unknown is still refused
        dispatch(f"python -m {package}", None, commands, ["x", "--config", "c.yaml", "--modle", "m"])
