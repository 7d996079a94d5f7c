"""docs/results.md states what the benchmark scripts last wrote, and nothing else (issue 65, item 8).

The page has one section per script in bench/ (its heading names `bench/<script>.py`). Under it, each results file
of that script has a line that links `bench/results/<file>` and gives its command, date, commit and machine,
followed by a fenced block of its VERDICT lines. The lines are copied from the file, which only the script writes:
this test fails when one differs, is missing or is extra, when the header figures disagree with the file's, when a
results file or a script has no section, or when a section with no results file does not say so.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "results.md"
RESULTS = ROOT / "bench" / "results"
NOT_MEASURED = "Not measured in bench/results/."

SECTION = re.compile(r"^## .*\(`bench/(\w+\.py)`\)\s*$", re.M)
BLOCK = re.compile(
    r"^\[`bench/results/(?P<file>[\w.-]+)`\]\(\.\./bench/results/(?P=file)\): `(?P<command>[^`]+)`, "
    r"(?P<date>\d{4}-\d\d-\d\d \d\d:\d\d) UTC, commit (?P<commit>[0-9a-f]{7}(?: \+ uncommitted changes)?), "
    r"(?P<machine>[^\n]+)\n\n```text\n(?P<verdicts>.*?)^```",
    re.M | re.S,
)


@dataclass(frozen=True)
class Header:
    command: str
    commit: str
    date: str
    machine: str
    device: str | None
    verdicts: tuple[str, ...]


def read_results(path: Path) -> Header:
    """What a bench script wrote: its header fields and VERDICT lines (text files, or dedup_scale's JSON)."""
    if path.suffix == ".json":
        d = json.loads(path.read_text(encoding="utf-8"))
        return Header(d["command"], d["commit"], d["date"], d["machine"], None, tuple(d["verdicts"]))
    text = path.read_text(encoding="utf-8")
    fields = dict(re.findall(r"^(command|commit|date|machine|device): (.*)$", text, re.M))
    verdicts = tuple(line for line in text.splitlines() if line.startswith("VERDICT "))
    return Header(
        fields["command"], fields["commit"], fields["date"], fields["machine"], fields.get("device"), verdicts
    )


def expected_block(name: str, header: Header) -> str:
    """The block the page should hold for results file `name`: what a failure prints, to paste under its script."""
    commit = header.commit.split()[0][:7] + (
        " + uncommitted changes" if "uncommitted" in header.commit else ""
    )
    cores = re.search(r"(\d+) cores", header.machine)
    machine = f"{cores.group(1) if cores else '?'} cores, " + (
        header.device.split(";")[0] if header.device else "CPU"
    )
    return "\n".join(
        [
            f"[`bench/results/{name}`](../bench/results/{name}): `{header.command}`, {header.date[:16]} UTC, "
            f"commit {commit}, {machine}",
            "",
            "```text",
            *header.verdicts,
            "```",
        ]
    )


def doc_sections(text: str) -> dict[str, str]:
    """script name -> the text of its section."""
    marks = list(SECTION.finditer(text))
    return {
        m.group(1): text[m.end() : marks[i + 1].start() if i + 1 < len(marks) else len(text)]
        for i, m in enumerate(marks)
    }


def block_problems(match: re.Match[str], header: Header) -> list[str]:
    """How one results block of the page disagrees with its file."""
    name = match.group("file")
    problems = []
    if match.group("command") != header.command:
        problems.append(f"{name}: command {match.group('command')!r}, the file's is {header.command!r}")
    if not header.date.startswith(match.group("date")):
        problems.append(f"{name}: date {match.group('date')}, the file's is {header.date}")
    commit = header.commit.split()[0][:7] + (
        " + uncommitted changes" if "uncommitted" in header.commit else ""
    )
    if match.group("commit") != commit:
        problems.append(f"{name}: commit {match.group('commit')!r}, the file's is {commit!r}")
    cores = re.search(r"(\d+) cores", header.machine)
    machine = match.group("machine")
    if cores and f"{cores.group(1)} cores" not in machine:
        problems.append(f"{name}: machine {machine!r}, the file's has {cores.group(1)} cores")
    if header.device and header.device.split(";")[0] not in machine:
        problems.append(
            f"{name}: machine {machine!r} does not name the file's device {header.device.split(';')[0]!r}"
        )
    lines = tuple(match.group("verdicts").splitlines())
    if lines != header.verdicts:
        missing = [v for v in header.verdicts if v not in lines]
        extra = [v for v in lines if v not in header.verdicts]
        problems.append(
            f"{name}: the VERDICT lines are not the file's (copy them in its order): missing {missing}, not in the "
            f"file {extra}"
        )
    return problems


def page_problems(text: str, results: Path, scripts: set[str]) -> list[str]:
    sections = doc_sections(text)
    problems = [
        f"no section for bench/{s} (heading '## <title> (`bench/{s}`)')"
        for s in sorted(scripts - set(sections))
    ]
    problems += [f"a section for bench/{s}, which does not exist" for s in sorted(set(sections) - scripts)]
    shown: set[str] = set()
    for script, body in sections.items():
        blocks = list(BLOCK.finditer(body))
        if not blocks and NOT_MEASURED not in body:
            problems.append(f"bench/{script}: no results block, and no '{NOT_MEASURED}'")
        for m in blocks:
            name = m.group("file")
            shown.add(name)
            path = results / name
            if not path.exists():
                problems.append(f"bench/{script}: bench/results/{name} does not exist")
                continue
            if not name.startswith(script.removesuffix(".py")):
                problems.append(f"bench/results/{name} is shown under bench/{script}")
            header = read_results(path)
            found = block_problems(m, header)
            if found:
                problems += [*found, f"its block is:\n{expected_block(name, header)}\n"]
    files = {p.name for p in results.iterdir() if p.suffix in (".txt", ".json")}
    for n in sorted(files - shown):
        block = expected_block(n, read_results(results / n))
        problems.append(f"bench/results/{n} is not shown (add its block under its script):\n{block}\n")
    return problems


def test_results_page_is_what_the_scripts_wrote():
    scripts = {p.name for p in (ROOT / "bench").glob("*.py") if not p.name.startswith("_")}
    problems = page_problems(DOC.read_text(encoding="utf-8"), RESULTS, scripts)
    assert not problems, "docs/results.md disagrees with bench/results/: " + "; ".join(problems)


def test_a_changed_verdict_or_header_is_caught(tmp_path: Path):
    """The check itself, on a copy: an edited figure, a stale date and an unlisted file each fail it."""
    (tmp_path / "x.txt").write_text(
        "# bench/x.py\ncommand: python bench/x.py\ncommit: 0123456789abcdef\ndate: 2026-11-23 12:13:03 UTC\n"
        "machine: Linux x86_64, 2 cores, load average at start 0.1 0.1 0.1, python 3.11.7\n\n"
        "VERDICT a: ours=2 peer=1 ratio=2 goal=1 pass\n",
        encoding="utf-8",
    )
    good = (
        "## X (`bench/x.py`)\n\n[`bench/results/x.txt`](../bench/results/x.txt): `python bench/x.py`, "
        "2026-11-23 12:13 UTC, commit 0123456, 2 cores, CPU\n\n```text\nVERDICT a: ours=2 peer=1 ratio=2 goal=1 pass\n"
        "```\n\nReading.\n"
    )
    assert page_problems(good, tmp_path, {"x.py"}) == []
    edited = good.replace("ours=2", "ours=3").replace("12:13 UTC", "12:14 UTC")
    problems = page_problems(edited, tmp_path, {"x.py"})
    assert any("date" in p for p in problems) and any("VERDICT lines are not" in p for p in problems), (
        problems
    )
    (tmp_path / "x-gpu.txt").write_text((tmp_path / "x.txt").read_text(encoding="utf-8"), encoding="utf-8")
    problems = page_problems(good, tmp_path, {"x.py", "y.py"})
    assert problems[0] == "no section for bench/y.py (heading '## <title> (`bench/y.py`)')"
    assert problems[1].startswith("bench/results/x-gpu.txt is not shown") and len(problems) == 2
    # the block a failure prints is one the check accepts, pasted as it is
    pasted = good.replace("Reading.", problems[1].split(":\n", 1)[1] + "\nReading.")
    assert page_problems(pasted, tmp_path, {"x.py", "y.py"}) == [problems[0]]
