"""The fault matrix is one table: each cell names a test that exists, and docs/recovery.md is rendered from it."""

from __future__ import annotations

import ast

from tests.faults.matrix import CELLS, DOC, FAULTS, NOT_APPLICABLE, OUTCOMES, ROOT, STAGES, render


def test_every_cell_names_an_existing_test_and_a_known_outcome():
    for c in CELLS:
        assert c.stage in STAGES and c.fault in FAULTS and c.outcome in OUTCOMES, c
        path, name = c.test.split("::")
        tree = ast.parse((ROOT / path).read_text())
        names = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        assert name in names, c.test
    outcomes: dict[tuple[str, str], set[str]] = {}
    for c in CELLS:  # a cell may be proven by several tests (e.g. kills at several moments): one outcome
        outcomes.setdefault((c.stage, c.fault), set()).add(c.outcome)
    assert all(len(o) == 1 for o in outcomes.values()), outcomes
    assert not {(c.stage, c.fault) for c in CELLS} & NOT_APPLICABLE.keys()  # a tested cell is not "n/a"


def test_recovery_doc_is_generated_from_the_table():
    assert DOC.is_file() and DOC.read_text() == render(), (
        "docs/recovery.md is stale: run `python -m tests.faults.matrix`"
    )
