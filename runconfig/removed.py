"""Config keys that were removed, what each was worth, and what to do instead: the one list the loader and the
resume check read.

A key that existed for a benchmark or for tuning rather than for users goes (issue 65, item 7): its value becomes
an internal default or a setting of the benchmark that used it. Old configs keep loading: a resolved config
(`resolved_config.yaml`, a checkpoint's COMPLETE) names every key it had, so a removed key holding its former
default means nothing changed and is dropped without a word. Any other value was a choice the product no longer
offers, and the load stops naming the key and what to do instead, before any work starts. The resume check
(pretrain/checkpoint/resume_diff.py) reads the same list, so a checkpoint written before the removal resumes as it did.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class RemovedKey:
    key: str  # dotted, from the top of the run config
    default: Any  # its value before it was removed: what the product does now
    instead: str  # what a user who set it does now


REMOVED_KEYS: dict[str, RemovedKey] = {
    r.key: r
    for r in (
        RemovedKey(
            "objective.static_masking",
            False,
            "the product always masks dynamically (RoBERTa); bench/dynamic_vs_static.py trains its static-masking "
            "run with its own objective, bench/_static_masking.py",
        ),
        RemovedKey(
            "shards.encode_batch_docs",
            256,
            "a shard worker encodes 256 documents per call (data_pipeline/tokenize.py ENCODE_BATCH_DOCS)",
        ),
        RemovedKey(
            "tokenizer.unk_sample_docs",
            500,
            "the <unk> check reads the first 500 documents (data_pipeline/tokenizers/checks.py UNK_SAMPLE_DOCS); "
            "tokenizer.max_unk_rate sets the limit",
        ),
        RemovedKey(
            "tokenizer.unk_sample_tokens",
            100_000,
            "the <unk> check counts up to 100,000 tokens (data_pipeline/tokenizers/checks.py UNK_SAMPLE_TOKENS); "
            "tokenizer.max_unk_rate sets the limit",
        ),
        RemovedKey(
            "eval.probe_max_examples",
            512,
            "the probe reads at most 512 examples per split (pretrain/run/probe_eval.py PROBE_MAX_EXAMPLES); bound its "
            "time with eval.probe_max_seconds",
        ),
        RemovedKey(
            "watchdog.straggler_min_excess_s",
            0.05,
            "the floor is a fixed 0.05 s per step (pretrain/run/watchdog.py STRAGGLER_MIN_EXCESS_S); tune "
            "watchdog.straggler_factor",
        ),
        RemovedKey(
            "finetune.frozen.mix_lr_grid",
            [1e-3, 1e-2, 1e-1],
            "the scalar mix's LR is picked on dev from [0.001, 0.01, 0.1] (adapt/methods/frozen.py MIX_LR_GRID); "
            "delete the key",
        ),
        RemovedKey(
            "checkpoint.async_save",
            True,
            "it is now checkpoint.async_mode (async_save: true -> async_mode: async, false -> disabled)",
        ),
        RemovedKey(
            "checkpoint.async_writer",
            "thread",
            "the writer process is gone (async saves are written by a background thread): drop the key; "
            "checkpoint.async_mode: async|disabled is the one setting",
        ),
        *(
            RemovedKey(
                f"data.clean.pii.{kind}_replacement",
                default,
                "the placeholders are fixed (data_pipeline/formatters/pii.py PLACEHOLDERS); drop the key",
            )
            for kind, default in (
                ("email", "email@example.com"),
                ("ipv4", "192.0.2.1"),
                ("ipv6", "2001:db8::1"),
                ("phone", "555-0100"),
            )
        ),
    )
}


def is_former_default(key: str, value: Any) -> bool:
    """Whether `key` was removed and `value` is what it used to default to (so dropping it changes nothing)."""
    removed = REMOVED_KEYS.get(key)
    return removed is not None and value == removed.default


def drop_removed_keys(data: Any) -> Any:
    """The raw config without the removed keys that hold their former default (the sections on the way copied, the
    caller's dict left as it is); ValueError naming every removed key set to anything else, with what to do
    instead (one rerun fixes them all)."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    refused = []
    for removed in REMOVED_KEYS.values():
        *parents, leaf = removed.key.split(".")
        section = out
        for part in parents:
            child = section.get(part)
            if not isinstance(child, dict):
                break
            section[part] = section = dict(child)
        else:
            if leaf not in section:
                continue
            if section[leaf] == removed.default:
                del section[leaf]
            else:
                refused.append(f"{removed.key} was removed ({section[leaf]!r} given): {removed.instead}")
    if refused:
        raise ValueError("; ".join(refused))
    return out
