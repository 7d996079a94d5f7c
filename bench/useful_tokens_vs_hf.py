"""Useful (non-pad) training tokens per second: our packed pipeline vs run_mlm.py `--line_by_line` on the HF Trainer.

Text: the BBC News corpus through our data stages (clean -> dedup -> BPE 8000 -> tokenize) in a temporary run.
Ours: FULL-SENTENCES packed blocks of seq_len tokens (the product default `packing.sentence_break`), our MLM collator,
our trainer. Peer: transformers' examples/pytorch/language-modeling/run_mlm.py with `--line_by_line` and its default
`--pad_to_max_length False`: the same deduplicated documents written to a text file, `load_dataset("text")` (one
sample per non-empty line, i.e. per paragraph), `tokenizer(truncation=True, max_length=seq_len, padding=False,
return_special_tokens_mask=True)`, `DataCollatorForLanguageModeling` padding each batch to its longest sample (no
pad_to_multiple_of: fp32), trained by the HF `Trainer`. pad_to_max_length=True would pad every sample to seq_len and
only lower the peer's useful rate (same step time as ours, more padding), so the default is the stronger baseline.

Same model (RoBERTa hidden 256, 4 layers), same tokenizer, 2 CPU ranks, the same per-device batch on both sides:
micro-batch 8 (run_mlm's default `per_device_train_batch_size`), global batch 16, DeepSpeed ZeRO-2 from our
`build_ds_config`. Timed: steady-state steps WARMUP+1..WARMUP+MEASURE; useful tokens are attention-mask sums of
every micro-batch, summed over ranks, on both sides (the peer also reports the token slots it computed on, padding
included). `--rounds` alternating rounds (ours, HF, ...; default 5), VERDICT on the median of the per-round ratios.

`python bench/useful_tokens_vs_hf.py [--seq-len 128|512] [--rounds 5]`  (about 9 minutes here at 128; 512 is
four times the work per step and is run on request)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _common as C  # noqa: E402

MICRO = 8  # run_mlm.py's default per_device_train_batch_size, on both sides


def steps(seq: int) -> tuple[int, int]:
    """(warm-up, measured) steps: the same ~25k token slots measured at either length."""
    return (3, 12) if seq <= 128 else (2, 4)


def micro_batch(seq: int) -> int:
    return MICRO


def overrides(seq: int) -> list[str]:
    WARMUP, MEASURE = steps(seq)
    total, mb = WARMUP + MEASURE, micro_batch(seq)
    return [
        "model.hidden_size=256",
        "model.num_layers=4",
        "model.num_heads=4",
        "model.ffn_size=1024",
        f"batch.micro_batch_size={mb}",
        f"batch.global_batch_size={2 * mb}",
        f"schedule.total_steps={total}",
        f"schedule.warmup_steps={WARMUP}",
        f"eval.every_steps={total}",
        "eval.max_batches=1",
        f"checkpoint.every_steps={total}",
        "logging.peak_flops=1.0e+10",
    ]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seq-len", type=int, default=128, choices=[128, 512])
    a = ap.parse_args()
    rep = C.Report(__file__)
    t_start = time.perf_counter()
    seq = a.seq_len
    WARMUP, MEASURE = steps(seq)
    ov = overrides(seq)
    slots_per_step = 2 * micro_batch(seq) * seq
    extra = f"tokenizer: {{vocab_size: 8000}}\npacking: {{seq_len: {seq}}}\nmodel: {{max_position_embeddings: {seq + 2}}}\n"
    with tempfile.TemporaryDirectory(prefix="bench-useful-") as d:
        tmp = Path(d)
        t0 = time.perf_counter()
        cfg_path = C.prepare_run(tmp / "data", "roberta", extra)
        corpus = C.write_corpus_lines(cfg_path, tmp / "corpus.txt")
        lines = sum(1 for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip())
        print(f"data stages on BBC: {time.perf_counter() - t0:.0f}s")
        rep.line(
            f"seq_len {seq}, micro-batch {micro_batch(seq)} on both sides, 2 ranks, {MEASURE} steps after "
            f"{WARMUP}; run_mlm text file: {lines} non-empty lines"
        )

        def ours() -> float:
            o = C.run_ours(cfg_path, tmp / "work", ov, WARMUP)
            print(
                f"  ours (packed): {o['tokens_per_s']:.0f} useful tokens/s, {o['tokens'] / MEASURE:.0f} useful "
                f"tokens/step ({o['tokens'] / (MEASURE * slots_per_step):.1%} of {slots_per_step} slots)",
                flush=True,
            )
            return o["tokens_per_s"]

        def hf() -> float:
            h = C.run_hf(cfg_path, tmp / "work", ov, WARMUP, "line_by_line", corpus=corpus)
            print(
                f"  HF line_by_line: {h['tokens_per_s']:.0f} useful tokens/s, {h['tokens'] / MEASURE:.0f} useful "
                f"tokens/step of {h['slots'] / MEASURE:.0f} computed ({h['tokens'] / h['slots']:.1%} useful; "
                f"{h['engine']}, world {h['world_size']})",
                flush=True,
            )
            return h["tokens_per_s"]

        o, p = C.alternate(ours, hf, a.rounds)
    rep.compare(
        f"useful_tokens_per_s_vs_hf_line_by_line_seq{seq}",
        o,
        p,
        1.5,
        unit="useful tokens/s, summed over ranks",
    )
    print(f"total bench time {time.perf_counter() - t_start:.0f}s")
    return rep.finish()


if __name__ == "__main__":
    raise SystemExit(main())
