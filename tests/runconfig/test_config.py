"""Config loading: presets, overrides, resolved-config round trip, and bad configs rejected with the key named."""

from pathlib import Path

import pytest
import yaml

from runconfig import ConfigError, load_config, save_resolved
from runconfig.load import validate_dict

CONFIGS = sorted(Path("configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_preset_loads(path):
    cfg = load_config(path)
    assert cfg.batch_plan()["grad_accum"] >= 1


def test_size_ladder_covers_three_families():
    names = {p.stem for p in CONFIGS}
    assert {
        "roberta-tiny",
        "roberta-base",
        "roberta-large",
        "gpt2-tiny",
        "gpt2-small",
        "gpt2-medium",
        "t5-tiny",
        "t5-small",
        "t5-base",
        "demo",
    } <= names


def test_presets_match_paper_sizes():
    base = load_config("configs/roberta-base.yaml")
    assert (base.model.hidden_size, base.model.num_layers, base.model.num_heads, base.model.ffn_size) == (
        768,
        12,
        12,
        3072,
    )
    assert base.optim.betas == (0.9, 0.98) and base.optim.eps == 1e-6 and base.optim.weight_decay == 0.01
    large = load_config("configs/roberta-large.yaml")
    assert (large.model.hidden_size, large.model.num_layers, large.model.num_heads) == (1024, 24, 16)
    med = load_config("configs/gpt2-medium.yaml")
    assert (med.model.hidden_size, med.model.num_layers, med.model.num_heads) == (1024, 24, 16)
    t5 = load_config("configs/t5-base.yaml")
    assert (t5.model.hidden_size, t5.model.num_layers, t5.model.ffn_size, t5.model.d_kv) == (
        768,
        12,
        3072,
        64,
    )
    assert t5.objective.noise_density == 0.15 and t5.objective.mean_noise_span_length == 3.0


def test_overrides_nested_typed_and_list_index():
    cfg = load_config(
        "configs/demo.yaml",
        [
            "optim.lr=3e-4",
            "deepspeed.zero_stage=3",
            "data.sources.1.weight=2.5",
            "run.name=x",
            "optim.betas=[0.9, 0.95]",
        ],
    )
    assert cfg.optim.lr == 3e-4 and cfg.deepspeed.zero_stage == 3
    assert cfg.data.sources[1].weight == 2.5 and cfg.optim.betas == (0.9, 0.95) and cfg.run.name == "x"


def test_resolved_config_round_trips(tmp_path):
    cfg = load_config("configs/demo.yaml", ["optim.lr=2e-4"])
    path = save_resolved(cfg, tmp_path)
    again = load_config(path)
    assert again == cfg


def _demo_dict():
    from runconfig.load import _resolve_inherits

    return _resolve_inherits(Path("configs/demo.yaml"))


BAD = [
    # (override list, substring the error must contain)
    (["optim.learning_rate=1e-3"], "optim.learning_rate: unknown key"),
    (["optim.lr=fast"], "optim.lr"),
    (["objective.type=span_corruption"], "objective.type"),
    (["model.family=roberta"], "objective.type"),
    (["batch.global_batch_size=30"], "batch.global_batch_size (30) is not divisible"),
    (["packing.mode=full_sentences"], "packing.mode"),
    (["schedule.warmup_steps=5000"], "schedule.warmup_steps"),
    (["model.num_heads=3"], "model.hidden_size (128) must be divisible by model.num_heads (3)"),
    (["packing.seq_len=1024"], "packing.seq_len (1024)"),
    (["deepspeed.offload_params=true"], "deepspeed.offload_params needs deepspeed.zero_stage: 3"),
    (["deepspeed.zero_stage=5"], "deepspeed.zero_stage"),
    (["finetune.source=nope"], "finetune.source"),
    (["finetune.tasks.0.source=nope"], "finetune.tasks.0.source: 'nope' is not one of data.sources"),
    (["finetune.lr_grid=[]"], "finetune.lr_grid is empty"),
    (["schedule.budget_minutes=-1"], "schedule.budget_minutes"),
    (["schedule.total_steps=100"], "schedule.total_steps (100) conflicts with schedule.budget_minutes"),
    (["tokenizer.type=unigram"], "tokenizer.type"),
    (["data.sources.0.format=pdf"], "data.sources.0.format"),
    (["data.sources.1.name=crawl"], "duplicate source name"),
    (
        ["batch.global_batch_tokens=1000"],
        "batch.global_batch_tokens (1000) is not a multiple of packing.seq_len",
    ),
    (["data.sources.0.holdout_fraction=1.5"], "data.sources.0.holdout_fraction"),
]


@pytest.mark.parametrize("overrides,needle", BAD, ids=[b[1][:40] for b in BAD])
def test_bad_config_rejected_naming_the_key(overrides, needle):
    with pytest.raises(ConfigError) as e:
        load_config("configs/demo.yaml", overrides)
    assert needle in str(e.value)


def test_missing_required_section():
    d = _demo_dict()
    del d["data"]
    with pytest.raises(ConfigError, match="data: required key is missing"):
        validate_dict(d)


def test_bad_files_and_overrides(tmp_path):
    with pytest.raises(ConfigError, match="config file not found"):
        load_config(tmp_path / "none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("run: {name: [unclosed\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        load_config(bad)
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text(yaml.safe_dump({"inherit": "b.yaml"}))
    b.write_text(yaml.safe_dump({"inherit": "a.yaml"}))
    with pytest.raises(ConfigError, match="inherit cycle"):
        load_config(a)
    with pytest.raises(ConfigError, match="must look like key.sub=value"):
        load_config("configs/demo.yaml", ["optim.lr"])
    with pytest.raises(ConfigError, match="no list index 7"):
        load_config("configs/demo.yaml", ["data.sources.7.weight=1"])
    # Issue 43: a list the config files leave at its default, and an index into a mapping, say so too.
    top = "data.clean.gopher_repetition.top_n_grams"
    with pytest.raises(
        ConfigError, match=rf"override {top}.7.1: no list index 7 at {top} \(not in the config"
    ):
        load_config("configs/demo.yaml", [f"{top}.7.1=0.3"])
    with pytest.raises(ConfigError, match=r"override run.0: no list index 0 at run \(a mapping\)"):
        load_config("configs/demo.yaml", ["run.0=x"])
    # a digit key of a dict field is a key, not an index
    assert load_config("configs/demo.yaml", ["launch.env.0=x"]).launch.env == {"0": "x"}


def test_cli_exits_2_with_message(capsys):
    from pretrain.__main__ import main

    with pytest.raises(SystemExit) as e:
        main(["plan", "--config", "configs/demo.yaml", "model.family=t5"])
    assert e.value.code == 2
    assert "objective.type" in capsys.readouterr().err
