"""The tokenizer a checkpoint was trained with, recorded in COMPLETE: a resume or an export with another one stops
naming both, instead of torch's `size mismatch` for the embedding."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from core.errors import CannotContinueError
from pretrain.checkpoint.meta import read_complete


def tokenizer_identity(tokenizer_dir: Path, tokenizer_len: int) -> dict[str, Any]:
    """What a checkpoint records of its tokenizer (COMPLETE's `tokenizer`): a resume or export with another one
    is named in one line instead of torch's `size mismatch` for the embedding."""

    tok_json = Path(tokenizer_dir) / "tokenizer.json"
    sha = hashlib.sha256(tok_json.read_bytes()).hexdigest() if tok_json.is_file() else None
    return {"path": str(tokenizer_dir), "sha256": sha, "size": int(tokenizer_len)}


def check_tokenizer(ckpt_dir: Path, tag: str, tokenizer_dir: Path, tokenizer_len: int) -> None:
    """CannotContinue when the tokenizer now in `tokenizer_dir` is not the one the checkpoint was trained with."""
    was = read_complete(ckpt_dir, tag).get("tokenizer")
    now = tokenizer_identity(tokenizer_dir, tokenizer_len)
    if was and (was.get("sha256") != now["sha256"] or was.get("size") != now["size"]):
        raise CannotContinueError(
            f"tokenizer swapped: checkpoint {ckpt_dir / tag} was trained with a tokenizer of {was.get('size')} tokens "
            f"(sha256 {str(was.get('sha256'))[:12]}), {tokenizer_dir} now holds one of {now['size']} tokens (sha256 "
            f"{str(now['sha256'])[:12]}); restore the checkpoint's tokenizer or start a new output folder"
        )
