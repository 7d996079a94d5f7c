"""Train the run's tokenizer from the cleaned corpus and save it as a folder `AutoTokenizer` loads.

Four conventions (CONVENTIONS), each with the special tokens, post-processing and HF class its model expects:
- roberta (byte-level BPE): `<s> <pad> </s> <unk> <mask>` = ids 0..4, `<s> A </s></s> B </s>`.
- gpt2 (byte-level BPE): `<|endoftext|>` = id 0 as bos/eos/unk and pad, left padding (batched generation), no
  specials added (EOS goes between documents at packing time).
- bert (WordPiece): `[PAD] [UNK] [CLS] [SEP] [MASK]` = ids 0..4, `[CLS] A [SEP] B [SEP]`, optional lower-casing.
- t5 (SentencePiece Unigram): `<pad>`=0 `</s>`=1 `<unk>`=2, `<extra_id_0..99>` as the last 100 ids, `A </s>`; byte
  fallback by default (a character outside the vocabulary becomes its UTF-8 bytes, never `<unk>`).

The saved folder loads with transformers 4.40 and newer, 5.x included (SUPPORTED_TRANSFORMERS): its
`tokenizer_config.json` names a class both know (`RobertaTokenizer`, `GPT2Tokenizer`, `BertTokenizer`: 4.x loads
their `*Fast` variant, 5.x its tokenizers-backed class; T5: the generic `PreTrainedTokenizerFast`, which keeps byte
fallback in 5.x) and lists extra special tokens under the key both read. After training, the `<unk>` rate on a sample of the corpus is reported in
`training_meta.json` and training fails above `tokenizer.max_unk_rate` (byte-level BPE: checked on the vocabulary,
which must hold all 256 bytes).

BPE and WordPiece use the `tokenizers` trainers. Unigram uses the `sentencepiece` trainer: it is the
implementation T5's vocabulary came from (same EM + pruning, nmt_nfkc normalisation whose compiled charsmap we
carry over verbatim), multi-threaded, and it bounds memory by sampling `input_sentence_size` paragraphs, whereas
the `tokenizers` Unigram trainer keeps every distinct word of the whole stream in memory. The trained model is
converted to a `tokenizers` Unigram (the same steps as transformers' T5Converter) so the fast path encodes
identically (checked in tests against the sentencepiece processor).

Modules: conventions.py (the conventions and their registry), trainers.py (BPE, WordPiece, Unigram and
`train_tokenizer`), saving.py (the portable folder), pairs.py (a separator between a pair's two texts), checks.py
(the `<unk>` rate), corpus.py (the texts trained on).
"""

from data_pipeline.tokenizers.checks import unk_rate
from data_pipeline.tokenizers.conventions import (
    BPE_SPECIALS,
    CONVENTIONS,
    EOT,
    NUM_SENTINELS,
    SUPPORTED_TRANSFORMERS,
    T5_SPECIALS,
    WORDPIECE_SPECIALS,
    Convention,
    convention_name,
    describe,
    register_convention,
)
from data_pipeline.tokenizers.pairs import frame_pairs, pair_frame
from data_pipeline.tokenizers.saving import load_tokenizer, make_portable, remove_staging, save_tokenizer
from data_pipeline.tokenizers.trainers import (
    bpe_tokenizer,
    spm_to_tokenizer,
    train_spm_unigram,
    train_tokenizer,
)

__all__ = [
    "BPE_SPECIALS",
    "CONVENTIONS",
    "EOT",
    "NUM_SENTINELS",
    "SUPPORTED_TRANSFORMERS",
    "T5_SPECIALS",
    "WORDPIECE_SPECIALS",
    "Convention",
    "bpe_tokenizer",
    "convention_name",
    "describe",
    "frame_pairs",
    "load_tokenizer",
    "make_portable",
    "pair_frame",
    "register_convention",
    "remove_staging",
    "save_tokenizer",
    "spm_to_tokenizer",
    "train_spm_unigram",
    "train_tokenizer",
    "unk_rate",
]
