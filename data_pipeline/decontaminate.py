"""N-gram decontamination: a crawl document that shares one n-gram (13 by default, GPT-3's and the Pile's choice)
of normalised words with an evaluation text is dropped, and its drop names the n-gram and the evaluation example.

The evaluation text is the dev and test text of every configured fine-tune task (`finetune.tasks`, read as the
fine-tune stage reads it) plus the files in `data.decontaminate.sources`. Words are normalised as datatrove's
`simplify_text` does (lowercase, numbers -> 0, punctuation -> space, diacritics stripped) and split on whitespace
(datatrove then runs its word tokenizer, which finds little more to split once punctuation is gone).

The index holds one 64-bit entry per evaluation n-gram (a polynomial over per-word hashes, computed for a whole
document in a few numpy operations, its low bits replaced by the example's index), sorted for binary search: 8
bytes an n-gram, about 1.5x the evaluation text (a table of words and tuples took 17x). A hash hit is confirmed
word by word against the example, so a reported n-gram is always a real one. Evaluation examples shorter than n
words can never match: they are counted per set, warned about and reported (`short_examples`). An evaluation file
that is empty or is not UTF-8 text is refused, naming it. It is built once per process from the config (the local pool's
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
from core.errors import ConfigError
from core.io import fingerprint
from core.log import get_logger
from core.paths import expand_placeholders
from core.plugin_code import code_version
from data_pipeline.filters.text_utils import PUNCTUATION

log = get_logger(__name__)
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


def _read_file(spec: Any, key: str = "data.decontaminate.sources") -> list[EvalExample]:
    """One evaluation file's examples. Refused (ConfigError naming the key and the file): a file that is not UTF-8
    text (a binary, a latin-1 export: decoding it with replacements would index text the evaluation never had)
    and one that holds no example (empty: it would check nothing and leave no trace in the report)."""
    path = Path(expand_placeholders(spec.path))
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline="") as fh:
            out = _EVAL_READERS[spec.format](fh, path.name, spec.text_field)
    except UnicodeDecodeError:
        raise ConfigError(f"{key}: evaluation file '{spec.path}' is not UTF-8 text") from None
    except (OSError, EOFError) as e:  # a truncated or not-gzip .gz
        raise ConfigError(f"{key}: evaluation file '{spec.path}' cannot be read: {e}") from None
    if any("\0" in e.text for e in out):
        raise ConfigError(f"{key}: evaluation file '{spec.path}' is binary (NUL characters), not text")
    if not out:
        raise ConfigError(
            f"{key}: evaluation file '{spec.path}' holds no evaluation example (it is empty or blank): "
            "it would keep nothing out of pretraining"
        )
    return out


def eval_examples(cfg) -> list[EvalExample]:
    """Every evaluation text the run keeps out of pretraining, in a fixed order."""
    from data_pipeline.labelled import load_task

    dec = cfg.data.decontaminate
    out: list[EvalExample] = []
    if dec.tasks:
        for i, task in enumerate(cfg.finetune.tasks):
            data = load_task(cfg, i)
            for split in ("dev", "test"):
                for ex_id, text, _, second in getattr(data, split):
                    out.append(EvalExample(f"{task.name}/{split}", ex_id, text))
                    if second is not None:  # a pair task's second text (a hypothesis) is evaluation text too
                        out.append(EvalExample(f"{task.name}/{split}", f"{ex_id}#2", second))
    for i, spec in enumerate(dec.sources):
        out += _read_file(spec, f"data.decontaminate.sources.{i}")
    return out


# Words normalised and hashed at a time: a book-length example needs no book-length word list.
_WINDOW = 1 << 16


def _word_windows(text: str, n: int):
    """normalise_words(text) in windows of about _WINDOW words, each after the first starting with the previous
    one's last n-1 words, so the windows' n-grams are exactly the text's. Cut at whitespace, which normalisation
    never joins across."""
    step = _WINDOW * 8  # characters per cut: about _WINDOW words of English
    if len(text) <= step:
        yield normalise_words(text)
        return
    carry: list[str] = []
    start = 0
    while start < len(text):
        end = min(len(text), start + step)
        while end < len(text) and not text[end].isspace():
            end += 1
        words = carry + normalise_words(text[start:end])
        yield words
        carry = words[max(0, len(words) - (n - 1)) :] if n > 1 else []
        start = end


class NGramIndex:
    """The n-grams of the evaluation examples, as one sorted uint64 array: 8 bytes an n-gram (about 1.5x the
    evaluation text, which has about 6 bytes a word), at most twice that while it is built. The top bits of each
    entry are the n-gram's hash, the low `owner_bits` the example's index, so a hit names its example without a
    second array; the example's words are normalised again only on a hit, to confirm it word by word (an equal
    hash is not proof) and to find the position. Decisions are those of a full (hash, example, position) table:
    the first n-gram of a document that some example holds, reported with the first such example."""

    def __init__(self, examples: list[EvalExample], n: int):
        self.n = n
        self.examples = examples
        self.owner_bits = max(1, (len(examples) - 1).bit_length())
        self._low = np.uint64((1 << self.owner_bits) - 1)
        self._high = ~self._low
        self.short: dict[str, int] = {}  # eval set -> examples shorter than n words: they can never match
        # Two passes over the text: count the n-grams, then hash them into an array of exactly that size, sorted in
        # place. Normalising twice costs a little time; growing or joining arrays would cost twice the memory.
        counts = [sum(max(0, len(w) - n + 1) for w in _word_windows(e.text, n)) for e in examples]
        keys = np.empty(sum(counts), dtype=np.uint64)
        at = 0
        for i, (e, count) in enumerate(zip(examples, counts, strict=True)):
            if not count:
                self.short[e.eval_set] = self.short.get(e.eval_set, 0) + 1
                continue
            for words in _word_windows(e.text, n):
                h = ngram_hashes(words, n)
                h &= self._high
                h |= np.uint64(i)
                keys[at : at + len(h)] = h
                at += len(h)
        assert at == len(keys), "the two passes over the evaluation text disagree"
        keys.sort()  # in place: (hash, example) order
        self.keys = keys
        self._cache: dict[int, tuple[list[str], np.ndarray]] = {}

    def __len__(self) -> int:
        return len(self.keys)

    def _example(self, ex: int) -> tuple[list[str], np.ndarray]:
        """An example's words and n-gram hashes, normalised again on a hit (the last few kept)."""
        got = self._cache.get(ex)
        if got is None:
            words = normalise_words(self.examples[ex].text)
            got = (words, ngram_hashes(words, self.n))
            if len(self._cache) >= 16:
                self._cache.pop(next(iter(self._cache)))
            self._cache[ex] = got
        return got

    def match(self, words: list[str]) -> tuple[int, int] | None:
        """(position in `words`, example index) of the first n-gram shared with an evaluation text."""
        keys = self.keys
        if not len(keys):
            return None
        q = ngram_hashes(words, self.n)
        if not len(q):
            return None
        qm = q & self._high
        at = np.searchsorted(keys, qm)
        at[at == len(keys)] = 0
        for i in np.flatnonzero((keys[at] & self._high) == qm):
            j = int(at[i])
            gram = words[i : i + self.n]
            # each example holding this hash, in the examples' order
            while j < len(keys) and (keys[j] & self._high) == qm[i]:
                ex = int(keys[j] & self._low)
                ex_words, ex_hashes = self._example(ex)
                for p in np.flatnonzero(ex_hashes == q[i]):  # confirm word by word (hash collisions)
                    if ex_words[p : p + self.n] == gram:
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
        index = NGramIndex(examples, cfg.data.decontaminate.n)
        _CACHE[key] = (sha.hexdigest(), index)
        for name, k in index.short.items():  # once per process per evaluation set, named and counted
            total = sum(e.eval_set == name for e in examples)
            log.warning(
                f"decontaminate: {k} of {total} evaluation examples of {name} are shorter than "
                f"{index.n} words and can never match (data.decontaminate.n: {index.n})"
            )
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
    """Drops a document holding an n-gram of the index (the step `decontamination_filter` builds)."""

    name = "decontaminate"
    keep_every_drop = ("decontaminated",)  # every leak is written to the dropped file, not only the first few

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
    return {
        "enabled": True,
        "n": index.n,
        "eval_sets": sets,
        "short_examples": dict(index.short),  # per set: fewer than n words, so they can never match
        "ngrams": len(index),
        "eval_sha256": sha,
    }


def decontamination_filter(run_config: Any) -> DecontaminationFilter | None:
    """N-gram decontamination (GPT-3's 13-grams, datatrove's NGramsDecontFilter), a step of the cleaning chain like
    any other: a document sharing one normalised n-gram with an evaluation text is dropped (`decontaminated`), and
    reported with the n-gram and the example's id. Its evaluation set is the run's (`data.decontaminate`: n, the
    fine-tune tasks, more files), so it takes the run's config; it has nothing to do (and does not run) when that
    section is off or holds no evaluation text."""
    if not run_config.data.decontaminate.enabled:
        return None
    _, index = eval_index(run_config)
    return DecontaminationFilter(index) if len(index) else None
