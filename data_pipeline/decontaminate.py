"""N-gram decontamination: a crawl document that shares one n-gram (13 by default, GPT-3's and the Pile's choice)
of normalised words with an evaluation text is dropped, and its drop names the n-gram and the evaluation example.

The evaluation text is the dev and test text of every configured fine-tune task (`finetune.tasks`, read as the
fine-tune stage reads it) plus the files in `data.decontaminate.sources`. Words are normalised as datatrove's
`simplify_text` does (lowercase, numbers -> 0, punctuation -> space, diacritics stripped) and split on whitespace
(datatrove then runs its word tokenizer, which finds little more to split once punctuation is gone).

The index holds one 64-bit hash per evaluation n-gram (a polynomial over per-word hashes, computed for a whole
document in a few numpy operations), sorted for binary search; a hash hit is confirmed word by word against the
example, so a reported n-gram is always a real one. It is built once per process from the config (the local pool's
workers inherit the driver's), so every executor (local, Ray, Slurm array tasks) builds the same one; the clean
stage's fingerprint carries a hash of the evaluation text, so a changed evaluation set redoes the shards.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import json
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.document import Document
from core.io import fingerprint
from core.paths import expand_placeholders
from core.plugin_code import code_version
from data_pipeline.filters.text_utils import PUNCTUATION

_TO_SPACE = str.maketrans(PUNCTUATION, " " * len(PUNCTUATION))
_NUMBER = re.compile(
    r"\d+(?:[.,\u060c\u066b\u2396\u2397\u2398]\d+)?"
)  # a number in any script, one decimal part
_P = np.uint64(1099511628211)  # FNV-64 prime: the polynomial's base
_MASK = (1 << 64) - 1


def normalise_words(text: str) -> list[str]:
    """datatrove's simplify_text (default TextNormConfig: lowercase, numbers -> 0, punctuation -> space,
    diacritics stripped), split into words."""
    text = _NUMBER.sub("0", text.lower()).translate(_TO_SPACE)
    if not text.isascii():
        text = "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")
    return text.split()


def ngram_hashes(words: list[str], n: int) -> np.ndarray:
    """One uint64 per n-gram of `words` (position i: words[i:i+n]); within a process, equal n-grams hash equal."""
    count = len(words) - n + 1
    if count <= 0:
        return np.zeros(0, dtype=np.uint64)
    ids = np.fromiter((hash(w) & _MASK for w in words), dtype=np.uint64, count=len(words))
    h = np.zeros(count, dtype=np.uint64)
    for k in range(n):
        h = h * _P + ids[k : k + count]
    return h


@dataclass(frozen=True)
class EvalExample:
    eval_set: str  # "<task>/dev", "<task>/test" or the file's name
    id: str
    text: str


def _jsonl(fh, name: str, field: str) -> list[EvalExample]:
    out = []
    for i, line in enumerate(fh):
        if line.strip():
            row = json.loads(line)
            out.append(EvalExample(name, str(row.get("id", f"{name}:{i}")), str(row[field])))
    return out


def _delimited(fh, name: str, field: str, delimiter: str) -> list[EvalExample]:
    reader = csv.DictReader(fh, delimiter=delimiter)
    return [
        EvalExample(name, str(r.get("id") or f"{name}:{i}"), r[field] or "") for i, r in enumerate(reader)
    ]


def _lines(fh, name: str, field: str) -> list[EvalExample]:
    return [EvalExample(name, f"{name}:{i + 1}", line) for i, line in enumerate(fh) if line.strip()]


# One reader per evaluation-file format (data.decontaminate.sources.<i>.format, resolved at load).
_EVAL_READERS = {
    "jsonl": _jsonl,
    "csv": lambda fh, n, f: _delimited(fh, n, f, ","),
    "tsv": lambda fh, n, f: _delimited(fh, n, f, "\t"),
    "text": _lines,
}


def _read_file(spec: Any) -> list[EvalExample]:
    path = Path(expand_placeholders(spec.path))
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8-sig", errors="replace", newline="") as fh:
        return _EVAL_READERS[spec.format](fh, path.name, spec.text_field)


def eval_examples(cfg) -> list[EvalExample]:
    """Every evaluation text the run keeps out of pretraining, in a fixed order."""
    from data_pipeline.labelled import load_task

    dec = cfg.data.decontaminate
    out: list[EvalExample] = []
    if dec.tasks:
        for i, task in enumerate(cfg.finetune.tasks):
            data = load_task(cfg, i)
            for split in ("dev", "test"):
                out += [EvalExample(f"{task.name}/{split}", r[0], r[1]) for r in getattr(data, split)]
    for spec in dec.sources:
        out += _read_file(spec)
    return out


class NGramIndex:
    def __init__(self, examples: list[EvalExample], n: int):
        self.n = n
        self.examples = examples
        self.words = [normalise_words(e.text) for e in examples]
        parts = [ngram_hashes(w, n) for w in self.words]
        empty = np.zeros(0, dtype=np.int32)
        hashes = np.concatenate([np.zeros(0, dtype=np.uint64), *parts])
        owner = np.concatenate([empty, *(np.full(len(p), i, dtype=np.int32) for i, p in enumerate(parts))])
        pos = np.concatenate([empty, *(np.arange(len(p), dtype=np.int32) for p in parts)])
        order = np.argsort(hashes, kind="stable")
        self.hashes, self.owner, self.pos = hashes[order], owner[order], pos[order]

    def __len__(self) -> int:
        return len(self.hashes)

    def match(self, words: list[str]) -> tuple[int, int] | None:
        """(position in `words`, example index) of the first n-gram shared with an evaluation text."""
        if not len(self.hashes):
            return None
        q = ngram_hashes(words, self.n)
        if not len(q):
            return None
        at = np.searchsorted(self.hashes, q)
        at[at == len(self.hashes)] = 0
        for i in np.flatnonzero(self.hashes[at] == q):
            j = int(at[i])
            gram = words[i : i + self.n]
            while j < len(self.hashes) and self.hashes[j] == q[i]:  # confirm word by word (hash collisions)
                ex, p = int(self.owner[j]), int(self.pos[j])
                if self.words[ex][p : p + self.n] == gram:
                    return int(i), ex
                j += 1
        return None


_CACHE: dict[str, tuple[str, NGramIndex]] = {}


def _cache_key(cfg) -> str:
    """What the evaluation set is read from (settings, tasks, their sources, file dates): a changed file rereads."""
    dec = cfg.data.decontaminate
    files = [expand_placeholders(s.path) for s in dec.sources]
    if dec.tasks:
        for t in cfg.finetune.tasks:
            files += [expand_placeholders(p) for p in (t.train, t.dev, t.test, t.dataset) if p]
    stamps = [
        (f, p.stat().st_mtime_ns, p.stat().st_size) if (p := Path(f)).exists() else (f, 0, 0) for f in files
    ]
    used = {t.source for t in cfg.finetune.tasks} if dec.tasks else set()
    return fingerprint(
        {
            "decontaminate": dec.model_dump(mode="json"),
            "tasks": cfg.finetune.model_dump(mode="json")["tasks"] if dec.tasks else [],
            "repair": [cfg.finetune.repair_text, cfg.data.clean.unicode.model_dump(mode="json")],
            "sources": [s.model_dump(mode="json") for s in cfg.data.sources if s.name in used],
            "seed": cfg.run.seed,
            "files": stamps,
        }
    )


def eval_index(cfg) -> tuple[str, NGramIndex]:
    """(sha256 of the evaluation set, its index), built once per process per evaluation set."""
    key = _cache_key(cfg)
    if key not in _CACHE:
        examples = eval_examples(cfg)
        sha = hashlib.sha256()
        for e in examples:
            sha.update(f"{e.eval_set}\0{e.id}\0{e.text}\0".encode())
        _CACHE.clear()
        _CACHE[key] = (sha.hexdigest(), NGramIndex(examples, cfg.data.decontaminate.n))
    return _CACHE[key]


def fingerprint_part(cfg) -> dict[str, Any]:
    """What decontaminated shards depend on: n, the evaluation text's hash and this module's code."""
    dec = cfg.data.decontaminate
    if not dec.enabled:
        return {}
    sha, index = eval_index(cfg)
    if not len(index):
        return {}
    return {"n": dec.n, "eval_sha256": sha, "code": code_version(DecontaminationFilter)}


class DecontaminationFilter:
    name = "decontaminate"

    def __init__(self, index: NGramIndex):
        self.index = index

    def __call__(self, doc: Document) -> tuple[bool, None] | tuple[bool, str, dict[str, str]]:
        words = normalise_words(doc.text)
        hit = self.index.match(words)
        if hit is None:
            return True, None
        pos, ex = hit
        e = self.index.examples[ex]
        return (
            False,
            "decontaminated",
            {
                "ngram": " ".join(words[pos : pos + self.index.n]),
                "eval_set": e.eval_set,
                "eval_id": e.id,
            },
        )


def summary(cfg) -> dict[str, Any]:
    """For the clean report: n, the evaluation sets with their example counts, the index size."""
    if not cfg.data.decontaminate.enabled:
        return {"enabled": False}
    sha, index = eval_index(cfg)
    sets: dict[str, int] = {}
    for e in index.examples:
        sets[e.eval_set] = sets.get(e.eval_set, 0) + 1
    return {"enabled": True, "n": index.n, "eval_sets": sets, "ngrams": len(index), "eval_sha256": sha}


def decontamination_filter(cfg) -> DecontaminationFilter | None:
    """The filter for this run, or None when it is off or there is no evaluation text."""
    if not cfg.data.decontaminate.enabled:
        return None
    _, index = eval_index(cfg)
    return DecontaminationFilter(index) if len(index) else None
