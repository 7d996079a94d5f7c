"""Labelled data the way teams hold it: train/dev/test files (CSV with or without a BOM, TSV, JSONL, a folder per
label, an HF `datasets` folder) or a data source's pretraining hold-out. One text or a sentence pair
(`text_pair_column`) per example; a class name or, for regression (`problem: regression`), a number as its label.

Every problem is an error naming the config key (`finetune.tasks.<i>.<key>`) and raised before any training:
a file not found, a missing text, second text or label column, a test label the training split never shows, a
regression label that is not a number.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from core.errors import LmstackError
from core.log import get_logger
from core.paths import expand_placeholders
from runconfig import RunConfig
from runconfig.finetune import FinetuneTask

Row = tuple[str, str, str, str | None]  # (example id, text, label, second text of a pair task or None)
RawRow = tuple[str, str | None, str | None, str | None]  # as read: the texts and the label may be null

log = get_logger(__name__)


@dataclass
class TaskData:
    name: str
    train: list[Row]
    dev: list[Row]
    test: list[Row]
    labels: list[str]  # class names (empty for regression)
    origin: str  # how the splits were made, for the report
    regression: bool = False  # labels are numbers (their strings in the rows), scored by Pearson / Spearman
    pair: bool = False  # each row carries a second text

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.train), "dev": len(self.dev), "test": len(self.test)}


class LabelledDataError(LmstackError, ValueError):
    """A labelled-data problem, naming the config key: one line and exit USAGE from the CLIs."""


def _fraction_hash(salt: str, example_id: str) -> float:
    h = hashlib.blake2b(f"{salt}:{example_id}".encode(), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


def split_by_id(rows: list[Row], fraction: float, salt: str) -> tuple[list[Row], list[Row]]:
    """(rest, held) by a hash of the example id salted with the task and split name: the same examples for every
    seed and every run."""
    held = [r for r in rows if _fraction_hash(salt, r[0]) < fraction]
    rest = [r for r in rows if _fraction_hash(salt, r[0]) >= fraction]
    return rest, held


def cap_by_id(rows: list[Row], cap: int | None, salt: str) -> list[Row]:
    """At most `cap` rows: those with the smallest salted id hash (a fixed subset for every seed), in file order."""
    if cap is None or len(rows) <= cap:
        return rows
    keep = set(sorted(range(len(rows)), key=lambda i: _fraction_hash(salt, rows[i][0]))[:cap])
    return [r for i, r in enumerate(rows) if i in keep]


def _resolve(raw: str, key: str) -> Path:
    p = Path(expand_placeholders(raw))
    if not p.exists():
        raise LabelledDataError(f"{key}: '{raw}' not found (expanded to '{p}')")
    return p


AUTO = "auto"  # finetune.tasks.<i>.format: told from the path


def _format(path: Path, fmt: str) -> str:
    if fmt != AUTO:
        return fmt
    if path.is_dir():
        if any((path / f).is_file() for f in ("dataset_info.json", "state.json", "dataset_dict.json")):
            return "hf_dataset"
        return "folder"
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv", ".jsonl"):
        return suffix[1:]
    if suffix == ".json":
        return "jsonl"
    raise LabelledDataError(
        f"cannot tell the format of '{path}' (csv, tsv, jsonl, a folder per label, an HF "
        "datasets folder): set finetune.tasks.<i>.format"
    )


def label_text(value: object) -> str | None:
    """A label as read -> the class name it stands for. Null or blank: None (the row is skipped, counted). A
    number, as a number or as text, is written one way (1, 1.0 and "1.0" are class "1"; 0.50 is "0.5"), so equal
    numbers are one class."""
    if value is None or isinstance(value, bool):
        return None if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    text = value if isinstance(value, str) else repr(value) if isinstance(value, float) else str(value)
    if not text.strip():
        return None
    try:
        x = float(text)
    except ValueError:
        return text
    if not math.isfinite(x):
        return text
    return str(int(x)) if x.is_integer() else repr(x)


def _check_columns(columns: list[str], task: FinetuneTask, key: str, path: Path | str) -> None:
    for what in ("text_column", "text_pair_column", "label_column"):
        col = getattr(task, what)
        if col is not None and col not in columns:
            k = key.rsplit(".", 1)[0] + f".{what}"
            raise LabelledDataError(f"{k}: column '{col}' not in {path} (columns: {columns})")


def _utf8(path: Path, key: str) -> str:
    """The file's text (a UTF-8 BOM dropped); bytes that are not UTF-8 are named by file, line and offset."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        start = e.start + (3 if data.startswith(b"\xef\xbb\xbf") else 0)
        line = data[:start].count(b"\n") + 1
        raise LabelledDataError(
            f"{key}: {path} line {line} is not UTF-8 (byte 0x{data[start]:02x} at "
            f"offset {start}): save the file as UTF-8"
        ) from None


