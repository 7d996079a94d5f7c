"""eval.tasks (issue 68 item 3) is refused at load, naming the key, where the harness cannot score it: a name that
is not one of the local tasks finetune.tasks gives (the close match and the local names listed), an encoder or
text-to-text family, ZeRO-3 (no rank holds the whole weights)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runconfig import ConfigError, load_config
from runconfig.finetune import harness_task_names

CONFIGS = Path(__file__).resolve().parents[2] / "configs"
DEMO = str(CONFIGS / "demo.yaml")

pytestmark = pytest.mark.timeout(60)


def test_the_local_tasks_and_the_tag_are_accepted():
    cfg = load_config(DEMO, ["eval.tasks=[lmstack_bbc_cloze, lmstack_bbc_choice]"])
    assert cfg.eval.tasks == ["lmstack_bbc_cloze", "lmstack_bbc_choice"] and cfg.eval.tasks_limit == 100
    assert load_config(DEMO, ["eval.tasks=[lmstack]", "eval.tasks_limit=null"]).eval.tasks_limit is None
    assert load_config(DEMO).eval.tasks == []


def test_the_names_are_the_ones_eval_tasks_writes():
    """A pair or regression task has no choice task; a task name's odd characters become underscores."""
    cfg = load_config(DEMO)
    assert harness_task_names(cfg.finetune.tasks[0]) == {
        "lmstack_bbc_choice": "choice",
        "lmstack_bbc_cloze": "cloze",
        "lmstack_bbc_ppl": "ppl",
    }
    pair = cfg.finetune.tasks[0].model_copy(update={"name": "nli-x", "source": None, "text_pair_column": "b"})
    assert harness_task_names(pair) == {"lmstack_nli_x_cloze": "cloze", "lmstack_nli_x_ppl": "ppl"}


@pytest.mark.parametrize(
    "config, overrides, message",
    [
        (
            DEMO,
            ["eval.tasks=[lmstack_bbc_clze]"],
            r"eval.tasks: 'lmstack_bbc_clze' is not a local task; did you mean 'lmstack_bbc_cloze'\? \(those of "
            r"finetune.tasks: \['lmstack_bbc_choice', 'lmstack_bbc_cloze', 'lmstack_bbc_ppl'\], or 'lmstack'",
        ),
        (DEMO, ["eval.tasks=[hellaswag]"], r"eval.tasks: 'hellaswag' is not a local task.*adapt evaluate"),
        (
            DEMO,
            ["eval.tasks=[lmstack]", "finetune.tasks=[]"],
            r"eval.tasks: 'lmstack' is not a local task.*none, as no fine-tune task is defined",
        ),
        (DEMO, ["eval.tasks=[lmstack]", "deepspeed.zero_stage=3"], r"eval.tasks: .*deepspeed.zero_stage 3"),
        (DEMO, ["eval.tasks_limit=0"], r"eval.tasks_limit"),
        (
            str(CONFIGS / "roberta-tiny.yaml"),
            ["eval.tasks=[lmstack]"],
            r"eval.tasks: model.family 'roberta' with objective 'mlm' is not a causal LM.*eval.probe_task",
        ),
        (
            str(CONFIGS / "t5-tiny.yaml"),
            ["eval.tasks=[lmstack]"],
            r"eval.tasks: model.family 't5' .* is not a causal LM",
        ),
    ],
)
def test_refused_at_load_naming_the_key(config, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(config, overrides)
