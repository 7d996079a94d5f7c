"""μP (`model.parametrization: mup`, pretrain/run/mup.py): the multipliers of Tensor Programs V's Adam table at one
width ratio, the LR groups DeepSpeed's optimizer receives, and an export that folds them into a standard folder
with the engine's logits."""

from __future__ import annotations

import copy

import pytest
import torch

from core.errors import ConfigError
from pretrain.run import mup
from pretrain.run.engine import _param_groups
from pretrain.run.models import build_model
from runconfig import load_config

pytestmark = pytest.mark.timeout(120)

PRESETS = {
    "gpt2": "configs/gpt2-tiny.yaml",
    "llama": "configs/llama-tiny.yaml",
    "roberta": "configs/roberta-tiny.yaml",
}


def _tokenizer():
    from tests.hf_folder import tokenizer_of

    tok = tokenizer_of(300)
    tok.add_special_tokens({"mask_token": "<mask>", "cls_token": "<s>", "sep_token": "</s>"})
    return tok


def _models(family: str, base: int = 32):
    sp_cfg = load_config(
        PRESETS[family], ["model.hidden_size=128", "model.num_heads=4", "model.ffn_size=512"]
    )
    mu_cfg = load_config(
        PRESETS[family],
        [
            "model.hidden_size=128",
            "model.num_heads=4",
            "model.ffn_size=512",
            "model.parametrization=mup",
            f"model.mup_base_width={base}",
        ],
    )
    tok = _tokenizer()
    torch.manual_seed(0)
    sp = build_model(sp_cfg.model, tok, 64)
    torch.manual_seed(0)
    mu = build_model(mu_cfg.model, tok, 64)
    return sp_cfg, mu_cfg, sp, mu


def test_the_multipliers_are_the_papers_at_width_ratio_4():
    """m = 128/32 = 4: hidden init std x 1/2 (variance 1/fan_in), hidden Adam LR x 1/4, embeddings, biases and
    norms as the base's, logits x 1/4, attention scores x 1/head_dim (Tensor Programs V, Table 3, Adam)."""
    sp_cfg, mu_cfg, sp, mu = _models("gpt2")
    hidden = mup.hidden_parameters(mu, mu_cfg.model)
    for (name, p_sp), (_, p_mu) in zip(sp.named_parameters(), mu.named_parameters(), strict=True):
        want = 0.5 if id(p_mu) in hidden else 1.0
        torch.testing.assert_close(p_mu, p_sp * want, msg=name)
    names = {n for n, p in mu.named_parameters() if id(p) in hidden}
    assert "transformer.h.0.attn.c_attn.weight" in names and "transformer.h.0.mlp.c_proj.weight" in names
    assert "transformer.wte.weight" not in names and "transformer.wpe.weight" not in names
    scales = mup.lr_scales(mu, mu_cfg.model)
    assert set(scales.values()) == {0.25} and set(scales) == hidden
    for attn in mup.attention_modules(mu):
        assert attn.scaling == pytest.approx(1 / attn.head_dim)
    h = torch.randn(2, 3, 128)
    torch.testing.assert_close(mu.transformer.ln_f(h), sp.transformer.ln_f(h) / 4)
    assert mup.lr_scales(sp, sp_cfg.model) == {}


def test_the_optimizer_gets_the_scaled_groups():
    _, mu_cfg, _, mu = _models("gpt2")
    groups = _param_groups(mu, 0.01, 1e-3, mup.lr_scales(mu, mu_cfg.model))
    scaled = [g for g in groups if "lr" in g]
    assert scaled and all(g["lr"] == pytest.approx(2.5e-4) for g in scaled)
    hidden = mup.hidden_parameters(mu, mu_cfg.model)
    assert {id(p) for g in scaled for p in g["params"]} == hidden
    assert sum(len(g["params"]) for g in groups) == len(list(mu.parameters()))


@pytest.mark.parametrize("family", sorted(PRESETS))
def test_the_export_folds_into_a_standard_folder_with_the_same_logits(family, tmp_path):
    from transformers import AutoModelForCausalLM, AutoModelForMaskedLM

    _, mu_cfg, _, mu = _models(family)
    mu.eval()
    ids = torch.randint(5, 290, (2, 16))
    with torch.no_grad():
        want = mu(input_ids=ids).logits
        folded = copy.deepcopy(mu)
        mup.fold(folded, mu_cfg.model)
        torch.testing.assert_close(folded(input_ids=ids).logits, want, atol=1e-5, rtol=1e-5)
        folded.save_pretrained(tmp_path)
        auto = AutoModelForMaskedLM if family == "roberta" else AutoModelForCausalLM
        reloaded = auto.from_pretrained(tmp_path).eval()  # the family's own class: no lmstack code
        torch.testing.assert_close(reloaded(input_ids=ids).logits, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "preset,overrides,match",
    [
        (
            "configs/gpt2-tiny.yaml",
            ["model.parametrization=mup", "model.mup_base_width=256"],
            r"model.mup_base_width \(256\) is above model.hidden_size \(128\)",
        ),
        ("configs/gpt2-tiny.yaml", ["model.parametrization=mup"], "model.mup_base_width: required"),
        ("configs/gpt2-tiny.yaml", ["model.mup_base_width=64"], "applies to model.parametrization: mup"),
        (
            "configs/t5-tiny.yaml",
            ["model.parametrization=mup", "model.mup_base_width=64"],
            "not declared for family 't5'",
        ),
    ],
)
def test_bad_mup_settings_are_refused_at_load(preset, overrides, match):
    with pytest.raises(ConfigError, match=match):
        load_config(preset, overrides)


@pytest.mark.integration
@pytest.mark.deepspeed
@pytest.mark.timeout(600)
@pytest.mark.parametrize("zero", [2, 3])
def test_a_mup_run_trains_under_zero_and_exports_with_parity(tmp_path, zero):
    import json
    import math
    import subprocess
    import sys

    from tests.pretrain.conftest import ROOT, child_env, torchrun
    from tests.pretrain.test_smoke_deepspeed import prepare_smoke_run, train_losses

    config, out = prepare_smoke_run(tmp_path)
    over = ["model.parametrization=mup", "model.mup_base_width=32", f"deepspeed.zero_stage={zero}"]
    torchrun(config, over, timeout=300)
    assert all(math.isfinite(v) for v in train_losses(out).values())
    res = subprocess.run(
        [sys.executable, "-m", "pretrain", "export", "--config", str(config), *over],
        cwd=ROOT,
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    state = json.loads((out / "export" / "training_state.json").read_text())
    assert state["parity_max_abs_diff"] is not None and state["parity_max_abs_diff"] < 1e-5
    config_json = json.loads((out / "export" / "config.json").read_text())
    assert config_json["model_type"] == "gpt2"  # a standard folder: no lmstack class or multiplier in it
