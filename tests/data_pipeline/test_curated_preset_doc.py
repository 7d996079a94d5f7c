"""Issue 66: docs/data.md said the `curated` preset does "unicode repair and PII redaction only", while URL
blocklists (when configured) and n-gram decontamination run there too. What the doc's `curated` bullet names is
what the clean stage runs for a curated source."""

from __future__ import annotations

from pathlib import Path

from data_pipeline.decontaminate import decontamination_filter
from data_pipeline.filters.registry import build_filters
from runconfig import load_config

ROOT = Path(__file__).resolve().parents[2]
# the words the doc uses for each step the clean stage can run
DOC_WORDS = {
    "unicode": "unicode repair",
    "pii": "PII redaction",
    "url": "URL blocklists",
    "decontaminate": "decontamination",
}


def _curated_bullet() -> str:
    text = (ROOT / "docs" / "data.md").read_text()
    start = text.index("- `curated`")
    return text[start : text.index("\n\n", start)]


def test_the_curated_bullet_names_every_step_a_curated_source_runs(tmp_path):
    blocklist = tmp_path / "domains.txt"
    blocklist.write_text("example.com\n")
    cfg = load_config(
        ROOT / "configs" / "demo.yaml",
        ["data.sources.0.clean_preset=curated", f"data.clean.url.blocked_domains=[{blocklist}]"],
    )
    runs = [name for name, _ in build_filters(cfg.data.clean_for(cfg.data.sources[0].name), cfg)]
    assert ("decontaminate" in runs) is (decontamination_filter(cfg) is not None)  # a step of the chain
    assert set(runs) == set(DOC_WORDS), runs  # the steps this test knows the doc's words for
    bullet = _curated_bullet()
    for step in runs:
        assert DOC_WORDS[step] in bullet, (step, bullet)
