"""Where a run resumes from and how a checkpoint is loaded: the newest complete checkpoint that verifies (local, or
downloaded from a remote run), the config changes since it, and the engine's state and this rank's RNG restored."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from core.errors import CannotContinueError
from core.log import get_logger
from pretrain.checkpoint import resume_diff
from pretrain.checkpoint.meta import COMPLETE, complete_tags, read_complete
from pretrain.checkpoint.remote import fetch_checkpoint, fetch_url, remote_candidates
from pretrain.checkpoint.rng import set_rng_state
from pretrain.checkpoint.safe_load import check_folder, load
from pretrain.checkpoint.verify import verify_checkpoint
from runconfig import RunConfig
from runconfig.load import to_dict

log = get_logger(__name__)


def _candidates(ckpt_dir: Path) -> list[str]:
    """The `latest` pointer first, then every complete folder, newest first."""
    tags = complete_tags(ckpt_dir)[::-1]
    latest = ckpt_dir / "latest"
    if latest.is_file():
        tag = latest.read_text().strip()
        if tag in tags:
            tags.remove(tag)
            tags.insert(0, tag)
    return tags


def select_resume_tag(ckpt_dir: Path, warn=None, remote: str | None = None) -> str | None:
    """The newest complete checkpoint that passes verification (every rank verifies a share of its files; all
    ranks agree). None when there is none at all (a fresh run). A damaged one is skipped with a warning; when
    checkpoints exist but every one is damaged, CannotContinue: starting over would silently discard them.
    `remote` (the checkpoints folder of a remote run): checkpoints whose COMPLETE was uploaded count; each is
    downloaded into `ckpt_dir` (files already there with the right size are kept) and verified. A local complete
    checkpoint newer than every remote one (its upload failed) is verified, uploaded now, and used. `warn` receives
    each warning line (default: this module's logger)."""
    warn = warn or log.warning
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    skipped = []
    candidates = (
        remote_candidates(ckpt_dir, remote) if remote else [(t, False) for t in _candidates(ckpt_dir)]
    )
    for tag, in_bucket in candidates:
        if in_bucket and remote:  # only a remote run has checkpoints in a bucket
            fetch_checkpoint(ckpt_dir, tag, remote)
        problems = verify_checkpoint(ckpt_dir / tag)
        # a damaged local copy of a good remote file has the same size: fetch it again
        if in_bucket and remote and problems:
            fetch_checkpoint(ckpt_dir, tag, remote, force=True)
            problems = verify_checkpoint(ckpt_dir / tag)
        if not problems:
            if remote and not in_bucket and rank == 0:
                from core.storage import RunStore

                warn(
                    f"[checkpoint] {tag} is newer than every checkpoint in {remote} (its upload failed): "
                    f"uploading it now"
                )
                RunStore(ckpt_dir, remote).push_or_warn([ckpt_dir / tag], warn)
            return tag
        skipped.append(
            f"{ckpt_dir / tag}: " + "; ".join(problems[:4]) + (" ..." if len(problems) > 4 else "")
        )
        if rank == 0:
            warn(f"[checkpoint] WARNING: skipping damaged checkpoint {skipped[-1]}")
    if skipped:
        raise CannotContinueError(
            f"no usable checkpoint left in {ckpt_dir}: every complete checkpoint failed verification:\n  "
            + "\n  ".join(skipped)
            + "\nRestore the files, or start over with checkpoint.resume=none (and another checkpoint.dir)."
        )
    return None


def find_resume_tag(ckpt_dir: Path) -> str | None:
    """The `latest` pointer if its folder is complete and verifies, else the newest complete folder that does."""
    return select_resume_tag(ckpt_dir)


def _unshare_step_counts(engine) -> None:
    """Give every parameter's optimizer state its own `step` tensor (issue 43). DeepSpeed 0.19.8's ZeRO-3
    universal load (`stage3.py` `load_hp_checkpoint_state_from_checkpoint_dir_stage3`) stores one tensor in
    every sub-group's state; torch's Adam increments it in place once per sub-group, so each step counted
    several times and the bias correction drifted from the uninterrupted run (DeepSpeed #6691)."""
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)
    seen: set[int] = set()
    for state in getattr(inner, "state", {}).values():
        step = state.get("step") if isinstance(state, dict) else None
        if isinstance(step, torch.Tensor):
            if id(step) in seen:
                state["step"] = step.clone()
            seen.add(id(step))


