"""`finetune.methods` and the `finetune.<method>` settings are read from the adaptation method registry (issue 65
item 5): names and settings are checked at load, each refusal one line naming the key; old configs load; a
resolved config reloads to the same settings; and one rule finds a folder's family for init_from and adapt."""

from __future__ import annotations

import pytest

from core.registry import ADAPT_METHODS, FAMILIES
from core.specs import MethodSpec
from runconfig import ConfigError, load_config
from runconfig.init_from import find_family, is_family_of
from runconfig.load import save_resolved

PRESET = "configs/roberta-tiny.yaml"


def _load(tmp_path, *overrides: str):
    return load_config(PRESET, [f"run.output_dir={tmp_path / 'run'}", *overrides])


@pytest.mark.timeout(60)
def test_methods_and_their_settings_come_from_the_registry(tmp_path):
    cfg = _load(tmp_path, "finetune.methods=[full, lora, ulmfit]", "finetune.lora={r: 4}")
    assert cfg.finetune.settings_of("lora").r == 4 and cfg.finetune.settings_of("ulmfit").decay == 2.6
    assert cfg.finetune.settings_of("full") is None  # full takes no settings
    assert set(ADAPT_METHODS.builtin_names()) == {"full", "frozen", "lora", "ulmfit"}
    # the default is the primary method, read from the specs
    assert _load(tmp_path).finetune.methods == [n for n, s in ADAPT_METHODS.items() if s.primary] == ["full"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            "finetune.methods=[lroa]",
            r"unknown adaptation method 'lroa' \(registered: \[.*'lora'.*\]\); did you mean 'lora'",
        ),
        (
            "finetune.lora={rank: 4}",
            r"finetune.lora.rank: not a key of adaptation method 'lora' \(its keys: r, alpha",
        ),
        (
            "finetune.ulmfit={decay: 0.5}",
            r"finetune.ulmfit.decay: Input should be greater than or equal to 1",
        ),
        ("finetune.lroa={r: 4}", r"finetune.lroa: unknown key; did you mean 'lora'"),
        ("finetune.full={x: 1}", r"finetune.full: adaptation method 'full' takes no settings"),
        (
            "finetune.frozen={mix_lr_grid: [0.01]}",
            r"finetune.frozen.mix_lr_grid was removed \(\[0.01\] given\): .* delete the key",
        ),
    ],
)
def test_bad_methods_and_settings_are_one_line_naming_the_key(tmp_path, override, message):
    with pytest.raises(ConfigError, match=message) as e:
        _load(tmp_path, override)
    assert "Traceback" not in str(e.value)


@pytest.mark.timeout(60)
def test_old_configs_load_and_a_resolved_config_reloads_alike(tmp_path):
    """The sections a config wrote before methods were registered (lora, ulmfit, frozen's mix_steps) keep their
    meaning; the resolved config records every chosen method's settings and loads back to the same."""
    old = [
        "finetune.methods=[full, frozen, lora, ulmfit]",
        "finetune.lora={r: 4, alpha: 8, dropout: 0.1, lr_scale: 5.0}",
        "finetune.ulmfit={unfreeze_every: 2}",
        "finetune.frozen={mix_steps: 50}",
    ]
    cfg = _load(tmp_path, *old)
    assert (
        cfg.finetune.settings_of("frozen").mix_steps == 50
        and cfg.finetune.settings_of("lora").lr_scale == 5.0
    )
    dumped = cfg.finetune.model_dump(mode="json")
    assert (
        dumped["lora"]["r"] == 4
        and dumped["ulmfit"]["unfreeze_every"] == 2
        and "mix_lr_grid" not in dumped["frozen"]
    )
    again = load_config(save_resolved(cfg, tmp_path))
    assert again.finetune.model_dump(mode="json") == dumped


@pytest.mark.timeout(60)
def test_one_rule_finds_a_folders_family():
    """model_type names a built-in; an outside family is known by its model class among `architectures`."""
    assert find_family("roberta", ["RobertaForMaskedLM"]) is FAMILIES.get("roberta")
    assert find_family("gpt2", None) is FAMILIES.get("gpt2")
    assert find_family("bert", ["BertForMaskedLM"]) is None  # no registered family builds that class
    assert find_family("llama-ish", ["LlamaForCausalLM"]) is FAMILIES.get("llama")
    assert is_family_of(FAMILIES.get("roberta"), "xlm", ["RobertaForMaskedLM"])
    assert not is_family_of(FAMILIES.get("roberta"), "bert", ["BertForMaskedLM"])


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("command", "override", "named"),
    [
        (
            "transfer",
            "finetune.methods=[full, bitfitt]",
            "finetune.methods: unknown adaptation method 'bitfitt' (registered:",
        ),
        ("finetune", "finetune.lora={rank: 4}", "finetune.lora.rank: not a key of adaptation method 'lora'"),
        ("transfer", "finetune.frozen={mix_lr_grid: [0.01]}", "finetune.frozen.mix_lr_grid was removed"),
    ],
)
def test_adapt_refuses_a_bad_method_at_load_in_one_line(tmp_path, capsys, command, override, named):
    """`adapt finetune` / `adapt transfer` with an unknown method or a bad `finetune.<method>` key: exit 2, the
    config named and one line naming the key, before any model is looked at (the --model folder does not exist)."""
    from adapt.__main__ import main
    from core.exit_codes import USAGE

    argv = ["--config", PRESET, f"run.output_dir={tmp_path}/run", override, "--model", str(tmp_path / "none")]
    with pytest.raises(SystemExit) as e:
        main([command, *argv])
    err = capsys.readouterr().err.strip()
    assert e.value.code == USAGE and "Traceback" not in err, err
    assert named in err and "no model here" not in err, err


# A method named by `module.path:Name` in the YAML, without packaging (as every kind takes).
UNPACKAGED = MethodSpec(name="unpackaged", description="a method no entry point declares")


@pytest.mark.timeout(60)
def test_a_method_named_by_module_path_needs_no_entry_point(tmp_path):
    ref = f"{__name__}:UNPACKAGED"
    cfg = _load(tmp_path, f"finetune.methods=[full, '{ref}']")
    assert cfg.finetune.methods == ["full", ref] and cfg.finetune.settings_of(ref) is None
    assert ADAPT_METHODS.get(ref) is UNPACKAGED
