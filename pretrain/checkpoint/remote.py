"""A remote run's checkpoints (`run.output_dir: s3://...`): the local staging folder is uploaded after each save
(COMPLETE after every file it lists, `latest` last), and a resume lists, downloads and verifies the remote ones."""

from __future__ import annotations

import time
from pathlib import Path

import torch.distributed as dist

from core.io import sha256_bytes
from core.layout import RESOLVED_CONFIG
from core.log import get_logger
from pretrain.checkpoint.meta import COMPLETE, TAG_RE, complete_tags

log = get_logger(__name__)


def remote_candidates(ckpt_dir: Path, remote: str) -> list[tuple[str, bool]]:
    """Rank 0 lists the remote checkpoints whose COMPLETE exists, the remote `latest` first, then newest first,
    after any local complete checkpoint newer than all of them; every rank gets the same (tag, in bucket) list."""
    from core.storage import RunStore

    tags: list[tuple[str, bool]] = []
    if not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0:
        store = RunStore(ckpt_dir, remote)
        names = store.list_dir(ckpt_dir)
        up = [
            t
            for t in sorted(names, reverse=True)
            if TAG_RE.match(t) and store.exists(ckpt_dir / t / COMPLETE)
        ]
        if "latest" in names:
            latest = store.fs.cat_file(store.url(ckpt_dir / "latest")).decode().strip()
            if latest in up:
                up.remove(latest)
                up.insert(0, latest)
        newer = [t for t in complete_tags(ckpt_dir)[::-1] if t not in up and t > max(up, default="")]
        tags = [(t, False) for t in newer] + [(t, True) for t in up]
    if dist.is_available() and dist.is_initialized():
        box = [tags]
        dist.broadcast_object_list(box, src=0)
        tags = box[0]
    return tags


def fetch_checkpoint(ckpt_dir: Path, tag: str, remote: str, force: bool = False) -> None:
    """Rank 0 downloads a remote checkpoint folder into `ckpt_dir` (the staging folder every rank reads; missing
    or differently sized files, and COMPLETE, are fetched); the other ranks wait for it."""
    from core.storage import RunStore

    if not (dist.is_available() and dist.is_initialized()) or dist.get_rank() == 0:
        RunStore(ckpt_dir, remote).pull([ckpt_dir / tag], force=force)
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def fetch_url(url: str, cache_root: Path) -> tuple[Path, str]:
    """A checkpoint given by URL (`s3://.../checkpoints/step00000100`): downloaded into
    `cache_root/<hash of its folder>/<tag>`; returns (local checkpoints folder, tag) to load like a local one."""
    parent, tag = url.rstrip("/").rsplit("/", 1)
    if not TAG_RE.match(tag):
        raise ValueError(f"{url}: not a checkpoint folder (stepNNNNNNNN)")
    local = Path(cache_root) / sha256_bytes(parent)[:12]
    fetch_checkpoint(local, tag, parent)
    return local, tag


def upload_checkpoint(
    ckpt_dir: Path, tag: str, remote: str, keep_last: int, warn=None, retries: int = 3
) -> bool:
    """Rank 0, after COMPLETE and `latest` are written locally: the folder's files, then COMPLETE, then `latest`
    (a remote COMPLETE never precedes the files it lists); remote checkpoints beyond `keep_last` are removed.
    A failed upload is retried, then reported: the local checkpoint stays usable and training goes on."""
    from core.storage import RunStore

    store = RunStore(ckpt_dir, remote)
    for attempt in range(retries):
        try:
            t0 = time.time()
            sent = store.push([ckpt_dir / tag, *[p for p in (ckpt_dir / RESOLVED_CONFIG,) if p.is_file()]])
            sent += store.push([ckpt_dir / "latest"])
            mb = sum(p.stat().st_size for p in sent) / 2**20
            (warn or log.info)(
                f"[checkpoint] uploaded {tag} to {store.url(ckpt_dir / tag)} ({len(sent)} files, {mb:.1f} MiB, "
                f"{time.time() - t0:.1f}s)"
            )
            remote_tags = sorted(t for t in store.list_dir(ckpt_dir) if TAG_RE.match(t))
            for old in remote_tags[:-keep_last]:
                store.remove(ckpt_dir / old)
            return True
        except (
            OSError,
            RuntimeError,
            ValueError,
        ) as e:  # network and backend errors (botocore wraps in OSError)
            if attempt == retries - 1:
                (warn or log.warning)(
                    f"[checkpoint] WARNING: uploading {ckpt_dir / tag} to {store.url(ckpt_dir / tag)} failed "
                    f"({type(e).__name__}: {e}); it stays local only, the next checkpoint uploads again"
                )
                return False
            time.sleep(2**attempt)
    return False
