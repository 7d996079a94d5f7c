"""ULMFiT's second stage (Howard & Ruder 2018; "Don't Stop Pretraining", Gururangan et al. 2020): continue the
export on the task's own unlabelled training text, then fine-tune it with the transfer protocol, and report that
arm beside the export without it.

The text is the training split of each task as `data_pipeline/labelled.py` makes it: the dev and test examples
are removed by the same salted id hash the transfer stage uses, so the continued model never reads an example it
is scored on (`task_text` refuses any overlap). The continued run is an ordinary lmstack run (`model.init_from`:
the export) in `<run.output_dir>/continued`, through the stages' own commands, one process each.
"""

from __future__ import annotations

import copy
import hashlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from adapt.report import RESULT_FILE, write_report
from adapt.statistics import welch_p
from core.errors import LmstackError
from core.io import atomic_write, json_bytes
from core.log import get_logger
from core.process import dies_with_this_process
from core.registry import ADAPT_METHODS
from data_pipeline.labelled import TaskData, load_tasks
from pretrain.export.folder import verify_export, weights_hash
from runconfig import RunConfig
from runconfig.finetune import primary_method
from runconfig.load import save_resolved, to_dict, validate_dict

log = get_logger(__name__)

SOURCE = "task-train-text"


def _task_text(tasks: list[TaskData]) -> tuple[bytes, dict[str, Any]]:
    """Every task's training texts as JSONL (id, text), never a dev or test example's; and what they are."""
    held = {r[0] for t in tasks for rows in (t.dev, t.test) for r in rows}
    # a pair task's example is both its texts, one document
    rows = [(f"{t.name}/{r[0]}", "\n".join(x for x in (r[1], *r[3:]) if x)) for t in tasks for r in t.train]
    leaked = sorted({r[0] for r in rows if r[0].split("/", 1)[1] in held})
    if leaked:  # the splits are disjoint by construction; a reader returning one id twice would break that
        raise ValueError(f"task text: {len(leaked)} training ids are also dev/test ids, e.g. {leaked[:3]}")
    data = "".join(json.dumps({"id": i, "text": text}) + "\n" for i, text in rows).encode()
    return data, {"documents": len(rows), "excluded_dev_test": len(held)}


def task_text(tasks: list[TaskData], path: Path) -> dict[str, Any]:
    """Every task's training texts as one JSONL data source (id, text), never a dev or test example's."""
    data, info = _task_text(tasks)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, data)
    return {"file": str(path), **info}


