"""The run folder: the only place its folder and file names are spelled.

Every stage reads and writes under `root` (`run.output_dir`, or the local staging folder of a remote one):
clean/ -> dedup/ -> tokenizer/ + tokens/ -> checkpoints/ (or `checkpoint.dir`) -> export/ -> finetune/ (and eval_tasks/), with
logs/ (TensorBoard events, metrics.jsonl, plots/) beside them and summary.json at the end. `RunPaths` computes
them from the root and the configured checkpoint folder; core/run_layout.py's `RunLayout` adds the remote store.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

CLEAN = "clean"  # clean/<source>/shard-XXXXX.jsonl.zst, stats.json, stats.txt, dropped/
DEDUP = "dedup"  # dedup/<source>/shard-XXXXX.jsonl.zst, dedup_stats.json
TOKENIZER = "tokenizer"  # an HF tokenizer folder (AutoTokenizer.from_pretrained)
TOKENS = "tokens"  # tokens/<source>/shard-XXXXX.{bin,idx.npz}, tokens/manifest.json
CHECKPOINTS = "checkpoints"  # checkpoints/stepNNNNNNNN/ (default of checkpoint.dir)
CHECKPOINT_TAG = re.compile(r"^step(\d{8})$")  # a checkpoint folder's name; the group is its step
COMPLETE = "COMPLETE"  # written last into a checkpoint or an export folder: it is whole
LOGS = "logs"  # TensorBoard events + metrics.jsonl
PLOTS = "plots"  # logs/plots/*.png
HANG = "hang"  # logs/hang/: per-rank stack dumps and report.txt of a hang (pretrain/run/watchdog.py)
METRICS = "metrics.jsonl"
EXPORT = "export"
FINETUNE = "finetune"
EVAL_TASKS = "eval_tasks"  # <task>.yaml + its .jsonl files: lm-evaluation-harness tasks of held-out text
TASKS = "_tasks"  # completion markers of data tasks
SLURM = "slurm"  # rendered sbatch scripts and their logs (default of launch.slurm.output_dir)
SUMMARY = "summary.json"
RESOLVED_CONFIG = "resolved_config.yaml"
CLEAN_STATS = "stats.json"  # clean/stats.json: the cleaning report (kept, dropped by reason)
TOKEN_MANIFEST = "manifest.json"  # tokens/manifest.json: every shard, its size and sha256 (written last)
DEDUP_STATS = "dedup_stats.json"


class RunPaths:
    """Where each stage of one run reads and writes. `checkpoint_dir`: the configured `checkpoint.dir` (None:
    <root>/checkpoints)."""

    def __init__(self, root: str | os.PathLike[str], checkpoint_dir: str | os.PathLike[str] | None = None):
        self.root = Path(root)
        self._checkpoint_dir = checkpoint_dir

    @classmethod
    def from_config(cls, cfg: Any) -> RunPaths:
        return cls(cfg.run.root, cfg.checkpoint.dir)

    @property
    def clean(self) -> Path:
        return self.root / CLEAN

    @property
    def dedup(self) -> Path:
        return self.root / DEDUP

    @property
    def tokenizer(self) -> Path:
        return self.root / TOKENIZER

    @property
    def tokens(self) -> Path:
        return self.root / TOKENS

    @property
    def checkpoints(self) -> Path:
        """Where training saves checkpoints: `checkpoint.dir` when set, else <root>/checkpoints."""
        return Path(self._checkpoint_dir) if self._checkpoint_dir else self.root / CHECKPOINTS

    @property
    def logs(self) -> Path:
        return self.root / LOGS

    @property
    def metrics(self) -> Path:
        return self.logs / METRICS

    @property
    def plots(self) -> Path:
        return self.logs / PLOTS

    @property
    def hang(self) -> Path:
        return self.logs / HANG

    @property
    def export(self) -> Path:
        return self.root / EXPORT

    @property
    def finetune(self) -> Path:
        return self.root / FINETUNE

    @property
    def eval_tasks(self) -> Path:
        return self.root / EVAL_TASKS

    @property
    def tasks(self) -> Path:
        return self.root / TASKS

    @property
    def slurm(self) -> Path:
        return self.root / SLURM

    @property
    def summary(self) -> Path:
        return self.root / SUMMARY

    @property
    def resolved_config(self) -> Path:
        return self.root / RESOLVED_CONFIG


def remote_checkpoints(output_dir: str) -> str:
    """The checkpoints folder of a remote run (`run.output_dir` a URL)."""
    return f"{output_dir.rstrip('/')}/{CHECKPOINTS}"
