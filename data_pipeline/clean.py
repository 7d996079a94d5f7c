"""The clean stage: sources -> work shards -> (read, extract, filter) in a process pool -> cleaned shards.

Each finished shard leaves `shard-XXXXX.done` holding its statistics; a rerun skips shards whose marker
matches the current cleaning config, so after a crash only the missing work is redone. `shard_index` runs a
single shard (one Slurm array task). The report (stats.json, stats.txt, dropped/<reason>.jsonl) is rebuilt
from all markers at the end of every invocation, so it is complete once the last shard has finished.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import sys
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import as_completed
from contextlib import ExitStack
from pathlib import Path
from typing import IO, Any

from core.document import Document, in_holdout
from core.io import atomic_path, fingerprint
from core.layout import CLEAN_STATS
from core.log import get_logger
from core.plugin_code import code_version
from core.run_layout import RunLayout
from data_pipeline.filters.registry import check_filter_settings, replaced_defaults_note
from data_pipeline.formatters.base import Formatter
from data_pipeline.interrupt import process_pool
from data_pipeline.readers import (
    BUILTIN_READERS,
    ErrorLog,
    WorkShard,
    get_reader,
    plan_source_shards,
    read_shard_docs,
)
from data_pipeline.shards import (
    mark_done,
    marker_path,
    remove_stale_temps,
    shard_mismatch,
    shard_name,
    write_json_atomic,
    write_shard,
    write_text_atomic,
)

log = get_logger(__name__)

SAMPLE_CHARS = 2000
# A step's drop reasons whose every document is written to clean/dropped/<source>/<reason>.jsonl, not only the first
# few: the step declares them (`keep_every_drop`; decontamination's `decontaminated`: a leak of evaluation text is
# audited document by document), and each shard's marker records them for the report.
KEEP_EVERY_DROP_KEY = "keep_every_drop"


def plan_clean(cfg) -> list[WorkShard]:
    """All work shards of all sources, in a fixed order: the global index is the Slurm array task id."""
    out: list[WorkShard] = []
    for src in cfg.data.sources:
        out.extend(plan_source_shards(src, cfg.data.clean.docs_per_shard, cfg.data.max_task_bytes))
    return out


def num_shards(cfg) -> int:
    return len(plan_clean(cfg))


def fingerprint_parts(cfg, source: str) -> dict[str, Any]:
    """What a source's cleaned shards depend on: its effective cleaning settings (global `clean:` + preset +
    overrides), the source entry, the seed (it moves the holdout) and the code version of each filter used."""
    from data_pipeline.filters.registry import filters_code_version

    clean = cfg.data.clean_for(source)
    settings = clean.model_dump(mode="json", exclude={"workers", "progress", "docs_per_shard"})
    src = next(s for s in cfg.data.sources if s.name == source)
    # A plug-in reader's code counts like a filter's (built-in readers are versioned with lmstack itself).
    reader = (
        {}
        if src.format in BUILTIN_READERS
        else {"reader": {src.format: code_version(get_reader(src.format))}}
    )
    from data_pipeline.decontaminate import fingerprint_part

    decont = fingerprint_part(cfg)  # n, the evaluation set's hash: a changed evaluation set redoes the shards
    return {
        "settings": settings,
        **({"decontaminate": decont} if decont else {}),
        "source": src.model_dump(mode="json", exclude={"clean", "clean_preset"}),
        "seed": cfg.run.seed,
        "code": filters_code_version(clean),
        "docs_per_shard": clean.docs_per_shard,
        **reader,
    }


def _hash(parts: dict[str, Any]) -> str:
    return fingerprint(parts)


def config_fingerprint(cfg, source: str | None = None) -> str:
    """Markers from different settings or filter code (or seed, which moves the holdout) are stale. Per source:
    changing one source's settings redoes only that source's shards."""
    if source is None:
        return _hash({s.name: fingerprint_parts(cfg, s.name) for s in cfg.data.sources})
    return _hash(fingerprint_parts(cfg, source))


def _shard_path(cfg, shard: WorkShard) -> Path:
    return RunLayout(cfg).clean / shard.source / shard_name(shard.index, cfg.data.clean.output_format)


def _shard_done(cfg, shard: WorkShard, fp: str) -> bool:
    path = _shard_path(cfg, shard)
    mp_ = marker_path(path)
    if not (mp_.exists() and path.exists()):
        return False
    try:
        info = json.loads(mp_.read_text())
    except (OSError, ValueError):
        return False
    if info.get("fingerprint") != fp or not _same_task(info, shard) or _changed_input(info, shard):
        return False
    return shard_mismatch(path, cfg.data.verify_checksums) is None  # damaged since: redone


def _spans(shard: WorkShard) -> list[list[int] | None]:
    return [list(f.span) if f.span else None for f in shard.files]


# Inputs up to this size also get a content hash in the marker: a file rewritten with the same bytes (a copy, a
# regenerated export) keeps its shard. Larger ones (a crawl's WARC files) are judged by size and time alone.
HASHED_INPUT_BYTES = 64 << 20


def input_stamps(shard: WorkShard) -> list[list[Any] | None]:
    """Each input file's size, modification time and (small files) sha256, as a shard's marker records them (taken
    before the files are read): a file edited in place since (appended to, rewritten) makes its shard stale, as a
    changed setting does. Hashing every input on every run would read the whole crawl again to skip it; size and
    time are what make and rsync trust, and the hash is read only when they disagree. None for a file whose store
    gives neither."""
    return [_stamp(f.path) for f in shard.files]


def _local(path: str) -> str | None:
    return path.removeprefix("file://") if "://" not in path or path.startswith("file://") else None


def _file_sha256(path: str) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 22):
            h.update(block)
    return h.hexdigest()


def _stamp(path: str, with_hash: bool = True) -> list[Any] | None:
    if (local := _local(path)) is not None:
        try:
            st = os.stat(local)
            digest = _file_sha256(local) if with_hash and st.st_size <= HASHED_INPUT_BYTES else None
        except OSError:
            return None
        return [st.st_size, st.st_mtime_ns, digest]
    try:  # a remote store: its listing's size and time (or ETag), cached by fsspec from the planning glob
        import fsspec

        fs, p = fsspec.core.url_to_fs(path)
        info = fs.info(p)
    except Exception:  # noqa: BLE001 - an unreadable stamp only means the shard cannot be judged by it
        return None
    when = next(
        (info[k] for k in ("mtime", "LastModified", "last_modified", "ETag", "etag") if info.get(k)), None
    )
    return [info.get("size"), str(when) if when is not None else None]


def _same_input(was: list[Any] | None, path: str) -> bool:
    """The file is as the marker recorded it: the same size and time, or (a local file rewritten since) the same
    size and content hash."""
    now = _stamp(path, with_hash=False)
    if was is None or now is None:
        return was == now
    if was[:2] == now[:2]:
        return True
    local = _local(path)
    if local is None or len(was) < 3 or was[2] is None or was[0] != now[0]:
        return False
    try:
        return _file_sha256(local) == was[2]
    except OSError:
        return False


def _changed_input(info: dict[str, Any], shard: WorkShard) -> str | None:
    """The first input that differs from the marker's record (a marker from before inputs were recorded: None)."""
    old = info.get("inputs")
    if not isinstance(old, list) or len(old) != len(shard.files):
        return None
    for f, was in zip(shard.files, old, strict=True):
        if not _same_input(was, f.path):
            now = _stamp(f.path, with_hash=False)
            size = f" ({was[0]} -> {now[0]} bytes)" if was and now and was[0] != now[0] else ""
            return f.path + size
    return None


