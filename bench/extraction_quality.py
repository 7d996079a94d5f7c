"""Extraction quality: token-level F1 of data_pipeline.extract against the gold texts of newspaper4k's test pages.

Self-contained: downloads the newspaper4k==0.9.6 sdist from PyPI (`pip download --no-binary`), uses every page
of tests/data/html that has a gold tests/data/txt, and compares our extractor (trafilatura, fast mode, our
charset decision) with the peers' settings: trafilatura's defaults and datatrove's Trafilatura step
(favor_precision=True, deduplicate=True). Run: .venv/bin/python bench/extraction_quality.py
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
import _common as C  # noqa: E402

CACHE = ROOT / ".cache" / "bench"
SDIST = "newspaper4k-0.9.6"
GOAL_RATIO = 0.95  # our F1 at least 95% of the peer's: the fast mode must not cost extraction quality

_TOK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]|\w+")


def fetch_pages() -> list[tuple[str, bytes, str]]:
    CACHE.mkdir(parents=True, exist_ok=True)
    tgz = CACHE / f"{SDIST}.tar.gz"
    if not tgz.exists():
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "-q",
                "--no-deps",
                "--no-binary",
                ":all:",
                "newspaper4k==0.9.6",
                "-d",
                str(CACHE),
            ],
            check=True,
        )
    data = CACHE / SDIST / "tests" / "data"
    if not data.exists():
        with tarfile.open(tgz) as tf:
            tf.extractall(CACHE, filter="data")
    pages = []
    for gold in sorted((data / "txt").glob("*.txt")):
        html = data / "html" / (gold.stem + ".html")
        if html.exists():
            pages.append((gold.stem, html.read_bytes(), gold.read_text("utf-8", errors="replace")))
    return pages


def tokens(text: str) -> Counter:
    return Counter(_TOK.findall((text or "").lower()))


def f1(pred: str, gold: str) -> tuple[float, float, float]:
    p, g = tokens(pred), tokens(gold)
    common = sum((p & g).values())
    if not common:
        return 0.0, 0.0, 0.0
    prec, rec = common / sum(p.values()), common / sum(g.values())
    return prec, rec, 2 * prec * rec / (prec + rec)


def main() -> int:
    import trafilatura

    from core.document import Document
    from data_pipeline.extract import Extractor, decode_html

    rep = C.Report(__file__)
    pages = fetch_pages()
    ours = Extractor()  # the clean stage's defaults (runconfig.data.ExtractConfig)
    systems = {
        "ours": lambda html: (lambda d: (ours(d), d.text)[1])(Document(id="p", html=html)),
        "trafilatura_default": lambda html: trafilatura.extract(decode_html(html)[0]),
        "datatrove_trafilatura": lambda html: trafilatura.extract(
            decode_html(html)[0], favor_precision=True, include_comments=False, deduplicate=True
        ),
    }
    scores: dict[str, list[float]] = {k: [] for k in systems}
    secs: dict[str, float] = {}
    print(f"{len(pages)} newspaper4k pages with gold text\n")
    print(f"{'page':<26}" + "".join(f"{k:>24}" for k in systems))
    for name in systems:
        t = time.perf_counter()
        for _, html, gold in pages:
            scores[name].append(f1(systems[name](html) or "", gold)[2])
        secs[name] = time.perf_counter() - t
    for i, (stem, _, _) in enumerate(pages):
        print(f"{stem[:25]:<26}" + "".join(f"{scores[k][i]:>24.3f}" for k in systems))
    mean = {k: sum(v) / len(v) for k, v in scores.items()}
    rep.line(
        f"{len(pages)} newspaper4k pages with gold text; mean token F1 "
        + "  ".join(f"{k}={mean[k]:.4f}" for k in systems)
    )
    print("seconds   " + "  ".join(f"{k}={secs[k]:.2f}" for k in systems))
    for peer in ("trafilatura_default", "datatrove_trafilatura"):  # not timed: F1 is deterministic
        rep.verdict(f"extraction_f1_vs_{peer}", mean["ours"], mean[peer], GOAL_RATIO)
    return rep.finish()


if __name__ == "__main__":
    sys.exit(main())
