"""Checkpoints that survive being killed at any moment.

DeepSpeed's own `latest` file is written by rank 0 without waiting for the other ranks' ZeRO shards, and its
files are written in place: a kill mid-save can leave `latest` pointing at a half-written folder. So we save with
`save_latest=False`, have every rank write its RNG state, barrier, and only then rank 0 writes `COMPLETE` in the
tag folder and atomically replaces `latest`. Resume only ever considers folders holding `COMPLETE`.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

COMPLETE = "COMPLETE"
TAG_RE = re.compile(r"^step(\d{8})$")
PREEMPTED_EXIT_CODE = 75  # EX_TEMPFAIL: "checkpointed on a signal, requeue me"


def tag_for(step: int) -> str:
    return f"step{step:08d}"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + f".tmp{os.getpid()}")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def complete_tags(ckpt_dir: Path) -> list[str]:
    if not ckpt_dir.is_dir():
        return []
    tags = [p.name for p in ckpt_dir.iterdir() if TAG_RE.match(p.name) and (p / COMPLETE).is_file()]
    return sorted(tags)


def find_resume_tag(ckpt_dir: Path) -> str | None:
    """The `latest` pointer if its folder is complete, else the newest complete folder."""
    latest = ckpt_dir / "latest"
    if latest.is_file():
        tag = latest.read_text().strip()
        if (ckpt_dir / tag / COMPLETE).is_file():
            return tag
    tags = complete_tags(ckpt_dir)
    return tags[-1] if tags else None


def read_complete(ckpt_dir: Path, tag: str) -> dict[str, Any]:
    return json.loads((ckpt_dir / tag / COMPLETE).read_text())


def save_checkpoint(engine, ckpt_dir: Path, step: int, client_state: dict[str, Any], keep_last: int,
                    before_complete=None) -> Path:
    """`before_complete(folder)` runs on every rank after all files are written and before the folder is
    marked complete (the trainer stores its export-parity probe there)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    tag = tag_for(step)
    folder = ckpt_dir / tag
    if rank == 0:
        ckpt_dir.mkdir(parents=True, exist_ok=True)
        if folder.exists():  # a partial save from a killed run at this same step: never mix files
            shutil.rmtree(folder)
    dist.barrier()
    engine.save_checkpoint(str(ckpt_dir), tag=tag, client_state=client_state, save_latest=False)
    rng_path = folder / f"rng_rank{rank:05d}.pt"
    tmp = rng_path.with_suffix(".tmp")
    torch.save(rng_state(), tmp)
    os.replace(tmp, rng_path)
    if before_complete is not None:
        before_complete(folder)
    dist.barrier()  # every rank's files are on disk
    if rank == 0:
        meta = {"step": step, "world_size": world, "time": time.time(), "zero_stage": engine.zero_optimization_stage()}
        _atomic_write(folder / COMPLETE, json.dumps(meta))
        _atomic_write(ckpt_dir / "latest", tag)
        for old in complete_tags(ckpt_dir)[:-keep_last]:
            shutil.rmtree(ckpt_dir / old, ignore_errors=True)
            shutil.rmtree(ckpt_dir / (old + UNIVERSAL_SUFFIX), ignore_errors=True)
    dist.barrier()
    return folder


UNIVERSAL_SUFFIX = "_universal"


def needs_universal(ckpt_dir: Path, tag: str, world_size: int) -> bool:
    """ZeRO shards are laid out per data-parallel rank: another world size must go through DeepSpeed's
    universal checkpoint (parameter-wise fp32 + optimizer fragments)."""
    meta = read_complete(ckpt_dir, tag)
    return meta["world_size"] != world_size and meta.get("zero_stage", 0) > 0


def convert_to_universal(ckpt_dir: Path, tag: str) -> str:
    """Rank 0 only: DeepSpeed's ds_to_universal into `<tag>_universal` (once; reused on later restarts)."""
    import argparse

    from deepspeed.checkpoint import ds_to_universal

    out = ckpt_dir / (tag + UNIVERSAL_SUFFIX)
    if (out / COMPLETE).is_file():
        return out.name
    if out.exists():
        shutil.rmtree(out)
    args = argparse.Namespace(
        input_folder=str(ckpt_dir / tag), output_folder=str(out), num_extract_workers=1, num_merge_workers=1,
        keep_temp_folder=False, strict=True,
        inject_missing_state=True,  # transformers models carry no Megatron-style universal info; DeepSpeed adds it
    )
    ds_to_universal.main(args)
    for f in (ckpt_dir / tag).glob("rng_rank*.pt"):
        shutil.copy2(f, out / f.name)
    shutil.copy2(ckpt_dir / tag / COMPLETE, out / COMPLETE)
    return out.name


def load_checkpoint(engine, ckpt_dir: Path, tag: str) -> dict[str, Any]:
    """Restore engine (weights, optimizer, LR schedule) and this rank's RNG; return the client state."""
    path, client_state = engine.load_checkpoint(
        str(ckpt_dir), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
    )
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {ckpt_dir / tag}")
    rng_path = ckpt_dir / tag / f"rng_rank{dist.get_rank():05d}.pt"
    if rng_path.is_file() and read_complete(ckpt_dir, tag)["world_size"] == dist.get_world_size():
        set_rng_state(torch.load(rng_path, weights_only=False))
    return client_state or {}