def _same_task(info: dict[str, Any], shard: WorkShard) -> bool:
    """The marker is of this task: the same files and byte ranges (another `data.max_task_bytes` plans other
    pieces under the same shard numbers; a marker from before spans were recorded is of whole files)."""
    files = [f.path for f in shard.files]
    if "files" in info and info["files"] != files:
        return False
    return info.get("spans", [None] * len(files)) == _spans(shard)


def _diff_keys(old: Any, new: Any, prefix: str = "") -> list[str]:
    """Dotted paths where two JSON values differ (list items by index)."""
    if isinstance(old, list) and isinstance(new, list) and len(old) == len(new):
        old, new = dict(enumerate(old)), dict(enumerate(new))
    if isinstance(old, dict) and isinstance(new, dict):
        out: list[str] = []
        for k in sorted(set(old) | set(new), key=str):
            out += _diff_keys(old.get(k), new.get(k), f"{prefix}.{k}" if prefix else str(k))
        return out
    return [] if old == new else [prefix]


def stale_reason(cfg, shard: WorkShard, fp: str) -> str | None:
    """Why a finished shard must be redone (None: it is current or was never finished)."""
    mp_ = marker_path(_shard_path(cfg, shard))
    try:
        info = json.loads(mp_.read_text())
    except (OSError, ValueError):
        return None
    if not _same_task(info, shard):
        return "its marker is of another piece of the input (data.max_task_bytes plans other tasks)"
    if changed := _changed_input(info, shard):
        return f"input changed since it was cleaned: {changed}"
    if info.get("fingerprint") == fp:
        why = shard_mismatch(_shard_path(cfg, shard), cfg.data.verify_checksums)
        return f"the shard no longer matches its marker: {why}" if why else None
    old = info.get("fingerprint_parts")
    if not isinstance(old, dict):
        return "its marker predates settings fingerprints"
    new = fingerprint_parts(cfg, shard.source)
    keys = _diff_keys(old, new)
    code = [k.split(".", 1)[1] for k in keys if k.startswith("code.")]
    reader = [k.split(".", 1)[1] for k in keys if k.startswith("reader.")]
    settings = [k.removeprefix("settings.") for k in keys if not k.startswith(("code.", "reader."))]
    why = []
    if settings:
        why.append("settings changed: " + ", ".join(settings[:6]) + (" ..." if len(settings) > 6 else ""))
    if code:
        why.append("filter code changed: " + ", ".join(code))
    if reader:
        why.append("reader code changed: " + ", ".join(reader))
    return "; ".join(why) or "fingerprint changed"


