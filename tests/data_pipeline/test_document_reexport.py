"""Issue 66: `import data_pipeline.document` failed after the module moved to `core.document`, so readers written to
last round's docs broke. The old path re-exports the same objects (a reader's documents are the stage's own class)
and says it is deprecated."""

from __future__ import annotations

import importlib
import warnings


def test_the_old_document_module_is_the_core_one_and_warns_it_moved():
    import core.document

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        import data_pipeline.document as old

        old = importlib.reload(old)
    assert old.Document is core.document.Document
    assert old.stable_id is core.document.stable_id and old.in_holdout is core.document.in_holdout
    assert old.stable_id("a", 1) == core.document.stable_id("a", 1)
    assert any(
        issubclass(w.category, DeprecationWarning) and "core.document" in str(w.message) for w in caught
    )
    assert "deprecated" in (old.__doc__ or "").lower()
