"""Issue 25 row 12 (swapped tokenizer): a resume or an export with another tokenizer than the checkpoint's is one
line naming both (the checkpoint and the tokenizer folder, with their sizes), not torch's `size mismatch`."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from tests.pretrain.conftest import run_module

pytestmark = [pytest.mark.integration, pytest.mark.deepspeed]


def _other_tokenizer(folder: Path) -> None:
    """Replace the run's tokenizer (a symlink to the shared one) by a copy with a smaller vocabulary."""
    from tokenizers import ByteLevelBPETokenizer

    src = folder.resolve()
    folder.unlink()
    shutil.copytree(src, folder)
    specials = ["<s>", "<pad>", "</s>", "<unk>", "<mask>"]
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(
        ["a small corpus of news text, trained to another size."] * 50,
        vocab_size=400,
        special_tokens=specials,
    )
    tok.save(str(folder / "tokenizer.json"))
    assert json.loads((folder / "tokenizer.json").read_text())["model"]["type"] == "BPE"


@pytest.mark.timeout(600)
def test_swapped_tokenizer_is_named_on_resume_and_export(roberta_run, tmp_path):
    from pretrain.checkpoint import CANNOT_CONTINUE_EXIT_CODE
    from tests.pretrain.test_train_deepspeed import isolated

    out = isolated(roberta_run, tmp_path)
    run = Path(out.split("=", 1)[1])
    base = ["--config", str(roberta_run), out, "checkpoint.every_steps=4", "eval.every_steps=1000"]
    run_module(["-m", "pretrain", "train", *base, "schedule.total_steps=4"])
    _other_tokenizer(run / "tokenizer")
    for cmd in (["train", *base, "schedule.total_steps=8"], ["export", *base]):
        res = run_module(["-m", "pretrain", *cmd], check=False)
        assert res.returncode == CANNOT_CONTINUE_EXIT_CODE, res.stderr[-3000:]
        line = next(ln for ln in res.stderr.splitlines() if "tokenizer swapped" in ln)
        assert str(run / "checkpoints" / "step00000004") in line and str(run / "tokenizer") in line
        sizes = re.search(r"a tokenizer of (\d+) tokens .* one of (\d+) tokens", line)
        assert sizes and sizes[1] != sizes[2] and int(sizes[2]) <= 400, line
        assert "size mismatch" not in res.stderr and "Traceback" not in res.stderr