class _ShardCleaner:
    """Runs one shard's documents through holdout, extraction and the filters, counting every decision."""

    def __init__(self, cfg, shard: WorkShard):
        from data_pipeline.extract import Extractor
        from data_pipeline.filters.registry import build_filters

        clean = cfg.data.clean_for(shard.source)
        self.clean = clean
        self.cfg, self.shard = cfg, shard
        self.source = next(s for s in cfg.data.sources if s.name == shard.source)
        ex = clean.extract
        self.extractor = Extractor(
            ex.favor_precision, ex.include_tables, ex.fast, ex.deduplicate, ex.timeout_s
        )
        self.filters = build_filters(clean, cfg)  # the configured chain, decontamination one step of it
        self.keep_every = frozenset(r for _, f in self.filters for r in getattr(f, KEEP_EVERY_DROP_KEY, ()))
        self.errors = ErrorLog()
        self.counts: Counter = Counter()
        self.dropped: Counter = Counter()
        self.charsets: Counter = Counter()
        self.samples: dict[str, list[dict[str, Any]]] = {}
        self.per_sample = clean.dropped_samples_per_reason

    def _drop(self, doc: Document, reason: str, value: Any = None) -> None:
        """Count the drop; keep the first few per reason with the value the filter measured (datatrove's
        exclusion writer keeps the same)."""
        self.dropped[reason] += 1
        bucket = self.samples.setdefault(reason, [])
        if len(bucket) < self.per_sample or reason in self.keep_every:
            bucket.append(
                {
                    "id": doc.id,
                    "source": self.shard.source,
                    "reason": reason,
                    "value": value,
                    "url": doc.url,
                    "file": doc.meta.get("file"),
                    "offset": doc.meta.get("offset"),
                    "text": (doc.text or "")[:SAMPLE_CHARS],
                }
            )

    def records(self) -> Iterator[dict[str, Any]]:
        clean, frac, seed = self.clean, self.source.holdout_fraction, self.cfg.run.seed
        for doc in read_shard_docs(
            self.source, self.shard, self.errors, clean.max_doc_bytes, clean.read_timeout_s
        ):
            self.counts["read"] += 1
            if in_holdout(doc.id, frac, seed):
                self.counts["holdout"] += 1
                continue
            if doc.html is not None:
                keep, reason = self.extractor(doc)
                self.charsets[doc.meta.get("charset_source", "?")] += 1
                if not keep:
                    self._drop(doc, reason or "extract")
                    continue
            if len(doc.text) < clean.min_chars:
                self._drop(doc, "min_chars", len(doc.text))
                continue
            for name, flt in self.filters:
                res = flt(doc)
                if not res[0]:
                    self._drop(doc, res[1] or name, res[2] if len(res) > 2 else None)
                    break
            else:
                self.counts["kept"] += 1
                self.counts["kept_chars"] += len(doc.text)
                yield doc.to_record()

    def line_stats(self) -> dict[str, int]:
        out: Counter = Counter()
        for name, flt in self.filters:
            for k, v in getattr(flt, "line_stats", {}).items():
                out[f"{name}:{k}"] += v
        return dict(out)

    def step_stats(self, formatters: bool) -> dict[str, int]:
        """What the steps counted beside their keep/drop decisions: the filters' (URL-less documents, ...) or the
        formatters' (documents changed, spans replaced per kind), `<step>:<count>`."""
        out: Counter = Counter()
        for name, flt in self.filters:
            if isinstance(flt, Formatter) is formatters:
                for k, v in getattr(flt, "stats", {}).items():
                    out[f"{name}:{k}"] += v
        return dict(out)


