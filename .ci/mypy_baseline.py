#!/usr/bin/env python3
"""mypy on every package against a committed baseline that may only shrink.

The product code predates type checking on most floors, so mypy's errors are counted per file and compared with
`.ci/mypy-baseline.txt`: a file with more errors than its baseline line (or errors in a file the baseline does not
list) fails; fewer errors pass and the run says to shrink the baseline with `--update`. Counting per file, not per
line, keeps the baseline stable when unrelated edits move lines.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE = ROOT / ".ci" / "mypy-baseline.txt"
ERROR = re.compile(r"^(?P<path>[^:\s]+\.py):\d+(?::\d+)?: error:")


def count_errors(output: str) -> Counter[str]:
    """Errors per file in mypy's output (notes and the summary line are not errors)."""
    counts: Counter[str] = Counter()
    for line in output.splitlines():
        m = ERROR.match(line)
        if m:
            counts[m["path"]] += 1
    return counts


def read_baseline(path: Path) -> Counter[str]:
    counts: Counter[str] = Counter()
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                n, name = line.split(maxsplit=1)
                counts[name] = int(n)
    return counts


def write_baseline(path: Path, counts: Counter[str]) -> None:
    head = (
        "# mypy errors per file (.ci/mypy_baseline.py); counts may only go down. Regenerate with --update.\n"
    )
    path.write_text(head + "".join(f"{counts[f]} {f}\n" for f in sorted(counts) if counts[f]))


def compare(found: Counter[str], baseline: Counter[str]) -> tuple[list[str], list[str]]:
    """(files over their baseline, files under it), each as a readable line."""
    worse = [
        f"{f}: {found[f]} errors, baseline {baseline[f]}" for f in sorted(found) if found[f] > baseline[f]
    ]
    better = [
        f"{f}: {found[f]} errors, baseline {baseline[f]}" for f in sorted(baseline) if found[f] < baseline[f]
    ]
    return worse, better


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--update", action="store_true", help="write the current counts as the new baseline")
    args = ap.parse_args(argv)
    # The packages and settings are pyproject.toml's [tool.mypy].
    proc = subprocess.run([sys.executable, "-m", "mypy"], cwd=ROOT, capture_output=True, text=True)
    found = count_errors(proc.stdout)
    if proc.returncode not in (0, 1) or (proc.returncode == 1) != bool(found):
        sys.stdout.write(proc.stdout + proc.stderr)
        print(f"mypy failed to run (exit {proc.returncode})", file=sys.stderr)
        return 2
    if args.update:
        old = read_baseline(BASELINE)
        grown = [f for f in found if found[f] > old[f]]
        write_baseline(BASELINE, found)
        print(f"mypy baseline: {sum(found.values())} errors in {len(found)} files (was {sum(old.values())})")
        if grown:
            print("note: these files gained errors: " + ", ".join(grown), file=sys.stderr)
        return 0
    baseline = read_baseline(BASELINE)
    worse, better = compare(found, baseline)
    total, allowed = sum(found.values()), sum(baseline.values())
    if worse:
        over = {f for f in found if found[f] > baseline[f]}
        for line in proc.stdout.splitlines():
            m = ERROR.match(line)
            if m and m["path"] in over:
                print(line)
        print(
            "mypy: more errors than .ci/mypy-baseline.txt allows:\n  " + "\n  ".join(worse), file=sys.stderr
        )
        return 1
    print(f"mypy: {total} errors, baseline {allowed} (.ci/mypy-baseline.txt)")
    if better:
        print(
            "mypy: fewer errors than the baseline; shrink it with `python .ci/mypy_baseline.py --update`:\n  "
            + "\n  ".join(better)
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
