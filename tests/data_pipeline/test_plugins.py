"""Extension points: an outside package registers a filter and a reader through Python entry points, and the
CLI (process pool and single-shard Slurm-array mode alike) uses them from a YAML list; per-source cleaning
presets; completion markers that notice changed settings or filter code and say why shards are redone."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from data_pipeline.clean import run_clean
from runconfig import load_config
from tests.data_pipeline.tokens_fixtures import BBC

ROOT = Path(__file__).resolve().parents[2]

PLUGIN = '''
"""An outside package: a filter and a reader, registered through entry points."""
from core.document import Document, stable_id


class ShoutingFilter:
    name = "shouting"

    def __init__(self, max_upper_frac: float = 0.3):
        self.max_upper_frac = max_upper_frac

    def __call__(self, doc):
        letters = [c for c in doc.text if c.isalpha()]
        frac = sum(c.isupper() for c in letters) / max(1, len(letters))
        if frac > self.max_upper_frac:
            return False, "shouting:too_loud", round(frac, 3)
        return True, None


def read_lines(source, shard, src, errors, max_doc_bytes):
    """`.lines` files: one document per non-empty line."""
    with open(src.path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if line.strip():
                yield Document(id=stable_id(source.name, src.rel, i), text=line.strip(), source=source.name,
                               meta={"file": src.path, "offset": i})
'''

ENTRY_POINTS = """[lmstack.filters]
shouting = lmstack_example_plugin:ShoutingFilter