def clean_shard(cfg, shard: WorkShard, fingerprint: str) -> dict[str, Any]:
    """Clean one work shard: write its output atomically, then its completion marker; return its stats."""
    t0 = time.time()
    out = _shard_path(cfg, shard)
    stamps = input_stamps(
        shard
    )  # before reading: an edit made while this shard is cleaned redoes it next time
    worker = _ShardCleaner(cfg, shard)
    n = write_shard(out, worker.records())
    info = {
        "fingerprint": fingerprint,
        "fingerprint_parts": fingerprint_parts(cfg, shard.source),
        "source": shard.source,
        "shard": shard.index,
        "output": str(out),
        "files": [f.path for f in shard.files],
        "spans": _spans(shard),
        "inputs": stamps,
        "rows": list(shard.rows) if shard.rows else None,
        "read": worker.counts["read"],
        "kept": n,
        "kept_chars": worker.counts["kept_chars"],
        "holdout": worker.counts["holdout"],
        "dropped": dict(worker.dropped),
        "line_drops": worker.line_stats(),
        "filter_stats": worker.step_stats(formatters=False),
        "formatter_stats": worker.step_stats(formatters=True),
        "bad_records_by_kind": dict(worker.errors.bad_counts),
        "bad_records": [b.to_dict() for b in worker.errors.bad],
        "skipped": dict(worker.errors.skips),
        "charset_decisions": dict(worker.charsets),
        "dropped_samples": worker.samples,
        KEEP_EVERY_DROP_KEY: sorted(worker.keep_every),
        "seconds": round(time.time() - t0, 3),
    }
    mark_done(out, info)  # with the shard's size and sha256, which the next stage checks
    RunLayout(cfg).store.push([out, marker_path(out)])  # a remote run: the shard, then its marker
    return info


def _run_one(args: tuple) -> dict[str, Any]:
    """A pool task: the shard's statistics stay in its marker (the report reads them from there); the driver gets
    only which shard it was, or its error, so what it holds does not grow with the number of shards."""
    cfg, shard, fp = args
    try:
        clean_shard(cfg, shard, fp)
        return {"source": shard.source, "shard": shard.index}
    except Exception as e:  # a bug or an unexpected library error: report the shard, keep the others going
        import traceback

        return {
            "source": shard.source,
            "shard": shard.index,
            "error": f"{type(e).__name__}: {e}",
            "traceback": traceback.format_exc()[-2000:],
        }


