"""docs/architecture.md names every product module with its purpose, and no module that is gone (issue 65, item 8).

The page's "Every module" section has one `### <folder>/` heading per package folder (the folder in backticks)
and one table row per module in it, its file name in backticks and its purpose. Any other path of a product module written anywhere on the page (the
module map, the contracts) must exist too. A failure names each module to add or to remove.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "architecture.md"
PACKAGES = ("core", "runconfig", "data_pipeline", "pretrain", "adapt", "launch")
SECTION = "## Every module"

HEADING = re.compile(r"^### `([\w/]+)/`\s*$")
ROW = re.compile(r"^\|\s*`([\w.]+\.py)`\s*\|(.*)\|\s*$")
PATH = re.compile(r"(?<![\w/.])((?:" + "|".join(PACKAGES) + r")/[\w/]*\w\.py)\b")


def product_modules() -> set[str]:
    """Every .py file of the product packages, as a path from the repository root."""
    return {str(f.relative_to(ROOT)) for pkg in PACKAGES for f in (ROOT / pkg).rglob("*.py")}


def indexed_modules(text: str) -> dict[str, str]:
    """path -> purpose, for each row of the "Every module" section."""
    assert SECTION in text, f"docs/architecture.md has no '{SECTION}' section"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    out: dict[str, str] = {}
    folder = None
    for line in section.splitlines():
        if m := HEADING.match(line):
            folder = m.group(1)
        elif (m := ROW.match(line)) and folder is not None:
            out[f"{folder}/{m.group(1)}"] = m.group(2).strip()
    return out


def test_every_product_module_is_named_once_with_a_purpose():
    text = DOC.read_text(encoding="utf-8")
    index = indexed_modules(text)
    modules = product_modules()
    missing = sorted(modules - set(index))
    extra = sorted(set(index) - modules)
    assert not missing and not extra, (
        "docs/architecture.md, section 'Every module': "
        + (f"missing (add a row under its folder's heading): {missing}" if missing else "")
        + ("; " if missing and extra else "")
        + (f"named but not in the tree (remove or rename the row): {extra}" if extra else "")
    )
    blank = sorted(path for path, purpose in index.items() if not purpose)
    assert not blank, f"docs/architecture.md: give each module its one-line purpose: {blank}"


def test_every_module_path_on_the_page_exists():
    text = DOC.read_text(encoding="utf-8")
    named = set(PATH.findall(text))
    assert named, "the path pattern found no module path on the page"
    gone = sorted(named - product_modules())
    assert not gone, f"docs/architecture.md names modules that are not in the tree (update the text): {gone}"


def test_the_index_reader_reports_a_missing_and_a_stale_row():
    """The check itself: a heading and its rows are read as paths, so a row under the wrong folder is stale."""
    page = f"{SECTION}\n\n### `core/`\n\n| module | purpose |\n|---|---|\n| `io.py` | the atomic writer |\n"
    page += (
        "| `gone.py` | was here |\n\n### `core/sub/`\n\n| `x.py` |  |\n\n## Next\n| `y.py` | not indexed |\n"
    )
    assert indexed_modules(page) == {
        "core/io.py": "the atomic writer",
        "core/gone.py": "was here",
        "core/sub/x.py": "",
    }
