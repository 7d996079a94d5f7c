"""Plug-ins (readers, filters) referenced as `module.path:Name`, and the code version a stage's fingerprint
records for each: a finished shard is reused only while the code that produced it is unchanged.

The version is a plug-in's declared `__version__` / `version` when it has one (an outside package's release),
else a hash of its module's source and of every project-local module it imports, directly or through them: a
module whose file lies outside the standard library and site-packages (datatrove and llm-foundry users keep
such helpers next to their config). lmstack's own packages are versioned by lmstack, so the walk does not go
into them (editing runconfig/ does not redo every shard); nor into installed packages (their version pins them).

A helper imported inside a function (as docs/extending.md advises for heavy modules) is not in any module's
globals, so the hash also covers the plug-in's own folder: every `.py` file of its top-level package, or for a
plain module the `.py` files beside it. What lies elsewhere and is imported only inside a function is not covered
(docs/extending.md says so); a folder too large to hash is named in a warning.
"""

from __future__ import annotations

import hashlib
import importlib
import inspect
import re
import sys
import sysconfig
import types
from pathlib import Path
from typing import Any

from core.errors import PluginError
from core.io import sha256_bytes
from core.log import get_logger

log = get_logger(__name__)

REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
OWN_PACKAGES = ("core", "runconfig", "data_pipeline", "pretrain", "adapt", "launch")
MAX_FOLDER_FILES = (
    500  # a plug-in beside a whole source tree: hashing it on every run would cost more than it saves
)


def is_ref(name: str) -> bool:
    """`module.path:Name`: a plug-in taken straight from an importable module, no packaging or entry point."""
    return bool(REF.match(name))


def load_ref(ref: str, key: str) -> Any:
    """The object a `module.path:Name` reference names; an error naming the config key when it cannot load."""
    module, _, attr = ref.partition(":")
    try:
        obj: Any = importlib.import_module(module)
    except ImportError as e:
        raise PluginError(
            f"{key}: cannot import module '{module}' of '{ref}' ({e}); is its folder on PYTHONPATH "
            "(the current folder is)?"
        ) from None
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise PluginError(f"{key}: module '{module}' has no '{attr}' (from '{ref}')")
        obj = getattr(obj, part)
    return obj


def _outside_paths() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    roots |= {p for p in sys.path if "site-packages" in p or "dist-packages" in p}
    return tuple(str(Path(r).resolve()) for r in roots if r)


def _is_project_local(mod: types.ModuleType, outside: tuple[str, ...]) -> bool:
    file = getattr(mod, "__file__", None)
    if not file or mod.__name__.split(".")[0] in OWN_PACKAGES:
        return False
    resolved = str(Path(file).resolve())
    return not any(resolved.startswith(root + "/") or resolved == root for root in outside)


def _imports(mod: types.ModuleType) -> set[types.ModuleType]:
    """Modules a module uses: imported modules and the home modules of imported functions and classes."""
    out = set()
    for value in vars(mod).values():
        if isinstance(value, types.ModuleType):
            out.add(value)
        else:
            home = sys.modules.get(getattr(value, "__module__", None) or "")
            if home is not None and home is not mod:
                out.add(home)
    return out


def code_version(obj: Any) -> str:
    """The plug-in's declared version, or a hash of its module and the project-local modules it imports."""
    declared = getattr(obj, "__version__", None) or getattr(obj, "version", None)
    if isinstance(declared, str):
        return f"version {declared}"
    start = sys.modules.get(getattr(obj, "__module__", "") or "")
    if start is None:
        return sha256_bytes(repr(obj))[:12]
    outside = _outside_paths()
    seen: dict[str, types.ModuleType] = {}
    todo = [start]
    while todo:
        mod = todo.pop()
        if mod.__name__ in seen:
            continue
        seen[mod.__name__] = mod
        todo += [m for m in _imports(mod) if m.__name__ not in seen and _is_project_local(m, outside)]
    folder = _own_folder_files(start, outside)
    start_file = Path(start.__file__).name if getattr(start, "__file__", None) else None
    if len(seen) == 1 and set(folder) <= {start_file}:
        # the module alone: the same hash as before helpers were followed (markers stay valid)
        try:
            return sha256_bytes(inspect.getsource(start))[:12]
        except (OSError, TypeError):
            return sha256_bytes(repr(obj))[:12]
    h = hashlib.sha256()
    for name in sorted(seen):
        try:
            src = inspect.getsource(seen[name])
        except (OSError, TypeError):
            src = repr(seen[name])
        h.update(name.encode() + b"\0" + src.encode() + b"\0")
    for path in sorted(folder):
        h.update(path.encode() + b"\0" + folder[path] + b"\0")
    return h.hexdigest()[:12]


def _own_folder_files(start: types.ModuleType, outside: tuple[str, ...]) -> dict[str, bytes]:
    """The `.py` files of the plug-in's own folder (its top-level package, recursively, or the files beside a
    plain module): the helpers it may import inside a function. Nothing for lmstack's and installed code."""
    top = sys.modules.get(start.__name__.split(".")[0], start)
    if not _is_project_local(top, outside):
        return {}
    pkg_dirs = list(getattr(top, "__path__", []) or [])
    if pkg_dirs:  # keyed by the path inside the package's parent: moving the project redoes nothing
        files = sorted({(f, f.relative_to(Path(d).parent)) for d in pkg_dirs for f in Path(d).rglob("*.py")})
        where = ", ".join(pkg_dirs)
    else:
        files = sorted((f, f.relative_to(f.parent)) for f in Path(top.__file__).resolve().parent.glob("*.py"))
        where = str(Path(top.__file__).resolve().parent)
    if len(files) > MAX_FOLDER_FILES:
        log.warning(
            f"plug-in {start.__name__}: {where} holds {len(files)} .py files (more than {MAX_FOLDER_FILES}); "
            "only the modules it imports at module level are fingerprinted, helpers imported inside a function "
            "are not covered: give the plug-in a __version__ and raise it on every change"
        )
        return {}
    out = {}
    for f, rel in files:
        try:
            out[str(rel)] = f.read_bytes()
        except OSError:
            continue
    return out
