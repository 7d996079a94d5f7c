"""A trained tokenizer as a folder `AutoTokenizer` loads in transformers 4.40 and 5.x, and loading it back."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from tokenizers import (
    Tokenizer,
)

from core.io import replace_dir
from core.log import get_logger
from data_pipeline.tokenizers.conventions import CONVENTIONS

log = get_logger(__name__)


def make_portable(folder: Path, convention: str | None = None, **extra: Any) -> None:
    """Rewrite a saved tokenizer folder so transformers 4.40+ and 5.x both load it.

    - tokenizer_config.json: 5.x writes `tokenizer_class: TokenizersBackend` (unknown to 4.x) and a list under
      `extra_special_tokens` (4.x reads that key as a dict and fails); both versions read
      `additional_special_tokens` and resolve the class names of CONVENTIONS.
    - tokenizer.json: tokenizers >= 0.20 writes BPE merges as pairs, which tokenizers 0.19 (transformers 4.40)
      cannot parse; "a b" strings read in every version, and byte-level BPE tokens never contain a space.
    """
    folder = Path(folder)
    path = folder / "tokenizer_config.json"
    conf = json.loads(path.read_text())
    extra_tokens = conf.pop("extra_special_tokens", None)
    if isinstance(extra_tokens, list) and extra_tokens:
        conf["additional_special_tokens"] = extra_tokens
    conf.pop("backend", None)
    if convention is not None:
        conv = CONVENTIONS.get(convention)
        conf["tokenizer_class"] = conv.tokenizer_class
        conf["padding_side"] = conv.padding_side
    if conf.get("tokenizer_class") in (None, "TokenizersBackend"):
        conf["tokenizer_class"] = "PreTrainedTokenizerFast"  # tokenizer.json as written, in 4.x and 5.x
    conf.update(extra)
    path.write_text(json.dumps(conf, indent=2, ensure_ascii=False) + "\n")

    tj_path = folder / "tokenizer.json"
    tj = json.loads(tj_path.read_text())
    merges = tj.get("model", {}).get("merges")
    if merges and isinstance(merges[0], list) and not any(" " in a or " " in b for a, b in merges):
        tj["model"]["merges"] = [f"{a} {b}" for a, b in merges]
        tj_path.write_text(json.dumps(tj, indent=2, ensure_ascii=False))


def remove_staging(folder: Path) -> None:
    """Staging folders of an earlier save that was killed (`.<name>.<random>`, `<name>.tmp`): one tokenizer is
    trained at a time per run folder, so they are dead."""
    stale = [*folder.parent.glob(f".{folder.name}.*"), folder.with_name(folder.name + ".tmp")]
    for p in stale:
        if p.is_dir():
            log.info(f"[tokenizer] removing {p.name}, left by an interrupted save")
            shutil.rmtree(p, ignore_errors=True)


def save_tokenizer(
    tok: Tokenizer,
    convention: str,
    folder: Path,
    model_max_length: int,
    extra_files: dict | None = None,
    lowercase: bool = False,
):
    """Write an HF tokenizer folder atomically (tmp folder, then rename): a crash never leaves half a folder."""
    from transformers import PreTrainedTokenizerFast

    conv = CONVENTIONS.get(convention)
    folder = Path(folder)
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_staging(folder)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        names = list(conv.model_input_names)
        hf = PreTrainedTokenizerFast(
            tokenizer_object=tok,
            model_max_length=model_max_length,
            model_input_names=names,
            padding_side=conv.padding_side,
            **conv.hf_tokens,
        )
        hf.save_pretrained(str(tmp))
        # BertTokenizerFast (4.x) re-lowercases unless told: the normaliser we trained is the truth.
        make_portable(tmp, convention, **({"do_lower_case": lowercase} if conv.lowercase_flag else {}))
        for name, data in (extra_files or {}).items():
            (tmp / name).write_bytes(data)
        replace_dir(tmp, folder)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp)
    return folder


def load_tokenizer(path: str | os.PathLike[str]):
    """The saved folder as transformers sees it (what training, export and fine-tuning use)."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path))