def run_clean(cfg, shard_index: int | None = None) -> dict[str, Any]:
    """Clean every missing shard (or just `shard_index`), then rebuild the report. Returns the summary."""
    t0 = time.time()
    check_filter_settings(cfg)  # a `module:Name` step's params, against the settings type it brings
    plan = plan_clean(cfg)
    fps = {s.name: config_fingerprint(cfg, s.name) for s in cfg.data.sources}
    # a remote run: what is done remotely counts, a local marker never uploaded does not
    if shard_index is None:
        layout = RunLayout(cfg)
        layout.store.pull([layout.clean], prune_markers=True)
        remove_stale_temps(layout.clean)  # a whole-stage run owns clean/: what a killed run left is dead
    if shard_index is not None:
        if not 0 <= shard_index < len(plan):
            raise IndexError(f"--shard-index {shard_index} is outside the plan's {len(plan)} shards")
        todo = [plan[shard_index]]
    else:
        todo = [s for s in plan if not _shard_done(cfg, s, fps[s.source])]
    redo: Counter = Counter()
    for s in todo:
        why = stale_reason(cfg, s, fps[s.source])
        if why:
            redo[(s.source, why)] += 1
    for (source, why), n in sorted(redo.items()):
        log.info(f"clean: redoing {n} finished shard(s) of {source}: {why}")
    notes = {replaced_defaults_note(cfg.data.clean_for(s.name)) for s in cfg.data.sources} - {None}
    for note in sorted(notes):  # a `filters:` list that leaves built-ins out: said once, naming them
        log.warning(f"clean: {note}")
    skipped = len(plan) - len(todo) if shard_index is None else 0
    failures: list[dict[str, Any]] = []
    workers = min(cfg.data.clean.workers, len(todo)) if todo else 1
    jobs = [(cfg, s, fps[s.source]) for s in todo]
    bar = _progress(len(todo), cfg.data.clean.progress)
    if workers <= 1:
        for j in jobs:
            res = _run_one(j)
            failures += [res] if "error" in res else []
            bar.update(1)
    else:
        ctx = mp.get_context("fork" if sys.platform == "linux" else "spawn")
        with process_pool(workers, ctx) as pool:
            for fut in as_completed([pool.submit(_run_one, j) for j in jobs]):
                res = fut.result()
                failures += [res] if "error" in res else []
                bar.update(1)
    bar.close()
    summary = write_report(cfg, plan)
    summary.update(
        {
            "shards_run": len(todo),
            "shards_skipped_done": skipped,
            "shards_redone": {f"{k[0]}: {k[1]}": v for k, v in redo.items()},
            "seconds": round(time.time() - t0, 2),
            "failed_shards": failures,
        }
    )
    log.info(summary.pop("table"))
    if failures:
        names = ", ".join(f"{f['source']}/{f['shard']}: {f['error']}" for f in failures)
        raise RuntimeError(f"clean: {len(failures)} shard(s) failed ({names}); rerun to retry only those")
    return summary


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(
        total=total, desc="clean shards", unit="shard", disable=not enabled or total == 0, file=sys.stderr
    )


