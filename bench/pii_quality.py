"""PII redaction quality: precision and recall per kind (email, IPv4, IPv6, phone) of our PiiFormatter and
datatrove's PIIFormatter on a hand-labelled set, bench/data/pii_labelled.jsonl.

The set: one line a JSON object, `text` and `pii` (every span that must be redacted, `[start, end, kind, text]`),
at least 100 lines, most with no PII at all: the look-alikes that a redactor must leave (versions and section
numbers, OIDs, git remotes, `user:pass@host`, package names, retina image names, IPv6-looking scores, times, MAC
addresses, order, invoice and ISBN numbers, score and year runs, dates, prices, large numbers in thousands
grouping, reserved and documentation addresses), and the items it must take (e-mails, capitals included, inside
URL queries and angle brackets; public IPv4 and IPv6 addresses; phone numbers in North American, UK, German,
French, Spanish, Italian, Dutch, Indian, Australian, Japanese, Brazilian, Swiss, Irish, Austrian, Swedish and
Norwegian formats).

Each side redacts every line with one private-use character as its placeholder per kind, configured as its users
configure it otherwise (datatrove: `PIIFormatter()` with its defaults, only the placeholders set; ours: the
defaults, public addresses only); the spans it replaced are read back from its output (aligned with the input),
so both are scored on the text they produce, the same way. A span counts when start, end and kind are exactly the
labelled ones. datatrove redacts e-mails and IPv4 only: for IPv6 and phones its figures are 0 by design.

Verdicts (each can fail):
- `pii_<kind>_precision` and `pii_<kind>_recall` for the four kinds: ours against the labelled set (ours = spans
  right, peer = spans ours predicted / spans labelled), goal >= 0.95 each.
- `pii_f1_vs_datatrove_<kind>` for email and IPv4, the kinds datatrove redacts: our F1 against datatrove's on the
  same lines (goal: ratio >= 1, at least as good).

Self-contained: creates `.venv-bench-pii` with datatrove and `regex`, which its formatters import (no extras; nothing of it enters the product's
dependencies). Run: .venv/bin/python bench/pii_quality.py [--no-peer]
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import _common as C  # noqa: E402

from launch.side_venv import ensure_venv  # noqa: E402

DATA = ROOT / "bench" / "data" / "pii_labelled.jsonl"
BENCH_VENV = ROOT / ".venv-bench-pii"
KINDS = ("email", "ipv4", "ipv6", "phone")
GOAL = 0.95  # precision and recall per kind
SENTINEL = {"email": "\ue000", "ipv4": "\ue001", "ipv6": "\ue002", "phone": "\ue003"}
KIND_OF = {v: k for k, v in SENTINEL.items()}

PEER = r"""
import json, sys
from datatrove.pipeline.formatters import PIIFormatter
S = json.loads(sys.argv[3])
pii = PIIFormatter(email_replacement=(S["email"],), ip_replacement=(S["ipv4"],))
rows = [json.loads(x) for x in open(sys.argv[1], encoding="utf-8")]
json.dump([pii.format(r["text"]) for r in rows], open(sys.argv[2], "w"))
"""


def load(path: Path = DATA) -> list[dict]:
    rows = [json.loads(x) for x in path.read_text("utf-8").splitlines() if x.strip()]
    for i, r in enumerate(rows):
        for s, e, kind, item in r["pii"]:
            if r["text"][s:e] != item or kind not in KINDS:
                raise ValueError(f"{path.name} line {i + 1}: span {s}:{e} {kind} is not {item!r}")
    return rows


def spans_from_output(src: str, out: str) -> list[tuple[int, int, str]]:
    """(start, end, kind) of what a redactor replaced. Its output is the input with each replaced item turned into
    one placeholder character (KIND_OF): the pieces between placeholders are the input's own text, so the input
    matched against "piece (.+?) piece (.+?) ... piece" gives the items, each the shortest that fits (an item is
    never followed directly by text that it holds itself, on this set)."""
    pieces = re.split("([" + "".join(KIND_OF) + "])", out)
    pattern = "".join(re.escape(p) if i % 2 == 0 else "(.+?)" for i, p in enumerate(pieces))
    m = re.fullmatch(pattern, src, re.DOTALL)
    if m is None:
        raise ValueError(f"the redacted text is not the input with items replaced: {src!r} -> {out!r}")
    return [(m.start(g), m.end(g), KIND_OF[pieces[2 * g - 1]]) for g in range(1, len(pieces) // 2 + 1)]


def sentinel_formatter(**settings):
    """Our PiiFormatter with its settings, each kind replaced by its SENTINEL character (the placeholders are the
    formatter's fixed defaults, not settings: a bench overrides them in a subclass), so the scorer reads back which
    span became which kind."""
    from data_pipeline.formatters.pii import PiiFormatter

    class SentinelPii(PiiFormatter):
        PLACEHOLDERS = SENTINEL

    return SentinelPii(**settings)


def ours_outputs(rows: list[dict]) -> list[str]:
    p = sentinel_formatter()
    return [p.redact(r["text"]) for r in rows]


def peer_outputs(rows: list[dict]) -> list[str]:
    py = str(
        ensure_venv(BENCH_VENV, ["datatrove==0.10.1", "regex"], probe="import datatrove.pipeline.formatters")
    )
    tmp = Path(tempfile.mkdtemp(prefix="bench-pii-"))
    (tmp / "peer.py").write_text(PEER)
    (tmp / "in.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), "utf-8")
    subprocess.run(
        [py, str(tmp / "peer.py"), str(tmp / "in.jsonl"), str(tmp / "out.json"), json.dumps(SENTINEL)],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return json.loads((tmp / "out.json").read_text())


def score(rows: list[dict], outputs: list[str]) -> tuple[Counter, Counter, Counter, list[str]]:
    """(right, predicted, labelled) per kind, and one line per mistake."""
    right, pred, gold, mistakes = Counter(), Counter(), Counter(), []
    for n, (r, out) in enumerate(zip(rows, outputs, strict=True), 1):
        want = {(s, e, k) for s, e, k, _ in r["pii"]}
        got = set(spans_from_output(r["text"], out))
        for _, _, k in want:
            gold[k] += 1
        for s, e, k in got:
            pred[k] += 1
            right[k] += (s, e, k) in want
        for s, e, k in sorted(got - want):
            mistakes.append(f"line {n}: false {k} {r['text'][s:e]!r}")
        for s, e, k in sorted(want - got):
            mistakes.append(f"line {n}: missed {k} {r['text'][s:e]!r}")
    return right, pred, gold, mistakes


def _ratio(a: int, b: int) -> float:
    return a / b if b else 1.0


def f1(right: int, pred: int, gold: int) -> float:
    p, r = _ratio(right, pred), _ratio(right, gold)
    return 2 * p * r / (p + r) if p + r else 0.0


def main() -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-peer", action="store_true", help="ours only (no datatrove venv); no results file")
    args = ap.parse_args()
    rep = C.Report(__file__, save=not args.no_peer)
    rows = load()
    gold_all = Counter(k for r in rows for _, _, k, _ in r["pii"])
    rep.line(
        f"{DATA.relative_to(ROOT)}: {len(rows)} lines, {sum(not r['pii'] for r in rows)} without PII; "
        f"labelled spans {dict(sorted(gold_all.items()))}"
    )
    sides = {"ours": ours_outputs(rows)}
    if not args.no_peer:
        sides["datatrove"] = peer_outputs(rows)
    scores = {name: score(rows, outs) for name, outs in sides.items()}
    for name, (right, pred, gold, mistakes) in scores.items():
        rep.line(f"{name}:")
        for k in KINDS:
            rep.line(
                f"  {k:<6} precision {_ratio(right[k], pred[k]):.3f} ({right[k]}/{pred[k]})  recall "
                f"{_ratio(right[k], gold[k]):.3f} ({right[k]}/{gold[k]})  F1 "
                f"{f1(right[k], pred[k], gold[k]):.3f}"
            )
        if name != "ours":  # datatrove redacts e-mails and IPv4 only: its IPv6 and phone misses are by design
            mistakes = [m for m in mistakes if " email " in m or " ipv4 " in m]
        for m in mistakes[:40]:
            rep.line(f"    {m}")
        if len(mistakes) > 40:
            rep.line(f"    ... {len(mistakes) - 40} more")
    right, pred, gold, _ = scores["ours"]
    for k in KINDS:
        rep.verdict(f"pii_{k}_precision", right[k], pred[k], GOAL)
        rep.verdict(f"pii_{k}_recall", right[k], gold[k], GOAL)
    if "datatrove" in scores:
        tr, tp, tg, _ = scores["datatrove"]
        for k in ("email", "ipv4"):
            rep.verdict(
                f"pii_f1_vs_datatrove_{k}", f1(right[k], pred[k], gold[k]), f1(tr[k], tp[k], tg[k]), 1.0
            )
    return rep.finish()


if __name__ == "__main__":
    sys.exit(main())
