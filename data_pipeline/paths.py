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


def check_source_paths(cfg) -> None:
    """Before any stage: every path pattern of every source matches at least one file, and every remote one has
    its fsspec backend installed and can be listed (credentials, bucket), else a one-line ConfigError naming the
    source's key (and the extra to install); Hub dataset names are not probed."""
    from data_pipeline.readers import get_reader, reader_traits  # the readers import this module
    from runconfig.load import ConfigError

    for i, src in enumerate(cfg.data.sources):
        if not reader_traits(get_reader(src.format)).paths_are_files:  # e.g. Hub dataset names
            continue
        for j, pattern in enumerate(src.paths):
            if "://" in pattern and not pattern.startswith("file://"):
                try:
                    require_backend(pattern)
                except ImportError as e:
                    raise ConfigError(f"data.sources.{i}.paths.{j} (source '{src.name}'): {e}") from None
            key = f"data.sources.{i}.paths.{j} (source '{src.name}')"
            try:
                expand_paths([pattern])
            except OSError as e:
                raise ConfigError(f"{key}: {e}") from None
            except Exception as e:  # the store's own client errors (botocore: no credentials, bad endpoint)
                why = (str(e).strip().splitlines() or [""])[0]
                raise ConfigError(f"{key}: {pattern} cannot be listed ({type(e).__name__}: {why})") from None
