"""Expand configured paths (globs, fsspec URLs, {prefix}/{site_packages} placeholders) into concrete files."""

from __future__ import annotations

import os
import sys
import sysconfig

import fsspec


def expand_placeholders(path: str) -> str:
    path = path.replace("{prefix}", sys.prefix).replace("{site_packages}", sysconfig.get_paths()["purelib"])
    return os.path.expanduser(os.path.expandvars(path))


# The package extra that brings each remote filesystem's fsspec backend.
EXTRAS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "http": "http", "https": "http"}


def _missing_backend(url: str, e: ImportError) -> ImportError:
    proto = url.split("://", 1)[0] if "://" in url else "file"
    extra = EXTRAS.get(proto)
    hint = f"pip install 'lmstack[{extra}]'" if extra else f"install the fsspec backend for {proto}://"
    return ImportError(f"{url}: reading {proto}:// paths needs its fsspec backend: {hint} ({e})")


def require_backend(url: str) -> None:
    """Import the fsspec backend of a URL now (no network): a missing optional extra is found before any work."""
    proto = url.split("::")[-1].split("://", 1)[0] if "://" in url else "file"
    try:
        fsspec.get_filesystem_class(proto)
    except ImportError as e:
        raise _missing_backend(url, e) from None


def filesystem(url: str):
    """fsspec's filesystem for a path or URL; a missing backend is an error naming the extra to install."""
    try:
        return fsspec.core.get_fs_token_paths(url)[0]
    except ImportError as e:
        raise _missing_backend(url, e) from None


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