def _read_delimited(path: Path, delimiter: str, task: FinetuneTask, key: str) -> list[RawRow]:
    reader = csv.DictReader(io.StringIO(_utf8(path, key), newline=""), delimiter=delimiter)
    _check_columns(list(reader.fieldnames or []), task, key, path)
    pair = task.text_pair_column
    return [
        (f"{path.name}:{i}", r[task.text_column], label_text(r[task.label_column]), r[pair] if pair else None)
        for i, r in enumerate(reader)
    ]


def _read_jsonl(path: Path, task: FinetuneTask, key: str) -> list[RawRow]:
    rows: list[RawRow] = []
    for i, line in enumerate(_utf8(path, key).splitlines()):
        if not line.strip():
            continue
        try:
            r = json.loads(line)
        except json.JSONDecodeError as e:
            raise LabelledDataError(f"{key}: {path} line {i + 1} is not JSON: {e}") from None
        _check_columns(list(r), task, key, f"{path} line {i + 1}")
        text = r[task.text_column]
        second = r[task.text_pair_column] if task.text_pair_column else None
        rows.append(
            (
                str(r.get("id", f"{path.name}:{i}")),
                None if text is None else str(text),
                label_text(r[task.label_column]),
                None if second is None else str(second),
            )
        )
    return rows


def _read_folder(path: Path, task: FinetuneTask, key: str) -> list[RawRow]:
    from data_pipeline.readers.base import decode_text

    rows: list[RawRow] = []
    for f in sorted(path.glob("*/*")):
        if f.is_file():
            text, _, how = decode_text(f.read_bytes())  # as pretraining's text_folder reader decodes
            if text is None:
                raise LabelledDataError(f"{key}: {f} is neither UTF-8 nor a charset that can be detected")
            rows.append((str(f.relative_to(path)), text, label_text(f.parent.name), None))
    return rows


# One reader per labelled-file format (a table, not a chain of format comparisons).
_TABLE_READERS: dict[str, Callable[[Path, FinetuneTask, str], list[RawRow]]] = {
    "csv": lambda p, t, k: _read_delimited(p, ",", t, k),
    "tsv": lambda p, t, k: _read_delimited(p, "\t", t, k),
    "jsonl": _read_jsonl,
    "folder": _read_folder,
    "hf_dataset": lambda p, t, k: list(_rows_from_hf(_load_hf(p), t, k, p)),
}


def _read_table(path: Path, fmt: str, task: FinetuneTask, key: str) -> list[RawRow]:
    read = _TABLE_READERS.get(fmt)
    if read is None:
        raise LabelledDataError(f"{key}: unknown format {fmt!r}")
    rows = read(path, task, key)
    if not rows:
        raise LabelledDataError(f"{key}: no labelled examples in {path}")
    return rows


def _blank(text: str | None) -> bool:
    return text is None or not text.strip()


def _named(ids: list[str]) -> str:
    return f"{', '.join(ids[:5])}{', ...' if len(ids) > 5 else ''}"


def _drop_blank(rows: list[RawRow], key: str, where: str | Path, pair: bool = False) -> list[Row]:
    """Rows whose text (or, for a pair task, second text) is empty, whitespace-only or null carry nothing to
    classify, and rows with a null or empty label nothing to learn or score (never a class named 'None'):
    skipped, counted and named, never trained on or scored."""
    blank = [r[0] for r in rows if _blank(r[1]) or (pair and _blank(r[3]))]
    if blank:
        log.warning(
            f"{key}: skipped {len(blank)} row(s) of {where} with empty, whitespace-only or null text: {_named(blank)}"
        )
    unlabelled = [r[0] for r in rows if r[2] is None and r[0] not in set(blank)]
    if unlabelled:
        log.warning(
            f"{key}: skipped {len(unlabelled)} row(s) of {where} with a null or empty label: {_named(unlabelled)}"
        )
    return [
        (i, t, y, b)
        for i, t, y, b in rows
        if t is not None and y is not None and not (_blank(t) or (pair and _blank(b)))
    ]


