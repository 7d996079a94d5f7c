"""Resuming at another world size: DeepSpeed's universal checkpoint, converted once from a ZeRO checkpoint."""

from __future__ import annotations

import shutil
from pathlib import Path

from pretrain.checkpoint.meta import COMPLETE, read_complete
from pretrain.checkpoint.safe_load import check_folder
from pretrain.checkpoint.verify import checkpoint_files, verify_files, write_complete
from pretrain.checkpoint.writer import file_entries

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
    if (out / COMPLETE).is_file() and not verify_files(out):
        return out.name
    if out.exists():
        shutil.rmtree(out)
    check_folder(ckpt_dir / tag)  # ds_to_universal unpickles every shard with weights_only=False
    args = argparse.Namespace(
        input_folder=str(ckpt_dir / tag),
        output_folder=str(out),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,  # transformers models carry no Megatron-style universal info; DeepSpeed adds it
    )
    ds_to_universal.main(args)
    for f in (ckpt_dir / tag).glob("rng_rank*.pt"):
        shutil.copy2(f, out / f.name)
    meta = {k: v for k, v in read_complete(ckpt_dir, tag).items() if k not in ("files", "manifest")}
    write_complete(out, meta, file_entries(out, checkpoint_files(out)))
    return out.name