def write_report(cfg, plan: list[WorkShard] | None = None) -> dict[str, Any]:
    """Aggregate every shard marker into stats.json, stats.txt and dropped/<source>/<reason>.jsonl."""
    layout = RunLayout(cfg)
    layout.store.pull([layout.clean], only_markers=True)  # a remote run: shards cleaned on other nodes count
    plan = plan if plan is not None else plan_clean(cfg)
    fps = {s.name: config_fingerprint(cfg, s.name) for s in cfg.data.sources}
    per_source: dict[str, Counter] = {}
    dropped: Counter = Counter()
    dropped_per_source: dict[str, Counter] = {}
    line_drops: Counter = Counter()
    filter_stats: Counter = Counter()
    formatter_stats: Counter = Counter()
    bad_kinds: Counter = Counter()
    skips: Counter = Counter()
    charsets: Counter = Counter()
    bad: list[dict[str, Any]] = []
    samples: dict[tuple[str, str], list[dict[str, Any]]] = {}
    missing: list[str] = []
    per_n = cfg.data.clean.dropped_samples_per_reason
    # Every drop of a reason its step keeps every drop of streams from its marker to its file (each renamed into place when all
    # markers are read): held in memory, they would grow with the input (a 1% leak rate in 1 GB of crawl is tens of
    # MB of quoted text). The first few of any other reason are kept here and written after.
    with ExitStack() as files:
        streams: dict[tuple[str, str], IO[str]] = {}
        for shard in plan:
            m = marker_path(_shard_path(cfg, shard))
            try:
                info = json.loads(m.read_text())
            except (OSError, ValueError):
                info = None
            if not info or info.get("fingerprint") != fps[shard.source]:
                missing.append(f"{shard.source}/{shard.index}")
                continue
            c = per_source.setdefault(shard.source, Counter())
            c["shards"] += 1
            for k in ("read", "kept", "kept_chars", "holdout"):
                c[k] += info[k]
            c["dropped"] += sum(info["dropped"].values())
            c["bad_records"] += sum(info["bad_records_by_kind"].values())
            dropped.update(info["dropped"])
            dropped_per_source.setdefault(shard.source, Counter()).update(info["dropped"])
            line_drops.update(info["line_drops"])
            filter_stats.update(info.get("filter_stats", {}))
            formatter_stats.update(info.get("formatter_stats", {}))
            bad_kinds.update(info["bad_records_by_kind"])
            skips.update(info["skipped"])
            charsets.update(info["charset_decisions"])
            bad.extend(info["bad_records"])
            for reason, rows in info["dropped_samples"].items():
                if reason in info.get(KEEP_EVERY_DROP_KEY, ()):
                    key = (shard.source, reason)
                    if key not in streams:
                        tmp = files.enter_context(atomic_path(_dropped_path(layout, *key)))
                        streams[key] = files.enter_context(open(tmp, "w", encoding="utf-8"))
                    streams[key].writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)
                    continue
                bucket = samples.setdefault((shard.source, reason), [])  # per source x reason
                bucket.extend(rows[: max(0, per_n - len(bucket))])
    totals: Counter = Counter()
    for c in per_source.values():
        totals.update(c)
    stats = {
        "complete": not missing,
        "missing_shards": missing,
        "shards_total": len(plan),
        "totals": dict(totals),
        "per_source": {k: dict(v) for k, v in per_source.items()},
        "source_settings": {s.name: source_settings(cfg, s) for s in cfg.data.sources},
        "decontamination": decontamination_summary(cfg),
        "dropped_by_reason": dict(dropped.most_common()),
        "dropped_by_source_and_reason": {k: dict(v.most_common()) for k, v in dropped_per_source.items()},
        "line_drops": dict(line_drops.most_common()),
        "filter_stats": dict(filter_stats.most_common()),
        "formatter_stats": dict(formatter_stats.most_common()),
        "bad_records_by_kind": dict(bad_kinds.most_common()),
        "bad_records": bad,
        "skipped_records": dict(skips.most_common()),
        "charset_decisions": dict(charsets.most_common()),
    }
    layout.clean.mkdir(parents=True, exist_ok=True)
    write_json_atomic(layout.clean / CLEAN_STATS, stats)
    for (source, reason), rows in samples.items():
        write_text_atomic(
            _dropped_path(layout, source, reason),
            "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
        )
    table = format_table(stats)
    write_text_atomic(layout.clean / "stats.txt", table + "\n")
    if stats["complete"]:  # never let a partial view (one array task's) replace the remote report
        layout.store.push([layout.clean / "dropped", layout.clean / "stats.txt", layout.clean / CLEAN_STATS])
    return {
        "stats": str(layout.clean / CLEAN_STATS),
        "complete": stats["complete"],
        "totals": stats["totals"],
        "dropped_by_reason": stats["dropped_by_reason"],
        "bad_records_by_kind": stats["bad_records_by_kind"],
        "formatter_stats": stats["formatter_stats"],  # what formatters rewrote (PII: documents, spans)
        "table": table,
    }


