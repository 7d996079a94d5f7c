"""Useful (non-pad) training tokens per second: our packed pipeline vs run_mlm.py `--line_by_line` on the HF Trainer.

Text: the BBC News corpus through our data stages (clean -> dedup -> BPE 8000 -> tokenize) in a temporary run.
Ours: FULL-SENTENCES packed blocks of seq_len tokens (the product default `packing.sentence_break`), our MLM collator,
our trainer. Peer: transformers' examples/pytorch/language-modeling/run_mlm.py with `--line_by_line` and its default
`--pad_to_max_length False`: the same deduplicated documents written to a text file, `load_dataset("text")` (one
sample per non-empty line, i.e. per paragraph), `tokenizer(truncation=True, max_length=seq_len, padding=False,
return_special_tokens_mask=True)`, `DataCollatorForLanguageModeling` padding each batch to its longest sample (no
pad_to_multiple_of: fp32), trained by the HF `Trainer`. pad_to_max_length=True would pad every sample to seq_len and
only lower the peer's useful rate (same step time as ours, more padding), so the default is the stronger baseline.

Same model (RoBERTa hidden 256, 4 layers), same tokenizer, 2 CPU ranks, 1,024 token slots per micro-batch (micro-
batch 8 at seq_len 128, 2 at 512; global batch 2 x micro), DeepSpeed ZeRO-2 from our `build_ds_config` on both
sides. Timed: steady-state steps WARMUP+1..WARMUP+MEASURE; useful tokens are attention-mask sums of every
micro-batch, summed over ranks (the peer also reports the token slots it computed on, padding included). Runs
alternate ours/HF (A B A B ...); medians reported.

`python bench/useful_tokens_vs_hf.py [--seq-len 128|512] [--rounds 3]`  (about 5-6 minutes here per seq_len)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

WARMUP, MEASURE = 3, 12


def micro_batch(seq: int) -> int:
    return max(1, 8 * 128 // seq)  # 1,024 token slots per micro-batch: 8 x 128, 2 x 512


def overrides(seq: int) -> list[str]:
    total, mb = WARMUP + MEASURE, micro_batch(seq)
    return ["model.hidden_size=256", "model.num_layers=4", "model.num_heads=4", "model.ffn_size=1024",
            f"batch.micro_batch_size={mb}", f"batch.global_batch_size={2 * mb}", f"schedule.total_steps={total}",
            f"schedule.warmup_steps={WARMUP}", f"eval.every_steps={total}", "eval.max_batches=1",
            f"checkpoint.every_steps={total}", "logging.peak_flops=1.0e+10"]  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seq-len", type=int, default=128, choices=[128, 512])
    a = ap.parse_args()
    t_start = time.perf_counter()
    seq = a.seq_len
    ov = overrides(seq)
    slots_per_step = 2 * micro_batch(seq) * seq
    extra = f"tokenizer: {{vocab_size: 8000}}\npacking: {{seq_len: {seq}}}\nmodel: {{max_position_embeddings: {seq + 2}}}\n"
    with tempfile.TemporaryDirectory(prefix="bench-useful-") as d:
        tmp = Path(d)
        t0 = time.perf_counter()
        cfg_path = C.prepare_run(tmp / "data", "roberta", extra)
        corpus = C.write_corpus_lines(cfg_path, tmp / "corpus.txt")
        lines = sum(1 for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip())
        print(f"data stages on BBC: {time.perf_counter() - t0:.0f}s; run_mlm text file: {lines} non-empty lines")
        ours, hf = [], []
        for r in range(a.rounds):
            o = C.run_ours(cfg_path, tmp / "work", ov, WARMUP)
            ours.append(o)
            o_fill = o["tokens"] / (MEASURE * slots_per_step)
            print(f"round {r + 1} ours (packed): {o['tokens_per_s']:.0f} useful tokens/s, "
                  f"{o['tokens'] / MEASURE:.0f} useful tokens/step ({o_fill:.1%} of {slots_per_step} slots)")  # fmt: skip
            h = C.run_hf(cfg_path, tmp / "work", ov, WARMUP, "line_by_line", corpus=corpus)
            hf.append(h)
            print(f"round {r + 1} HF line_by_line: {h['tokens_per_s']:.0f} useful tokens/s, "
                  f"{h['tokens'] / MEASURE:.0f} useful tokens/step of {h['slots'] / MEASURE:.0f} computed "
                  f"({h['tokens'] / h['slots']:.1%} useful; {h['engine']}, world {h['world_size']})")  # fmt: skip
    o_tps = C.median([x["tokens_per_s"] for x in ours])
    h_tps = C.median([x["tokens_per_s"] for x in hf])
    ratio = o_tps / h_tps
    print(f"seq_len {seq}, micro-batch {micro_batch(seq)}, global batch {2 * micro_batch(seq)}; medians of {a.rounds}: ours {o_tps:.0f} useful tokens/s, HF run_mlm line_by_line (pad to longest in "
          f"batch) {h_tps:.0f} useful tokens/s")  # fmt: skip
    print(f"total bench time {time.perf_counter() - t_start:.0f}s")
    print(f"VERDICT useful_tokens_per_s_vs_hf_line_by_line_seq{seq}: ours={o_tps:.0f} peer={h_tps:.0f} ratio={ratio:.2f} "
          f"goal=1.5 {'pass' if ratio >= 1.5 else 'fail'}")  # fmt: skip


if __name__ == "__main__":
    main()