def _load_hf(path: Path):
    from datasets import load_from_disk

    return load_from_disk(str(path))


def _rows_from_hf(ds, task: FinetuneTask, key: str, path: Path) -> list[RawRow]:
    _check_columns(list(ds.column_names), task, key, path)
    feat = ds.features[task.label_column]
    names = getattr(feat, "names", None)  # ClassLabel: ints -> label names
    ids = ds["id"] if "id" in ds.column_names else range(len(ds))
    seconds = ds[task.text_pair_column] if task.text_pair_column else [None] * len(ds)
    return [
        (
            f"{path.name}:{i}",
            None if t is None else str(t),
            None if y is None else names[y] if names else label_text(y),
            None if b is None else str(b),
        )
        for i, t, y, b in zip(ids, ds[task.text_column], ds[task.label_column], seconds, strict=True)
    ]


def _source_rows(cfg: RunConfig, task: FinetuneTask, key: str) -> list[RawRow]:
    """The source's hold-out documents (never pretrained on), with their labels."""
    from core.document import in_holdout
    from data_pipeline.readers import read_source

    src = next(s for s in cfg.data.sources if s.name == task.source)
    if src.holdout_fraction <= 0:
        raise LabelledDataError(
            f"{key}.source: data source '{src.name}' has no hold-out "
            "(data.sources[].holdout_fraction is 0), so every document was pretrained on"
        )
    rows = [
        (d.id, d.text, label_text(d.meta["label"]), None)
        for d in read_source(src)
        if in_holdout(d.id, src.holdout_fraction, cfg.run.seed) and d.meta.get("label") is not None
    ]
    if not rows:
        raise LabelledDataError(f"{key}.source: no labelled hold-out documents in source '{src.name}'")
    return sorted(rows)


def text_repair(cfg: RunConfig) -> Callable[[str], str] | None:
    """The unicode repair the pretraining corpus got (data.clean's `unicode` filter with its settings), for the
    labelled text; None when `finetune.repair_text` is off or pretraining had no such step."""
    from core.document import Document
    from data_pipeline.filters.registry import build_step, filter_specs

    spec = next((s for s in filter_specs(cfg.data.clean) if s.name == "unicode"), None)
    fixer = build_step(cfg.data.clean, spec.name, spec.params) if spec and cfg.finetune.repair_text else None
    if fixer is None:
        return None

    def repair(text: str) -> str:
        doc = Document(id="", text=text)
        fixer(doc)  # its keep/drop verdict is for corpus cleaning: a labelled example is never dropped here
        return doc.text

    return repair


def _check_numbers(rows: list[Row], key: str, where: str | Path) -> None:
    """Regression labels must be finite numbers: the first that is not is named with its row and file."""
    for rid, _, y, _ in rows:
        try:
            ok = math.isfinite(float(y))
        except ValueError:
            ok = False
        if not ok:
            raise LabelledDataError(
                f"{key}.label_column: a regression label must be a number; row {rid} of {where} has {y!r}"
            )


def _empty_way(task: FinetuneTask, key: str, split: str) -> str:
    """The ways to a split that holds examples, with their key names (an empty split comes from few examples, a
    small fraction or a cap)."""
    cap = (
        f" ({key}.max_train_examples caps them at {task.max_train_examples})"
        if task.max_train_examples
        else ""
    )
    if split == "dev":
        return (
            f"give a dev file ({key}.dev), raise {key}.dev_fraction ({task.dev_fraction} of the training "
            f"examples, picked by id hash), or give more training examples{cap}"
        )
    if split == "test":
        return (
            f"give a test file ({key}.test), raise {key}.test_fraction ({task.test_fraction}), or give more "
            "examples"
        )
    return f"every example went to dev or test: give more training examples{cap}, or a dev and a test file"


