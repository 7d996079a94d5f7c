"""Expand configured paths (globs, fsspec URLs, {prefix}/{site_packages} placeholders) into concrete files."""

from __future__ import annotations

import os
import sys
import sysconfig
from pathlib import Path

import fsspec


def expand_placeholders(path: str) -> str:
    path = path.replace("{prefix}", sys.prefix).replace("{site_packages}", sysconfig.get_paths()["purelib"])
    return os.path.expanduser(os.path.expandvars(path))


# The package extra that brings each remote filesystem's fsspec backend.
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "http"}


def filesystem(url: str):
    """fsspec's filesystem for a path or URL; a missing backend is an error naming the extra to install."""
    try:
        return fsspec.core.get_fs_token_paths(url)[0]
    except ImportError as e:
        proto = url.split("://", 1)[0] if "://" in url else "file"
        extra = EXTRAS.get(proto)
        hint = f"pip install 'lmstack[{extra}]'" if extra else f"install the fsspec backend for {proto}://"
        raise ImportError(f"{url}: reading {proto}:// paths needs its fsspec backend: {hint} ({e})") from None


def expand_paths(patterns: list[str], recursive_dirs: bool = False) -> list[str]:
    """Sorted, de-duplicated file list. A pattern that matches nothing is an error naming it."""
    files: list[str] = []
    for raw in patterns:
        pat = expand_placeholders(raw)
        fs = filesystem(pat)
        protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
        has_glob = any(c in pat for c in "*?[")
        found = fs.glob(pat) if has_glob else ([pat] if fs.exists(pat) else [])
        expanded = []
        for p in sorted(found):
            if fs.isdir(p):
                if recursive_dirs:
                    expanded.extend(sorted(f for f in fs.find(p) if not fs.isdir(f)))
                continue
            expanded.append(p)
        if not found:
            raise FileNotFoundError(f"no files match '{raw}' (expanded to '{pat}')")
        if protocol not in ("file", "local"):
            expanded = [p if "://" in p else f"{protocol}://{p}" for p in expanded]
        files.extend(expanded)
    return sorted(dict.fromkeys(files))


def check_source_paths(cfg) -> None:
    """Before any stage: every local path pattern of every source matches at least one file, else a
    ConfigError naming the source's key (remote URLs and Hub dataset names are not probed)."""
    from runconfig.load import ConfigError

    for i, src in enumerate(cfg.data.sources):
        if src.format == "hf_dataset":
            continue
        for j, pattern in enumerate(src.paths):
            if "://" in pattern and not pattern.startswith("file://"):
                continue
            try:
                expand_paths([pattern])
            except OSError as e:
                raise ConfigError(f"data.sources.{i}.paths.{j} (source '{src.name}'): {e}") from None


def current_umask() -> int:
    """The process umask, read without changing it where Linux reports it (os.umask is a set-and-restore)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def follow_umask(path: str | os.PathLike[str]) -> None:
    """A file made by mkstemp (or a library that creates 0600 files, such as safetensors) gets the mode any
    file tool would give it: 0666 less the umask (0644 under 022), so teammates can read run outputs. A folder:
    every file and folder in it."""
    mask = current_umask()
    p = Path(path)
    items = [p, *p.rglob("*")] if p.is_dir() else [p]
    for q in items:
        if not q.is_symlink():
            os.chmod(q, (0o777 if q.is_dir() else 0o666) & ~mask)
