"""The scan that keeps code out of checkpoint loads (pretrain/checkpoint/safe_load.py, issue 64 item 2): every global a
pickle would import is read from its opcodes, nothing is run, and a name that cannot be read with certainty is
refused like a foreign one. The real engine's checkpoints (ZeRO 0-3, bf16) hold only allowed globals."""

from __future__ import annotations

import io
import os
import pickle
import random
import zipfile
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from pretrain.checkpoint.safe_load import ALLOWED, ForeignCode, check_file, check_folder, load, pickle_globals
from tests.pretrain.conftest import world_of_one


class Payload:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_planted_reduce_is_refused_naming_the_file_and_the_global(tmp_path):
    marker, path = tmp_path / "PWNED", tmp_path / "ckpt" / "rng_rank00000.pt"
    path.parent.mkdir()
    torch.save({"torch": torch.get_rng_state(), "x": Payload(marker)}, path)
    for check in (check_file, load, lambda p: check_folder(p.parent)):
        with pytest.raises(ForeignCode) as e:
            check(path)
        msg = str(e.value)
        assert msg.startswith(f"refused: {path} holds a reference to posix.system, which a checkpoint never")
        assert "docs/security.md" in msg and "\n" not in msg
    assert not marker.exists()


def test_what_our_checkpoints_hold_loads_back_equal(tmp_path):
    state = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
        "module": OrderedDict(w=torch.randn(3, 2), b=torch.zeros(2, dtype=torch.bfloat16)),
        "step": 4,
        "shape": torch.Size([3, 2]),
        "blob": b"\x00\xff",
    }
    torch.save(state, tmp_path / "s.pt")
    back = load(tmp_path / "s.pt")
    assert back["python"] == state["python"] and back["step"] == 4 and back["blob"] == b"\x00\xff"
    assert all(np.array_equal(a, b) if isinstance(a, np.ndarray) else a == b
               for a, b in zip(back["numpy"], state["numpy"], strict=True))  # fmt: skip
    assert torch.equal(back["module"]["w"], state["module"]["w"]) and back["shape"] == state["shape"]


def _op(code: bytes, s: str) -> bytes:
    """SHORT_BINUNICODE `s`."""
    raw = s.encode()
    return b"\x8c" + bytes([len(raw)]) + raw + code


def test_a_global_whose_name_is_computed_on_the_stack_is_refused():
    """STACK_GLOBAL takes its names from the stack: only the two string pushes right before it count (the memo
    followed); a decoy popped in between, or a name built any other way, is refused rather than guessed."""
    proto4 = b"\x80\x04"
    decoy = proto4 + _op(b"", "posix") + _op(b"0", "decoy") + _op(b"", "system") + b"\x93" + b"."
    with pytest.raises(ValueError, match="computed"):
        pickle_globals(decoy)  # a naive reader would say decoy.system; the stack says posix.system
    memo = proto4 + _op(b"\x94", "posix") + b"0" + _op(b"\x94", "system") + b"0h\x00h\x01\x93" + b"."
    assert pickle_globals(memo) == ["posix.system"]  # through the memo: resolved, and not allowed
    with pytest.raises(ValueError, match="extension"):
        pickle_globals(proto4 + b"\x82\x01" + b".")  # EXT1: a global by copyreg code
    assert pickle_globals(pickle.dumps(os.system, protocol=5)) == ["posix.system"]  # framed


def test_every_pickle_of_a_zip_counts_and_a_bare_pickle_is_refused(tmp_path):
    """torch reads `<archive>/data.pkl`; a second entry of the same name, or a pickle that is no zip (the legacy
    format, pickle.dump) is refused too: neither lmstack nor DeepSpeed writes one."""
    good = io.BytesIO()
    torch.save({"w": torch.ones(1)}, good)
    path = tmp_path / "model_states.pt"
    path.write_bytes(good.getvalue())
    with zipfile.ZipFile(path, "a") as zf, pytest.warns(UserWarning, match="Duplicate"):
        zf.writestr(zf.namelist()[0].split("/")[0] + "/data.pkl", pickle.dumps(os.system, protocol=2))
    with pytest.raises(ForeignCode, match="posix.system"):
        check_file(path)
    bare = tmp_path / "rng.pt"
    bare.write_bytes(pickle.dumps({"a": 1}))
    with pytest.raises(ForeignCode, match="not a torch zip archive"):
        check_file(bare)
    (tmp_path / "notes.txt").write_text("plain text is never unpickled")
    check_file(tmp_path / "notes.txt")


# The real engine saves (the world of one after a step), and every file it wrote is scanned and loaded back.
SAVE_AND_SCAN = r"""
import tempfile
from pathlib import Path
from pretrain.checkpoint.safe_load import ALLOWED, file_globals, load
out = Path(tempfile.mkdtemp())
engine.save_checkpoint(str(out), tag="t", save_latest=False)
names = {}
for p in sorted((out / "t").rglob("*.pt")):
    names[p.name] = sorted(set(file_globals(p)))
    load(p)
print("RESULT " + json.dumps(names))
"""


@pytest.mark.deepspeed
@pytest.mark.timeout(400)
@pytest.mark.parametrize("zero,precision", [(0, "fp32"), (1, "fp32"), (3, "fp32"), (2, "bf16")])
def test_the_engines_checkpoints_hold_only_allowed_globals(zero, precision, monkeypatch):
    import tests.pretrain.conftest as c

    engine = c.WORLD_OF_ONE_ENGINE.replace(
        '"deepspeed.zero_stage=2"', f'"deepspeed.zero_stage={zero}", "deepspeed.precision={precision}"'
    )
    assert engine != c.WORLD_OF_ONE_ENGINE
    monkeypatch.setattr(c, "WORLD_OF_ONE_ENGINE", engine)  # world_of_one runs this engine, then the driver
    names = world_of_one(SAVE_AND_SCAN)
    assert names, "the engine wrote no checkpoint files"
    for file, found in names.items():
        assert set(found) <= ALLOWED, (file, sorted(set(found) - ALLOWED))


# A loss spike's rollback reloads the last complete checkpoint through `load_checkpoint`, as a resume does.
ROLLBACK_PLANTED = r"""
import tempfile
from pathlib import Path
from pretrain.checkpoint.resume import load_checkpoint
out = Path(tempfile.mkdtemp())
engine.save_checkpoint(str(out), tag="step00000001", save_latest=False)
marker = out / "PWNED"
states = out / "step00000001" / "mp_rank_00_model_states.pt"
real = torch.load(states, weights_only=False)
class Payload:
    def __reduce__(self):
        return (os.system, (f"touch {marker}",))
torch.save({**real, "_planted": Payload()}, states)
try:
    load_checkpoint(engine, out, "step00000001")
    said = None
except Exception as e:  # without the scan: the payload runs, then the missing COMPLETE stops the load
    said = f"{type(e).__name__}: {e}"
print("RESULT " + json.dumps({"said": said, "ran": marker.exists(), "file": str(states)}))
"""


@pytest.mark.deepspeed
@pytest.mark.timeout(400)
def test_a_rollback_reload_refuses_a_planted_checkpoint():
    res = world_of_one(ROLLBACK_PLANTED)
    assert not res["ran"], "the payload ran"
    assert res["said"].startswith(f"ForeignCode: refused: {res['file']} holds a reference to posix.system")
