"""The check that every configured data source names files that exist (or a remote URL whose fsspec backend is
installed), run by the CLIs before the first stage: it needs the readers' traits (is a path a file?), so it sits
beside them rather than in core/paths.py."""

from __future__ import annotations

from core.errors import ConfigError
from core.paths import expand_paths, require_backend
from data_pipeline.readers.base import format_traits


def check_source_paths(cfg) -> None:
    """Before any stage: every path pattern of every source matches at least one file, and every remote one has
    its fsspec backend installed and can be listed (credentials, bucket), else a one-line ConfigError naming the
    source's key (and the extra to install); Hub dataset names are not probed."""
    for i, src in enumerate(cfg.data.sources):
        if not format_traits(src.format).paths_are_files:  # e.g. Hub dataset names
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
