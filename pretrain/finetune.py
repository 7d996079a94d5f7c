"""A downstream smoke fine-tune: sequence classification on labelled text, from an export or from scratch.

The labelled data is a data source's hold-out split (documents the pretraining never saw), a folder with one
sub-folder per label, or a CSV with `text,label` columns. The same split, seed and schedule serve both the
pretrained and the random-initialisation model, so their accuracies are comparable.
"""

from __future__ import annotations

import csv
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm
from transformers import (
    AutoConfig,
    AutoModelForSeq2SeqLM,
    AutoModelForSequenceClassification,
    AutoTokenizer,
)

from data_pipeline.document import in_holdout
from runconfig import RunConfig


def load_labelled(cfg: RunConfig) -> list[tuple[str, str, str]]:
    """(id, text, label) rows, sorted by id for a deterministic split."""
    ft = cfg.finetune
    rows: list[tuple[str, str, str]] = []
    if ft.source is not None:
        from data_pipeline.readers import read_source

        src = next(s for s in cfg.data.sources if s.name == ft.source)
        if src.holdout_fraction <= 0:
            raise ValueError(f"finetune.source '{src.name}' has no hold-out (data.sources[].holdout_fraction is 0)")
        for doc in read_source(src):
            if in_holdout(doc.id, src.holdout_fraction, cfg.run.seed) and doc.meta.get("label") is not None:
                rows.append((doc.id, doc.text, str(doc.meta["label"])))
    elif ft.path is not None:
        p = Path(ft.path)
        if p.is_dir():
            for f in sorted(p.glob("*/*")):
                if f.is_file():
                    rows.append((str(f.relative_to(p)), f.read_text(errors="replace"), f.parent.name))
        elif p.suffix == ".csv":
            with open(p, newline="") as fh:
                for i, r in enumerate(csv.DictReader(fh)):
                    if "text" not in r or "label" not in r:
                        raise ValueError(f"{p}: CSV needs 'text' and 'label' columns, got {list(r)}")
                    rows.append((f"{p.name}:{i}", r["text"], r["label"]))
        else:
            raise ValueError(f"finetune.path: {p} is neither a folder nor a .csv file")
    else:
        raise ValueError("finetune: set finetune.source (a data source with a hold-out) or finetune.path")
    if not rows:
        raise ValueError("finetune: no labelled examples found")
    return sorted(rows)


def split(rows: list[tuple[str, str, str]], test_fraction: float, seed: int):
    def is_test(doc_id: str) -> bool:
        h = hashlib.blake2b(f"ft{seed}:{doc_id}".encode(), digest_size=8).digest()
        return int.from_bytes(h, "big") / 2**64 < test_fraction

    train = [r for r in rows if not is_test(r[0])]
    test = [r for r in rows if is_test(r[0])]
    return train, test


def _chunks(rows, bs, shuffle_rng=None):
    order = np.arange(len(rows))
    if shuffle_rng is not None:
        shuffle_rng.shuffle(order)
    for i in range(0, len(order), bs):
        yield [rows[j] for j in order[i : i + bs]]


def _batches(tok, rows, labels, bs, max_len, shuffle_rng=None):
    for chunk in _chunks(rows, bs, shuffle_rng):
        enc = tok([r[1] for r in chunk], truncation=True, max_length=max_len, padding=True, return_tensors="pt")
        enc.pop("token_type_ids", None)
        enc["labels"] = torch.tensor([labels[r[2]] for r in chunk])
        yield enc


def _t2t_batches(tok, rows, labels, bs, max_len, shuffle_rng=None):
    """T5 text-to-text: "<task prefix>: text" -> label string; pad positions of the target are ignored (-100)."""
    for chunk in _chunks(rows, bs, shuffle_rng):
        enc = tok([f"classify: {r[1]}" for r in chunk], truncation=True, max_length=max_len, padding=True,
                  return_tensors="pt")
        tgt = tok([r[2] for r in chunk], padding=True, return_tensors="pt")["input_ids"]
        enc["labels"] = torch.where(tgt == tok.pad_token_id, -100, tgt)
        yield dict(enc)


def finetune(cfg: RunConfig, model_dir: str | Path, init: str = "pretrained", out_dir: str | Path | None = None,
             progress: bool = True) -> dict[str, Any]:
    """Train a classifier head (and the body) from `model_dir` ('pretrained') or from its config ('random')."""
    ft = cfg.finetune
    t0 = time.time()
    rows = load_labelled(cfg)
    train_rows, test_rows = split(rows, ft.test_fraction, ft.seed)
    names = sorted({r[2] for r in rows})
    labels = {n: i for i, n in enumerate(names)}
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    torch.manual_seed(ft.seed)
    kwargs = {"num_labels": len(names), "id2label": dict(enumerate(names)), "label2id": labels}
    text_to_text = AutoConfig.from_pretrained(str(model_dir)).model_type == "t5"
    model_cls = AutoModelForSeq2SeqLM if text_to_text else AutoModelForSequenceClassification
    if text_to_text:  # T5 fine-tunes text-to-text: the label is the target string (Raffel et al. 2020)
        kwargs = {}
    if init == "pretrained":
        model = model_cls.from_pretrained(str(model_dir), **kwargs)
    elif init == "random":
        model = model_cls.from_config(AutoConfig.from_pretrained(str(model_dir), **kwargs))
    else:
        raise ValueError(f"init must be 'pretrained' or 'random', got {init!r}")
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tok.pad_token_id
    batches = _t2t_batches if text_to_text else _batches
    opt = torch.optim.AdamW(model.parameters(), lr=ft.lr, weight_decay=0.01)
    steps = ft.epochs * -(-len(train_rows) // ft.batch_size)
    warm = max(1, steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min((s + 1) / warm, max(0.0, (steps - s) / (steps - warm))))
    rng = np.random.default_rng(ft.seed)
    bar = tqdm(total=steps, desc=f"finetune ({init})", disable=not progress, unit="step")
    model.train()
    for _ in range(ft.epochs):
        for batch in batches(tok, train_rows, labels, ft.batch_size, ft.max_length, rng):
            loss = model(**batch).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
            bar.update(1)
            bar.set_postfix(loss=f"{loss.item():.3f}")
    bar.close()
    model.eval()
    correct = 0
    with torch.no_grad():
        for batch in batches(tok, test_rows, labels, 64, ft.max_length):
            y = batch.pop("labels")
            if text_to_text:
                out = model.generate(**batch, max_new_tokens=8, do_sample=False)
                pred = [p.strip() for p in tok.batch_decode(out, skip_special_tokens=True)]
                gold = [g.strip() for g in tok.batch_decode(torch.where(y < 0, tok.pad_token_id, y),
                                                             skip_special_tokens=True)]
                correct += sum(p == g for p, g in zip(pred, gold, strict=True))
            else:
                correct += int((model(**batch).logits.argmax(-1) == y).sum())
    result = {
        "init": init,
        "accuracy": correct / len(test_rows),
        "train_examples": len(train_rows),
        "test_examples": len(test_rows),
        "labels": names,
        "seconds": round(time.time() - t0, 1),
    }
    if out_dir is not None:
        out = Path(out_dir) / init
        out.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(out, safe_serialization=True)
        tok.save_pretrained(out)
        (out / "result.json").write_text(json.dumps(result, indent=1))
    return result