def load_task(cfg: RunConfig, index: int) -> TaskData:
    task = cfg.finetune.tasks[index]
    key = f"finetune.tasks.{index}"
    pair = task.text_pair_column is not None
    regression = task.problem == "regression"
    dev: list[Row] = []
    test: list[Row] = []
    if task.source is not None:
        rows = _drop_blank(_source_rows(cfg, task, key), f"{key}.source", f"source '{task.source}'")
        if regression:
            _check_numbers(rows, key, f"source '{task.source}'")
        train, test = split_by_id(rows, task.test_fraction, f"{task.name}/test")
        origin = f"hold-out of source '{task.source}', test {task.test_fraction:.0%} by id hash"
    elif task.dataset is not None:
        path = _resolve(task.dataset, f"{key}.dataset")
        dd = _load_hf(path)
        if not hasattr(dd, "keys") or "train" not in dd:
            raise LabelledDataError(f"{key}.dataset: {path} is not a DatasetDict with a 'train' split")

        def split_rows(split: str) -> list[Row]:
            rows = _drop_blank(
                _rows_from_hf(dd[split], task, f"{key}.dataset", path),
                f"{key}.dataset",
                f"{path} ({split} split)",
                pair,
            )
            if regression:
                _check_numbers(rows, key, f"{path} ({split} split)")
            return rows

        train = split_rows("train")
        dev_split = next((s for s in ("validation", "dev") if s in dd), None)
        dev = split_rows(dev_split) if dev_split else []
        if "test" in dd:
            test = split_rows("test")
        else:
            train, test = split_by_id(train, task.test_fraction, f"{task.name}/test")
        origin = f"HF dataset {path}"
    else:
        files = {}
        for split in ("train", "dev", "test"):
            raw = getattr(task, split)
            if raw is not None:
                p = _resolve(raw, f"{key}.{split}")
                raw_rows = _read_table(p, _format(p, task.format), task, f"{key}.{split}")
                files[split] = _drop_blank(raw_rows, f"{key}.{split}", p, pair)
                if regression:
                    _check_numbers(files[split], key, p)
        train = files["train"]
        dev = files.get("dev", [])
        test = files.get("test", [])
        if not test:
            train, test = split_by_id(train, task.test_fraction, f"{task.name}/test")
        origin = "files: " + ", ".join(files)
    repair = text_repair(cfg)
    if repair is not None:
        train, dev, test = (
            [(i, repair(t), y, None if b is None else repair(b)) for i, t, y, b in rows]
            for rows in (train, dev, test)
        )
    train = cap_by_id(train, task.max_train_examples, f"{task.name}/cap")
    test = cap_by_id(test, task.max_test_examples, f"{task.name}/cap")
    if not dev:
        train, dev = split_by_id(train, task.dev_fraction, f"{task.name}/dev")
    for split, rows in (("train", train), ("dev", dev), ("test", test)):
        if not rows:
            raise LabelledDataError(f"{key}: the {split} split is empty; {_empty_way(task, key, split)}")
    if regression:
        return TaskData(task.name, train, dev, test, [], origin, regression=True, pair=pair)
    labels = sorted({r[2] for r in train})
    for split, rows in (("dev", dev), ("test", test)):
        unseen = sorted({r[2] for r in rows} - set(labels))
        if unseen:
            raise LabelledDataError(
                f"{key}.label_column: the {split} split has labels the train split never shows: "
                f"{unseen[:10]} (train labels: {labels[:20]})"
            )
    missing = sorted(set(labels) - {r[2] for r in test})
    if missing and task.test is not None:
        raise LabelledDataError(
            f"{key}.label_column: label sets differ between train and test: {missing[:10]} "
            "never occur in the test file"
        )
    return TaskData(task.name, train, dev, test, labels, origin, pair=pair)


def load_tasks(cfg: RunConfig) -> list[TaskData]:
    """Every task, read and checked up front: a bad task stops the command before any model is trained."""
    if not cfg.finetune.tasks:
        raise LabelledDataError(
            "finetune.tasks: no task configured (give a source with a hold-out, or train/test files)"
        )
    return [load_task(cfg, i) for i in range(len(cfg.finetune.tasks))]
