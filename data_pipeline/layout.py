"""Where each stage reads and writes inside a run folder: core/layout.py's map, plus the run's store.

`root` is always a local folder: `run.output_dir` itself, or, when that is a URL, the local staging folder
(`run.local_dir`) that `store` mirrors to it (data_pipeline/storage.py)."""

from __future__ import annotations

from core.layout import RunPaths
from data_pipeline.storage import RunStore
from runconfig import RunConfig


class RunLayout(RunPaths):
    def __init__(self, cfg: RunConfig):
        super().__init__(cfg.run.root, cfg.checkpoint.dir)
        self.store = RunStore.from_config(cfg)
