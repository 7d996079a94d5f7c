"""The run's one checkpoint object (issue 65, item 3): the when-to-save rule is the manager's, it holds the save in
flight (no module of the checkpoint package keeps state of its own), and the trainer calls it at four places."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from core.run_layout import RunLayout
from pretrain.checkpoint.manager import CheckpointManager
from runconfig import load_config

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "pretrain" / "checkpoint"


def _manager(tmp_path: Path, *overrides: str) -> CheckpointManager:
    cfg = load_config(
        ROOT / "configs" / "demo.yaml",
        [f"run.output_dir={tmp_path / 'run'}", "checkpoint.every_steps=5", *overrides],
    )
    tok = tmp_path / "run" / "tokenizer"
    tok.mkdir(parents=True)
    (tok / "tokenizer.json").write_text(json.dumps({"model": {"vocab": {}}}))
    return CheckpointManager(cfg, RunLayout(cfg), tokenizer=list(range(300)), rank=0, world=1)


def test_the_manager_decides_which_step_ends_save(tmp_path):
    m = _manager(tmp_path)
    assert not m.resuming and m.resumed_from is None  # a fresh run: nothing to resume from
    assert [s for s in range(1, 16) if m.due(s, last_step=False)] == [5, 10, 15]  # checkpoint.every_steps
    assert m.due(7, last_step=True)  # the last step saves, on the grid or not
    # a step whose loss was not finite never replaces a good checkpoint, not even the last step's
    assert not m.due(10, last_step=False, ok=False) and not m.due(7, last_step=True, ok=False)
    assert m.due(7, last_step=False, ok=False, preempted=True)  # a preemption always saves
    # COMPLETE records the tokenizer the manager was made with (its identity, computed once)
    assert m.meta["tokenizer"]["size"] == 300 and m.meta["tokenizer"]["sha256"]


@pytest.mark.timeout(30)
def test_the_checkpoint_package_keeps_no_module_state():
    """The async save in flight was two module globals (`_pending`, `_writer`); it is the manager's now. No module
    of the package rebinds a global, and none holds a mutable container at module level."""
    found = []
    for f in sorted(PACKAGE.glob("*.py")):
        tree = ast.parse(f.read_text())
        found += [f"{f.name}:{n.lineno} global" for n in ast.walk(tree) if isinstance(n, ast.Global)]
        for node in tree.body:
            value = node.value if isinstance(node, ast.Assign | ast.AnnAssign) else None
            if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "__all__":
                continue  # the package's exported names
            if isinstance(value, ast.List | ast.Dict | ast.Set | ast.Call) and not _is_constant_call(value):
                found.append(f"{f.name}:{node.lineno} module-level {type(value).__name__}")
    assert not found, found


def _is_constant_call(value: ast.expr) -> bool:
    """A compiled pattern, a logger, an immutable table or a sentinel: module-level values that hold no run's state."""
    constant = ("re.compile", "get_logger", "frozenset", "MappingProxyType", "object")
    return isinstance(value, ast.Call) and ast.unparse(value.func) in constant


def test_the_trainer_calls_the_manager_at_four_places_on_the_normal_path():
    """Construct (resume point, tokenizer check), load, save at each step end (the manager decides), close."""
    tree = ast.parse((ROOT / "pretrain" / "run" / "train.py").read_text())
    calls = sorted(
        ast.unparse(n.func)
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and "checkpoints." in ast.unparse(n.func)
        or (isinstance(n, ast.Call) and ast.unparse(n.func) == "CheckpointManager")
    )
    normal = [c for c in calls if c.rsplit(".", 1)[-1] not in ("wait", "last_good")]  # a halt, a spike
    assert normal == [
        "CheckpointManager",
        "checkpoints.load",
        "run.checkpoints.close",
        "run.checkpoints.save",
    ], calls
