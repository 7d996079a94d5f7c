"""Deprecated: the old home of `Document`, `stable_id` and `in_holdout`, which moved to `core.document` (every
floor uses them). Kept as a re-export so readers written against `from data_pipeline.document import Document`
keep working; import from `core.document` instead. Importing this module emits a DeprecationWarning."""

from __future__ import annotations

import warnings

from core.document import Document, in_holdout, stable_id

__all__ = ["Document", "in_holdout", "stable_id"]

warnings.warn(
    "data_pipeline.document is deprecated: import Document, stable_id and in_holdout from core.document",
    DeprecationWarning,
    stacklevel=2,
)
