"""A run folder is data: no checkpoint file runs code (issue 64 item 2, docs/security.md).

torch checkpoints are pickles, and unpickling calls whatever callable the file names: an object whose
`__reduce__` returns `os.system` runs a command on load. COMPLETE's hashes prove a file is the one COMPLETE lists,
not who wrote it: anyone who can write the folder can recompute them. lmstack's own loads use
`torch.load(weights_only=True)`, but DeepSpeed's (engine.load_checkpoint, zero_to_fp32, ds_to_universal) pass
`weights_only=False` in a dozen places we do not own. So before anything of a checkpoint folder is unpickled, by
us or by DeepSpeed, every pickle in it is scanned (`check_folder`): pickletools walks the opcodes without running
any, and every global the pickle would import (GLOBAL, INST, STACK_GLOBAL) must be on `ALLOWED`, a list of the
exact names lmstack's and DeepSpeed's checkpoints hold (tensors, storages, dtypes, the numpy RNG state, DeepSpeed's
own enums). A name is either resolved with certainty from the opcodes or the file is refused: nothing is guessed.
Only globals can reach code from a pickle (REDUCE, NEWOBJ, BUILD and OBJ call or populate only what a global
named), so a file whose globals are all allowed runs nothing but those.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import pickletools
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from core.errors import CannotContinueError

DOC = "docs/security.md"

# module.qualname of every global a checkpoint of lmstack or DeepSpeed 0.19 holds (the tiny runs of every family,
# ZeRO 0-3, the universal conversion; tests/pretrain/test_safe_load.py checks that each is all they hold).
ALLOWED: frozenset[str] = frozenset(
    {
        # tensors and what torch pickles around them
        "collections.OrderedDict",
        "torch._utils._rebuild_tensor_v2",
        "torch._utils._rebuild_parameter",
        "torch._tensor._rebuild_from_type_v2",  # its function and type are globals of their own, checked too
        "torch.Size",
        "torch.Tensor",
        "torch.nn.parameter.Parameter",
        "torch.device",
        "torch.serialization._get_layout",
        *(
            f"torch.{dtype}"
            for dtype in (
                "float32",
                "float16",
                "bfloat16",
                "float64",
                "int64",
                "int32",
                "int16",
                "int8",
                "uint8",
                "bool",
                "complex64",
            )  # fmt: skip
        ),
        *(
            f"torch.{kind}Storage"
            for kind in (
                "Float",
                "Half",
                "BFloat16",
                "Double",
                "Long",
                "Int",
                "Short",
                "Char",
                "Byte",
                "Bool",
                "ComplexFloat",
            )  # fmt: skip
        ),
        # bytes under pickle protocol 2 (torch.save's): _codecs.encode(str, "latin1") only returns bytes
        "_codecs.encode",
        # the numpy RNG state (np.random.get_state(): an ndarray of uint32) and numpy scalars
        "numpy.core.multiarray._reconstruct",
        "numpy._core.multiarray._reconstruct",
        "numpy.core.multiarray.scalar",
        "numpy._core.multiarray.scalar",
        "numpy.ndarray",
        "numpy.dtype",
        "numpy.dtypes.UInt32DType",
        "numpy.dtypes.Float64DType",
        "numpy.dtypes.Int64DType",
        # DeepSpeed's own records in its model and optimizer states
        "deepspeed.runtime.zero.config.ZeroStageEnum",
        "deepspeed.runtime.fp16.loss_scaler.LossScaler",
        "deepspeed.runtime.fp16.loss_scaler.DynamicLossScaler",
        "deepspeed.utils.tensor_fragment.fragment_address",
        "argparse.Namespace",
    }
)

# Opcodes that push a str (the operands STACK_GLOBAL takes from the stack), and those that only write the memo.
_STRINGS = frozenset(
    {
        "SHORT_BINUNICODE",
        "BINUNICODE",
        "BINUNICODE8",
        "UNICODE",
        "SHORT_BINSTRING",
        "BINSTRING",
        "STRING",
    }
)
_MEMO_WRITES = frozenset({"MEMOIZE", "PUT", "BINPUT", "LONG_BINPUT"})
_MEMO_READS = frozenset({"GET", "BINGET", "LONG_BINGET"})
_UNKNOWN = object()  # a memo entry or stack value that is not a str literal


class ForeignCode(CannotContinueError):
    """A checkpoint file names a global no checkpoint holds: refused before anything of it is unpickled."""


def pickle_globals(data: bytes) -> list[str]:
    """Every global the pickle `data` imports, as `module.qualname`, read from its opcodes (nothing is run).
    Raises ValueError for what cannot be read with certainty: copyreg extension codes, a STACK_GLOBAL whose
    operands are not the two string pushes right before it, a malformed stream."""
    found: list[str] = []
    memo: dict[Any, Any] = {}
    recent: list[Any] = []  # values of the last ops that pushed, memo writes skipped (newest last)
    for op, arg, _pos in pickletools.genops(io.BytesIO(data)):
        name = op.name
        if name in ("GLOBAL", "INST"):
            module, _, qual = str(arg).partition(" ")
            found.append(f"{module}.{qual}")
            recent.append(_UNKNOWN)
        elif name == "STACK_GLOBAL":
            if len(recent) < 2 or not all(isinstance(v, str) for v in recent[-2:]):
                raise ValueError("a global whose name is computed (STACK_GLOBAL not after two strings)")
            found.append(f"{recent[-2]}.{recent[-1]}")
            recent.append(_UNKNOWN)
        elif name.startswith("EXT"):
            raise ValueError(f"a copyreg extension code ({name} {arg})")
        elif name in ("PROTO", "FRAME"):  # stream framing: the stack is untouched
            continue
        elif name in _MEMO_WRITES:
            key = len(memo) if name == "MEMOIZE" else arg
            memo[key] = recent[-1] if recent else _UNKNOWN
        elif name in _MEMO_READS:
            recent.append(memo.get(arg, _UNKNOWN))
        elif name in _STRINGS:
            recent.append(arg if isinstance(arg, str) else _UNKNOWN)
        else:
            recent.append(_UNKNOWN)
        del recent[:-2]
    return found


def _pickles(path: Path) -> Iterator[tuple[str, bytes]]:
    """(where, pickle bytes) for each pickle torch.load could read in `path`: every `.pkl` entry of a torch zip
    archive (each entry of the central directory, so a second entry of one name is read too). A file that is a
    bare pickle (the legacy torch format, or pickle.dump) is refused: neither lmstack nor DeepSpeed writes one."""
    with path.open("rb") as f:
        head = f.read(4)
    if head[:2] != b"PK":
        if head[:1] == b"\x80" or path.suffix in (".pt", ".pth", ".pkl", ".bin"):
            raise ValueError(
                "is not a torch zip archive (torch.save writes one; a bare pickle is never ours)"
            )
        return
    try:
        with zipfile.ZipFile(path) as zf:
            for info in zf.infolist():
                if info.filename.lower().endswith(".pkl"):
                    yield info.filename, zf.read(info)
    except zipfile.BadZipFile as e:
        raise ValueError(f"is not a readable zip archive ({e})") from None


def file_globals(path: Path) -> list[str]:
    """The globals every pickle of `path` imports (see `pickle_globals`)."""
    out: list[str] = []
    for _, data in _pickles(path):
        try:
            out += pickle_globals(data)
        except Exception as e:  # a malformed stream too: genops raises ValueError or others on garbage
            raise ValueError(f"holds a pickle that cannot be read safely: {e}") from None
    return out


def _refusal(path: Path, why: str) -> ForeignCode:
    return ForeignCode(
        f"refused: {path} {why}; lmstack loads only tensors and plain data from a run folder ({DOC})"
    )


def check_file(path: Path) -> list[str]:
    """Refuses (ForeignCode, one line naming the file and the global) a file that would run code on load;
    returns its globals otherwise."""
    try:
        found = file_globals(path)
    except ValueError as e:
        raise _refusal(path, str(e)) from None
    for name in found:
        if name not in ALLOWED:
            raise _refusal(path, f"holds a reference to {name}, which a checkpoint never holds")
    return found


def check_folder(folder: Path) -> None:
    """Every file of checkpoint `folder` (recursively: a universal checkpoint's `zero/<param>/*.pt` too), before
    lmstack or DeepSpeed unpickles any of them. Reads only the pickles, not the tensor data."""
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        check_file(path)


def _resolve(name: str) -> Any:
    module, _, qual = name.rpartition(".")
    while module:
        try:
            obj: Any = importlib.import_module(module)
            break
        except ImportError:  # a class nested in a module: numpy.dtypes.UInt32DType, torch.float32
            module, _, outer = module.rpartition(".")
            qual = f"{outer}.{qual}"
    else:
        raise ImportError(name)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def load(path: Path, map_location: Any = "cpu", mmap: bool | None = None) -> Any:
    """torch.load of a checkpoint file of ours: scanned first (one line on a foreign global), then loaded with
    `weights_only=True` and the file's own allowed globals as torch's safe globals (torch's check, twice sure)."""
    import torch

    names = set(check_file(path))
    safe = []
    for name in sorted(names):
        with contextlib.suppress(ImportError, AttributeError):  # a numpy 1 name under numpy 2, or the reverse
            safe.append(_resolve(name))
    if "numpy.dtype" in names:  # torch builds a dtype through its class, which the pickle never names
        import numpy as np

        safe += [type(np.dtype(t)) for t in (np.uint32, np.int64, np.float64)]
    with torch.serialization.safe_globals(safe):
        return torch.load(path, map_location=map_location, weights_only=True, mmap=mmap)