def load_checkpoint(engine, ckpt_dir: Path, tag: str) -> dict[str, Any]:
    """Restore engine (weights, optimizer, LR schedule) and this rank's RNG; return the client state. Every file
    of the folder is scanned first: DeepSpeed unpickles with weights_only=False (pretrain/checkpoint/safe_load.py)."""
    check_folder(ckpt_dir / tag)  # a resume, a universal checkpoint, a loss spike's rollback alike
    try:
        path, client_state = engine.load_checkpoint(
            str(ckpt_dir), tag=tag, load_optimizer_states=True, load_lr_scheduler_states=True
        )
    except RuntimeError as e:  # a checkpoint without a tokenizer record, loaded into a model of another size
        if "size mismatch" not in str(e):
            raise
        first = next((ln.strip() for ln in str(e).splitlines() if "size mismatch" in ln), str(e))
        raise CannotContinueError(
            f"checkpoint {ckpt_dir / tag} does not fit the model built from the current "
            f"tokenizer and model settings (was the tokenizer swapped?): {first}"
        ) from None
    if path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {ckpt_dir / tag}")
    _unshare_step_counts(engine)
    rng_path = ckpt_dir / tag / f"rng_rank{dist.get_rank():05d}.pt"
    if read_complete(ckpt_dir, tag)["world_size"] == dist.get_world_size():
        # verification lists it; only a checkpoint older than the file list gets here
        if not rng_path.is_file():
            raise CannotContinueError(f"{rng_path} is missing: the resume would not be exact")
        set_rng_state(load(rng_path))
    return client_state or {}


def resume_point(cfg: RunConfig, ckpt_dir: Path, rank: int) -> tuple[Path, str | None]:
    """The checkpoint to resume from (verified on every rank), and the config changes since it (applied or
    refused, printed): `checkpoint.resume` auto (the newest that verifies), none, a folder or a URL."""
    tag = None
    if cfg.checkpoint.resume == "auto":
        tag = select_resume_tag(ckpt_dir, remote=cfg.checkpoint_remote)
    elif "://" in cfg.checkpoint.resume:  # a checkpoint in a bucket: downloaded into the staging folder first
        ckpt_dir, tag = fetch_url(cfg.checkpoint.resume, Path(cfg.run.root) / "fetched-checkpoints")
    elif cfg.checkpoint.resume != "none":
        ckpt_dir, tag = Path(cfg.checkpoint.resume).parent, Path(cfg.checkpoint.resume).name
        if not (ckpt_dir / tag / COMPLETE).is_file():
            raise CannotContinueError(
                f"checkpoint.resume: {ckpt_dir / tag} is not a complete checkpoint (no {COMPLETE} file)"
            )
        problems = verify_checkpoint(ckpt_dir / tag)
        if problems:
            raise CannotContinueError(
                f"checkpoint.resume: {ckpt_dir / tag} is damaged: " + "; ".join(problems[:6])
            )
    if tag is not None:
        # every rank, before anything of it is unpickled (the universal conversion, the engine's load): a
        # checkpoint holding a reference to code is refused, naming the file and the global
        check_folder(ckpt_dir / tag)
        meta = read_complete(ckpt_dir, tag)
        changes = resume_diff.compare(
            meta.get("config"),
            to_dict(cfg),
            meta["step"],
            cfg.checkpoint.accept_config_changes,
            cfg.checkpoint.reset_data_order,
        )
        if rank == 0 and changes.describe():
            log.info(changes.describe())
    return ckpt_dir, tag