def continued_config(cfg: RunConfig, export: Path, text_file: Path, steps: int | None) -> RunConfig:
    """The run that continues `export` on the task text alone: its own folder, no labelled task of its own."""
    data = to_dict(cfg)
    data["run"] = {
        **data["run"],
        "name": f"{cfg.run.name}-continued",
        "output_dir": str(Path(cfg.run.root) / "continued"),
        "local_dir": None,
    }
    data["data"]["sources"] = [
        {"name": SOURCE, "format": "jsonl", "paths": [str(text_file)], "clean_preset": "curated"}
    ]
    # the run's model settings (dropout, attention, ...: what the family validates); the export's config.json
    # replaces the architecture keys at load (runconfig/init_from.py), so they need not agree with the run's
    data["model"] = {**data["model"], "init_from": str(export)}
    data["tokenizer"] = {"pretrained_path": None}
    data["finetune"] = {**copy.deepcopy(data["finetune"]), "tasks": []}
    data["checkpoint"] = {**data["checkpoint"], "dir": None}
    if steps is not None:
        data["schedule"] = {
            **data["schedule"],
            "total_steps": steps,
            "budget_minutes": None,
            "warmup_steps": max(1, steps // 10),
            "warmup_fraction": None,  # a *-budget recipe's warmup is a share of its clock, which this run has not
        }
    return validate_dict(data, "continued pretraining")


class ContinuedStageError(LmstackError):
    """A stage of the continued run exited non-zero: said in one line with the command and its code (its own
    output is above), and the CLI exits with that code; a rerun resumes from what the stages kept."""

    def __init__(self, args: list[str], code: int):
        super().__init__(
            f"continued pretraining: `python {' '.join(args)}` exited with {code} (its output is above); rerun "
            "`python -m adapt continue` to resume: finished stages and checkpoints are kept"
        )
        self.exit_code = code if code > 0 else 1


class ContinuedRunMismatchError(LmstackError):
    """The run's continued/ folder holds a continued run of another export or other task text: resuming it
    would mix two runs' state (its checkpoints continued other weights on other text)."""


SOURCE_FILE = "source.json"  # what <run>/continued continues: the export's weights and the task text


def _run(args: list[str]) -> None:
    log.info(f"[continue] python {' '.join(args)}")
    # a SIGKILLed `adapt continue` leaves no stage behind it holding the continued run (the trainer gets SIGTERM:
    # it checkpoints and exits), so a rerun resumes instead of meeting the run lock
    code = subprocess.run([sys.executable, *args], preexec_fn=dies_with_this_process()).returncode
    if code != 0:
        raise ContinuedStageError(args, code)


def _claim(root: Path, source: dict[str, Any]) -> None:
    """Records what `root` continues, refusing a folder that continues something else (one line, the way out)."""
    marker = root / SOURCE_FILE
    if marker.is_file():
        before = json.loads(marker.read_text())
        differs = sorted(k for k in source.keys() | before.keys() if source.get(k) != before.get(k))
        if differs:
            raise ContinuedRunMismatchError(
                f"{root} holds a continued run of another {' and '.join(differs)} ({marker}): resuming it would mix "
                f"the two; move that folder away (or remove it) to continue {source['export']}"
            )
    root.mkdir(parents=True, exist_ok=True)
    atomic_write(marker, json_bytes(source))


def continue_pretraining(cfg: RunConfig, export: Path, steps: int | None = None) -> Path:
    """Writes the task text, runs the continued run's stages, training and export; returns its export. Rerun
    after a kill, it resumes: the same text, the stages' own restart (finished shards kept, training from its
    last checkpoint), the export replaced whole."""
    verify_export(export)
    tasks = load_tasks(cfg)
    root = Path(cfg.run.root) / "continued"
    data, info = _task_text(tasks)
    _claim(
        root,
        {
            "export": str(export),
            "weights_sha256": weights_hash(export),
            "task_text_sha256": hashlib.sha256(data).hexdigest(),
        },
    )
    text = task_text(tasks, root / "task_text" / "train.jsonl")
    log.info(
        f"[continue] {text['documents']} training texts ({text['excluded_dev_test']} dev/test ids excluded)"
    )
    run_cfg = continued_config(cfg, export, Path(text["file"]), steps)
    path = save_resolved(run_cfg, root, "continue.yaml")
    _run(["-m", "data_pipeline", "all", "--config", str(path)])
    _run(["-m", "pretrain", "train", "--config", str(path)])
    _run(["-m", "pretrain", "export", "--config", str(path)])
    atomic_write(root / "export" / "task_text.json", json_bytes(text))
    return root / "export"


def continued_arm(cfg: RunConfig, export: Path, continued: Path, out: Path, base: dict[str, Any]) -> dict:
    """The continued export fine-tuned with the transfer protocol (pretrained arm, full fine-tune, same seeds
    and LR grid), set beside the export's own arms in `base` (the export's transfer report) per task."""
    from adapt.transfer import evaluate_task

    arm_cfg = _baseline_cfg(cfg)
    report = copy.deepcopy(base)
    for t in load_tasks(cfg):
        entry = evaluate_task(arm_cfg, t, continued, out / "continued" / t.name)["arms"]["pretrained"]
        task = report["tasks"][t.name]
        arm: dict[str, Any] = {
            "export": str(continued),
            "weights_sha256": weights_hash(continued),
            "arm": entry,
        }
        got, without = entry["test_accuracy"], task["arms"]["pretrained"]["test_accuracy"]
        if got["mean"] is not None and without["mean"] is not None:  # over the export without it
            arm["margin"] = got["mean"] - without["mean"]
            arm["p_value"] = welch_p(got["values"], without["values"])
        task["continued"] = arm
    write_report(report, [out])
    return report


# finetune.* keys only other arms and methods read: they do not change the pretrained arm's full fine-tune, the
# one the continued arm is set beside
OTHER_ARMS_ONLY = ("arms", "methods", "probe")
UNRECORDED = "protocol (not recorded in transfer.json)"


def _arm_protocol(protocol: dict[str, Any]) -> dict[str, Any]:
    # and every adaptation method's own settings (finetune.<method>, recorded in old reports for every method)
    return {k: v for k, v in protocol.items() if k not in OTHER_ARMS_ONLY and k not in ADAPT_METHODS}


def _baseline_cfg(cfg: RunConfig) -> RunConfig:
    """The protocol's pretrained arm alone, full fine-tune, no probe: what the continued arm itself runs."""
    ft = cfg.finetune.model_copy(
        update={"arms": ["pretrained"], "methods": [primary_method()], "probe": False}
    )
    return cfg.model_copy(update={"finetune": ft})


def transfer_baseline(cfg: RunConfig, export: Path, out: Path) -> dict[str, Any]:
    """The export's report the continued arm is set beside. transfer.json is reused when it measured these
    weights under this protocol (the settings that decide the pretrained arm's result); a protocol that differs
    reruns the baseline arm with the current settings into `out` (the export's transfer.json, which its card
    publishes, stays as measured) and `baseline` names the keys. No transfer.json, or one of other weights:
    the whole transfer protocol runs, as `adapt transfer` would."""
    from adapt.transfer import run_transfer, transfer_protocol

    known = export / RESULT_FILE
    base = json.loads(known.read_text()) if known.is_file() else None
    if base is None or base.get("weights_sha256") != weights_hash(export):
        return {**run_transfer(cfg, export, out), "baseline": {"source": str(known)}}
    now = _arm_protocol(transfer_protocol(cfg.finetune))
    if "protocol" not in base:
        differs = [UNRECORDED]
    else:
        then = _arm_protocol(base["protocol"])
        differs = [f"finetune.{k}" for k in sorted(now.keys() | then.keys()) if now.get(k) != then.get(k)]
    if not differs:
        return {**base, "baseline": {"source": str(known)}}
    log.warning(
        f"[continue] {known} was measured under another protocol ({', '.join(differs)} differ): the baseline "
        "arm is rerun under this one, so the continued arm is compared with a baseline measured alike"
    )
    base = run_transfer(_baseline_cfg(cfg), export, out / "baseline", publish=False)
    return {**base, "baseline": {"source": "rerun", "differs": differs}}


def run_continue(cfg: RunConfig, export: Path, out: Path, steps: int | None = None) -> dict[str, Any]:
    """Continue, then fine-tune; set beside the export's own transfer report under the same protocol
    (`transfer_baseline`)."""
    verify_export(export)
    # the continued run's config, validated before any fine-tune: a family that cannot be continued is refused
    # now, not after the baseline's fine-tunes
    continued_config(cfg, export, Path(cfg.run.root) / "continued" / "task_text" / "train.jsonl", steps)
    base = transfer_baseline(cfg, export, out)
    continued = continue_pretraining(cfg, export, steps)
    return continued_arm(cfg, export, continued, out, base)
