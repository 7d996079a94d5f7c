"""No function in the product packages is longer than 120 lines (issue 47): a longer one is split into named steps.
CONTRIBUTING.md lists the longest and says why each above 80 lines stays whole."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("core", "runconfig", "data_pipeline", "pretrain", "adapt", "launch")
LIMIT = 120
LOOP = "pretrain/run/train.py:_train"  # the training loop reads top to bottom: set-up, step, log, eval, save by name
LOOP_LIMIT = 80


def function_lengths() -> list[tuple[int, str]]:
    """(lines, 'path:name') of every function and method in the product packages, longest first."""
    out = []
    for pkg in PACKAGES:
        for f in sorted((ROOT / pkg).rglob("*.py")):
            for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    out.append((node.end_lineno - node.lineno + 1, f"{f.relative_to(ROOT)}:{node.name}"))
    return sorted(out, reverse=True)


def test_no_function_is_longer_than_the_limit():
    long = [f"{name} ({n} lines)" for n, name in function_lengths() if n > LIMIT]
    assert not long, f"functions over {LIMIT} lines: split them into named steps: {long}"


def test_contributing_gives_a_reason_for_each_function_over_80_lines():
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    missing = [f"{name} ({n} lines)" for n, name in function_lengths() if n > 80 and f"`{name}`" not in text]
    assert not missing, (
        f"CONTRIBUTING.md's longest functions: say why these stay whole, or split them: {missing}"
    )


def test_the_training_loop_fits_one_screen():
    lengths = {name: n for n, name in function_lengths()}
    assert lengths[LOOP] <= LOOP_LIMIT, (
        f"{LOOP} is {lengths[LOOP]} lines: keep the loop to {LOOP_LIMIT} by giving each part a named function"
    )


def contributing_table() -> list[tuple[int, str]]:
    """(lines, 'path:name') of each row of CONTRIBUTING.md's table of the longest functions, in its order."""
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    section = text.split("## Function length", 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) >= 2 and cells[0].startswith("`") and cells[1].isdigit():
            rows.append((int(cells[1]), cells[0].strip("`")))
    return rows


def test_contributing_table_is_the_ten_longest_functions_as_they_are():
    """The table is read against the code, so it cannot go stale: the ten longest, longest first, each with its
    length today; the limits its text states are this file's."""
    expected = function_lengths()[:10]
    table = contributing_table()
    assert table == expected, (
        "CONTRIBUTING.md's function-length table disagrees with the code; its rows should be (lines, function): "
        + "; ".join(f"{n} `{name}`" for n, name in expected)
        + f" (the table has: {'; '.join(f'{n} `{name}`' for n, name in table) or 'no rows'})"
    )
    text = (ROOT / "CONTRIBUTING.md").read_text(encoding="utf-8")
    assert f"never more than {LIMIT} " in text and f"`_train` to {LOOP_LIMIT})" in text, (
        f"CONTRIBUTING.md should state this test's limits: {LIMIT} lines, and {LOOP_LIMIT} for {LOOP}"
    )
