"""Where each stage reads and writes inside a run folder: core/layout.py's map, plus the run's store (every floor
above data_pipeline uses it, so it lives on the ground floor).

`root` is always a local folder: `run.output_dir` itself, or, when that is a URL, the local staging folder
(`run.local_dir`) that `store` mirrors to it (core/storage.py)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from core.layout import RunPaths
from core.storage import RunStore

if TYPE_CHECKING:  # the type only: core imports nothing above it at run time
    from runconfig import RunConfig


class RunLayout(RunPaths):
    def __init__(self, cfg: RunConfig):
        super().__init__(cfg.run.root, cfg.checkpoint.dir)
        self.store = RunStore.from_config(cfg)