[lmstack.readers]
lines = lmstack_example_plugin:read_lines
"""

NOTES = [
    "The committee met on Tuesday and agreed the budget for the coming year.",
    "THIS IS AN ANGRY NOTE WRITTEN ENTIRELY IN CAPITAL LETTERS!!!",
    "Sales of the new console rose in the autumn, the company said.",
    "BUY NOW BUY NOW LIMITED OFFER CLICK HERE",
]


def _install_plugin(root: Path) -> Path:
    """A real installed distribution (package + dist-info with entry_points.txt) on a path of its own."""
    site = root / "site"
    (site / "lmstack_example_plugin").mkdir(parents=True)
    (site / "lmstack_example_plugin" / "__init__.py").write_text(PLUGIN)
    info = site / "lmstack_example_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lmstack-example-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(ENTRY_POINTS)
    return site


def _config(root: Path, max_upper: float = 0.5) -> Path:
    data = root / "notes"
    data.mkdir(exist_ok=True)
    for i in range(2):  # two files -> two work shards -> the process pool runs both
        (data / f"part{i}.lines").write_text("\n".join(NOTES) + "\n")
    cfg = root / "plugin.yaml"
    cfg.write_text(
        json.dumps(
            {
                "inherit": [str(ROOT / "configs/roberta-tiny.yaml")],
                "run": {"output_dir": str(root / "out")},
                "data": {
                    "sources": [{"name": "notes", "format": "lines", "paths": [str(data / "*.lines")]}],
                    "clean": {
                        "workers": 2,
                        "progress": False,
                        "filters": ["unicode", {"name": "shouting", "params": {"max_upper_frac": max_upper}}],
                    },
                },
            }
        )
    )
    return cfg


def _cli(site: Path, *args: str) -> subprocess.CompletedProcess:
    env = {"PYTHONPATH": f"{ROOT}:{site}", "PATH": "/usr/bin:/bin"}
    return subprocess.run(
        [sys.executable, "-m", "data_pipeline", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_entry_point_filter_and_reader_through_the_cli(tmp_path):
    site = _install_plugin(tmp_path)
    cfg = _config(tmp_path)
    # What a Slurm array task runs: one shard by index.
    one = _cli(site, "clean", "--config", str(cfg), "--shard-index", "1")
    assert one.returncode == 0, one.stderr[-3000:]
    res = _cli(site, "clean", "--config", str(cfg))  # the process pool (workers=2) does the other shard
    assert res.returncode == 0, res.stderr[-3000:]
    stats = json.loads((tmp_path / "out/clean/stats.json").read_text())
    assert stats["complete"] and stats["per_source"]["notes"]["read"] == 8
    assert (
        stats["dropped_by_reason"] == {"shouting:too_loud": 4} and stats["per_source"]["notes"]["kept"] == 4
    )
    steps = stats["source_settings"]["notes"]["filters"]
    assert [s["name"] for s in steps] == ["unicode", "shouting"] and steps[1]["settings"] == {
        "max_upper_frac": 0.5
    }
    sample = json.loads(
        (tmp_path / "out/clean/dropped/notes/shouting__too_loud.jsonl").read_text().splitlines()[0]
    )
    assert sample["value"] > 0.5 and sample["source"] == "notes"

    # Changed filter code (a new release of the plugin) redoes the shards, saying why.
    plugin = site / "lmstack_example_plugin" / "__init__.py"
    plugin.write_text(plugin.read_text().replace("round(frac, 3)", "round(frac, 2)"))
    again = _cli(site, "clean", "--config", str(cfg))
    assert again.returncode == 0, again.stderr[-3000:]
    assert "clean: redoing 2 finished shard(s) of notes: filter code changed: shouting" in again.stderr

    # Changed settings: the same, naming the key.
    cfg2 = _config(tmp_path, max_upper=0.9)
    third = _cli(site, "clean", "--config", str(cfg2))
    assert (
        "redoing 2 finished shard(s) of notes: settings changed: filters.1.params.max_upper_frac"
        in third.stderr
    )
    # Nothing changed: nothing redone.
    fourth = _cli(site, "clean", "--config", str(cfg2))
    assert fourth.returncode == 0 and "redoing" not in fourth.stderr


def test_unknown_plugin_names_list_what_is_registered(tmp_path):
    cfg = _config(tmp_path)
    with pytest.raises(Exception, match=r"unknown format 'lines'; known: \[[^]]*'hf_dataset', 'jsonl'"):
        load_config(cfg)  # the plugin package is not installed in this process


VERSE = """Shall I compare thee to a winter night
Whose frost lies silver on the sleeping lane
The lanterns flicker and the stars are bright
And morning brings the softly falling rain"""
REVIEWS = [
    "Great phone, battery lasts two days.",
    "Terrible service, would not recommend.",
    "Arrived on time and works as described.",
]


def _mixed_sources(tmp: Path, *overrides: str):
    verse, reviews, web = tmp / "verse", tmp / "reviews", tmp / "web"
    for d in (verse, reviews, web):
        d.mkdir(parents=True)
    for i in range(3):
        (verse / f"poem{i}.txt").write_text("\n\n".join([VERSE] * 3))
    (reviews / "r.jsonl").write_text("".join(json.dumps({"text": r}) + "\n" for r in REVIEWS))
    src = BBC / "business"
    for f in sorted(src.glob("*.txt"))[:3]:
        (web / f.name).write_bytes(f.read_bytes())
    (tmp / "c.yaml").write_text(
        json.dumps(
            {
                "inherit": [str(ROOT / "configs/roberta-tiny.yaml")],
                "run": {"output_dir": str(tmp / "out")},
                "data": {
                    "sources": [
                        {"name": "verse", "format": "text", "paths": [str(verse / "*.txt")]},
                        {"name": "reviews", "format": "jsonl", "paths": [str(reviews / "r.jsonl")]},
                        {"name": "news", "format": "text", "paths": [str(web / "*.txt")]},
                    ],
                    "clean": {"workers": 1, "progress": False},
                },
            }
        )
    )
    return load_config(tmp / "c.yaml", list(overrides))


def test_per_source_presets_keep_verse_and_reviews(tmp_path):
    web = run_clean(_mixed_sources(tmp_path / "a"))
    stats = json.loads((tmp_path / "a/out/clean/stats.json").read_text())["per_source"]
    assert stats["verse"]["kept"] == 0 and stats["reviews"]["kept"] == 0 and stats["news"]["kept"] == 3
    assert web["totals"]["kept"] == 3

    cfg = _mixed_sources(
        tmp_path / "b",
        "data.sources.0.clean_preset=curated",
        "data.sources.1.clean_preset=curated",
        "data.sources.1.clean={min_chars: 20}",
    )
    run_clean(cfg)
    stats = json.loads((tmp_path / "b/out/clean/stats.json").read_text())
    per = stats["per_source"]
    assert per["verse"]["kept"] == 3 and per["reviews"]["kept"] == 3 and per["news"]["kept"] == 3
    verse_text = json.loads(
        __import__("zstandard")
        .ZstdDecompressor()
        .decompress(
            (tmp_path / "b/out/clean/verse/shard-00000.jsonl.zst").read_bytes(), max_output_size=1 << 24
        )
        .decode()
        .splitlines()[0]
    )["text"]
    # lines without terminal punctuation kept
    assert "Whose frost lies silver on the sleeping lane" in verse_text
    settings = stats["source_settings"]
    assert settings["verse"]["preset"] == "curated" and settings["news"]["preset"] == "web"
    # unicode repair and PII redaction; the URL filter has no blocklist here, so it does not count as running
    assert [f["name"] for f in settings["verse"]["filters"] if f["enabled"]] == ["unicode", "pii"]
    assert settings["reviews"]["min_chars"] == 20
    table = (tmp_path / "b/out/clean/stats.txt").read_text()
    assert (
        "verse          preset curated: unicode, pii" in table
        and 'reviews        preset curated: unicode, pii overrides {"min_chars": 20}' in table
    )

    # Changing one source's settings redoes only that source's shards, and says which key changed.
    again = load_config(
        tmp_path / "b/c.yaml",
        [
            "data.sources.0.clean_preset=curated",
            "data.sources.1.clean_preset=curated",
            "data.sources.1.clean={min_chars: 30}",
        ],
    )
    out = run_clean(again)
    assert out["shards_run"] == 1 and out["shards_redone"] == {"reviews: settings changed: min_chars": 1}


def test_per_source_keys_are_validated_by_name(tmp_path):
    with pytest.raises(Exception, match=r"data.sources.0.clean.c4.min_sentences: Extra inputs"):
        _mixed_sources(tmp_path, "data.sources.0.clean={c4: {min_sentences: 2}}")
    with pytest.raises(Exception, match=r"data.sources.0.clean: \['workers'\] apply to the whole stage"):
        _mixed_sources(tmp_path / "x", "data.sources.0.clean={workers: 3}")