def _dropped_path(layout: RunLayout, source: str, reason: str) -> Path:
    return layout.clean / "dropped" / source / f"{reason.replace(':', '__')}.jsonl"


def decontamination_summary(cfg) -> dict[str, Any]:
    from data_pipeline.decontaminate import summary

    return summary(cfg)


def source_settings(cfg, src) -> dict[str, Any]:
    """How a source is cleaned, for the report: preset, overrides, and the chain's steps with their settings
    (`enabled`: the step runs, i.e. it is switched on and has something to do)."""
    from data_pipeline.filters.registry import build_filters, filter_specs, step_config

    clean = cfg.data.clean_for(src.name)
    running = {name for name, _ in build_filters(clean, cfg)}
    steps = []
    for spec in filter_specs(clean):
        sec = step_config(clean, spec.name, spec.params)
        settings = sec.model_dump(mode="json", exclude={"enabled"}) if sec is not None else spec.params
        steps.append({"name": spec.name, "enabled": spec.name in running, "settings": settings})
    return {
        "preset": src.clean_preset or "web",
        "overrides": src.clean,
        "min_chars": clean.min_chars,
        "filters": steps,
    }


def format_table(stats: dict[str, Any]) -> str:
    """The human-readable summary printed at the end of the clean stage."""
    lines = ["source         shards    read    kept  holdout  dropped  bad  kept_chars", "-" * 72]
    for name, c in list(stats["per_source"].items()) + [("TOTAL", stats["totals"])]:
        lines.append(
            f"{name[:14]:<14} {c.get('shards', 0):>6} {c.get('read', 0):>7} {c.get('kept', 0):>7} "
            f"{c.get('holdout', 0):>8} {c.get('dropped', 0):>8} {c.get('bad_records', 0):>4} "
            f"{c.get('kept_chars', 0):>11}"
        )
    if stats.get("source_settings"):
        lines += ["", "cleaning per source"]
        for name, st in stats["source_settings"].items():
            on = [f["name"] for f in st["filters"] if f["enabled"]]
            over = f" overrides {json.dumps(st['overrides'], sort_keys=True)}" if st["overrides"] else ""
            lines.append(f"  {name[:14]:<14} preset {st['preset']}: {', '.join(on) or 'no filters'}{over}")
    dec = stats.get("decontamination") or {}
    if dec.get("enabled"):
        sets = ", ".join(f"{k} {v}" for k, v in dec["eval_sets"].items()) or "none"
        per = {
            s: r["decontaminated"]
            for s, r in stats.get("dropped_by_source_and_reason", {}).items()
            if r.get("decontaminated")
        }
        lines += [
            "",
            f"decontamination: {dec['n']}-grams of evaluation text ({sets}); dropped per source: "
            f"{json.dumps(per) if per else 'none'}",
        ]
        if dec.get("short_examples"):  # examples fewer than n words long: they can never match
            lines.append(
                f"  shorter than {dec['n']} words, never matched: "
                + ", ".join(f"{k} {v}" for k, v in dec["short_examples"].items())
            )
    for title, key in (
        ("dropped documents by reason", "dropped_by_reason"),
        ("bad input records by kind", "bad_records_by_kind"),
        ("lines removed inside kept pages", "line_drops"),
        ("counted by filters (URL-less documents, ...)", "filter_stats"),
        ("rewritten by formatters (documents changed, spans replaced per kind)", "formatter_stats"),
    ):
        if stats.get(key):
            lines += ["", title]
            lines += [f"  {k:<40} {v:>8}" for k, v in stats[key].items()]
    if stats["missing_shards"]:
        lines += [
            "",
            f"NOT COMPLETE: {len(stats['missing_shards'])} shard(s) missing: "
            + ", ".join(stats["missing_shards"][:20]),
        ]
    return "\n".join(lines)
