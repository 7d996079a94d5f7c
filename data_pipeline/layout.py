"""Where each stage reads and writes inside a run folder: the one map every stage agrees on.

`root` is always a local folder: `run.output_dir` itself, or, when that is a URL, the local staging folder
(`run.local_dir`) that `store` mirrors to it (data_pipeline/storage.py)."""

from __future__ import annotations

from pathlib import Path

from data_pipeline.storage import RunStore
from runconfig import RunConfig


class RunLayout:
    def __init__(self, cfg: RunConfig):
        self.root = Path(cfg.run.root)
        self.store = RunStore.from_config(cfg)

    @property
    def clean(self) -> Path:  # clean/<source>/shard-XXXXX.jsonl.zst, stats.json, stats.txt, dropped/
        return self.root / "clean"

    @property
    def dedup(self) -> Path:  # dedup/<source>/shard-XXXXX.jsonl.zst, dedup_stats.json
        return self.root / "dedup"

    @property
    def tokenizer(self) -> Path:  # an HF tokenizer folder (AutoTokenizer.from_pretrained)
        return self.root / "tokenizer"

    @property
    def tokens(self) -> Path:  # tokens/<source>/shard-XXXXX.{bin,idx.npz}, tokens/manifest.json
        return self.root / "tokens"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def logs(self) -> Path:  # tensorboard events + metrics.jsonl
        return self.root / "logs"

    @property
    def export(self) -> Path:
        return self.root / "export"

    @property
    def finetune(self) -> Path:
        return self.root / "finetune"
