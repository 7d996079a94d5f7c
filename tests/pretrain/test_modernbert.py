"""The ModernBERT family: config checks at load, the model's recipe (pre-LN, GLU, RoPE, local/global attention,
sparse prediction, no dropout), and through the real DeepSpeed engine on 2 ranks ZeRO-3 training, export with
fp32 parity and the export loading as AutoModelForMaskedLM and AutoModelForSequenceClassification. Exact
kill-and-resume under ZeRO-2 is in test_exact_resume.py."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pretrain.run.models import build_model
from pretrain.tools.plan import _VocabOnly
from runconfig import ConfigError, load_config
from runconfig.load import validate_dict
from tests.pretrain.conftest import ROOT, child_env, run_module, torchrun
from tests.pretrain.test_train_deepspeed import isolated

TINY = "configs/modernbert-tiny.yaml"


@pytest.mark.parametrize(
    "override,message",
    [
        ("model.num_heads=3", "model.hidden_size (128) must be divisible by model.num_heads (3)"),
        ("objective.mlm_probability=0", "objective.mlm_probability: Input should be greater than 0"),
        ("objective.mlm_probability=1.0", "objective.mlm_probability: Input should be less than 1"),
        ("objective.mlm_probability=1.5", "objective.mlm_probability: Input should be less than 1"),
        # The registered names are listed (sorted); other plug-ins may add more, so only the start is fixed.
        ("model.family=modernbertt", "model.family: unknown family 'modernbertt' (registered: ['"),
        # the registered names (the built-ins, and any module.path:Name objective this process used before)
        ("objective.type=spans", "objective.type: unknown objective 'spans' (registered: ["),
        ("model.options.local_attention=0", "model.options.local_attention: Input should be greater than 0"),
        ("model.options.window=64", "model.options.window: not a key of family 'modernbert'"),
        ("model.d_kv=32", "model.d_kv: not used by model.family 'modernbert'"),
        (
            "objective.type=causal",
            "objective.type: 'causal' cannot train model.family 'modernbert' (allowed: ['mlm'])",
        ),
        (
            "packing.seq_len=1024",
            "packing.seq_len (1024) exceeds the positions model.max_position_embeddings allows (512)",
        ),
    ],
)
def test_bad_configs_are_rejected_at_load_naming_the_key(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(TINY, [override])
    assert message in str(e.value), str(e.value)


def test_options_belong_to_their_family():
    with pytest.raises(ConfigError, match="model.options: family 'roberta' takes no options"):
        load_config("configs/roberta-tiny.yaml", ["model.options.local_attention=64"])


def test_masking_rate_defaults_to_30_percent_for_this_family_only():
    data = {
        "data": {"sources": [{"name": "x", "format": "text", "paths": ["x.txt"]}]},
        "tokenizer": {"type": "bpe"},
        "packing": {"seq_len": 128},
    }
    assert validate_dict({**data, "model": {"family": "modernbert"}}).objective.mlm_probability == 0.3
    assert (
        validate_dict(
            {**data, "model": {"family": "roberta", "max_position_embeddings": 130}}
        ).objective.mlm_probability
        == 0.15
    )
    set_explicitly = {**data, "model": {"family": "modernbert"}, "objective": {"mlm_probability": 0.2}}
    assert validate_dict(set_explicitly).objective.mlm_probability == 0.2


def test_tiny_model_recipe():
    cfg = load_config(TINY)
    model = build_model(cfg.model, _VocabOnly(1000), cfg.packing.seq_len)
    c = model.config
    assert type(model).__name__ == "ModernBertForMaskedLM" and c.vocab_size == 1024  # padded to 64
    assert c.embedding_dropout == c.mlp_dropout == c.attention_dropout == 0.0
    assert c.layer_types == ["full_attention", "sliding_attention", "sliding_attention", "full_attention"]
    assert c.local_attention == 64 and c.rope_parameters["full_attention"]["rope_theta"] == 160000.0
    layer = model.model.layers[1]
    assert isinstance(layer.attn_norm, torch.nn.LayerNorm) and layer.attn_norm.bias is None  # pre-LN, no bias
    assert layer.mlp.Wi.out_features == 2 * cfg.model.ffn_size  # GLU: input and gate
    assert model.decoder.weight.data_ptr() == model.model.embeddings.tok_embeddings.weight.data_ptr()


def test_sparse_prediction_projects_only_masked_positions_and_keeps_the_loss():
    cfg = load_config(TINY)
    torch.manual_seed(0)
    model = build_model(cfg.model, _VocabOnly(1000), cfg.packing.seq_len).eval()
    ids = torch.randint(5, 1000, (2, 32))
    labels = torch.full_like(ids, -100)
    labels[0, 3], labels[1, 7], labels[1, 20] = 11, 12, 13
    sparse = model(input_ids=ids, labels=labels)
    assert sparse.logits.shape == (3, 1024)  # the vocabulary projection ran on the 3 masked positions only
    dense = model(input_ids=ids).logits
    want = torch.nn.functional.cross_entropy(dense.reshape(-1, 1024), labels.reshape(-1), ignore_index=-100)
    torch.testing.assert_close(sparse.loss, want)


def test_size_ladder_matches_published_shapes():
    base = load_config("configs/modernbert-base.yaml").model
    assert (
        base.num_layers,
        base.hidden_size,
        base.num_heads,
        base.ffn_size,
        base.max_position_embeddings,
    ) == (22, 768, 12, 1152, 8192)
    assert load_config("configs/modernbert-base.yaml").tokenizer.vocab_size == 50368


LOAD_HEADS = """
import json, sys, torch
from transformers import AutoModelForMaskedLM, AutoModelForSequenceClassification, AutoTokenizer
path, probe_path = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(path)
probe = torch.load(probe_path, weights_only=False)
model = AutoModelForMaskedLM.from_pretrained(path).eval()
with torch.no_grad():
    diff = (model(**probe["inputs"]).logits - probe["logits"]).abs().max().item()
enc = tok(["A short sentence about markets.", "Another one."], padding=True, return_tensors="pt")
enc.pop("token_type_ids", None)
clf = AutoModelForSequenceClassification.from_pretrained(path, num_labels=5).eval()
print(json.dumps({"diff": diff, "class": type(model).__name__, "clf": type(clf).__name__,
                  "clf_logits": list(clf(**enc).logits.shape)}))
"""


@pytest.mark.integration
@pytest.mark.timeout(420)
@pytest.mark.deepspeed
def test_zero3_trains_exports_with_parity_and_loads_with_auto_classes(modernbert_run, tmp_path):
    out = isolated(modernbert_run, tmp_path)
    run_dir = Path(out.split("=", 1)[1])
    torchrun(modernbert_run, [out, "deepspeed.zero_stage=3"])
    tag_dir = run_dir / "checkpoints" / "step00000008"
    assert len(list(tag_dir.glob("*optim_states.pt"))) == 2  # sharded across both ranks
    rows = [json.loads(x) for x in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    assert all(0 < r["loss"] < 20 for r in rows if r["split"] == "train")
    run_module(["-m", "pretrain", "export", "--config", str(modernbert_run), out])
    export = run_dir / "export"
    state = json.loads((export / "training_state.json").read_text())
    assert state["step"] == 8 and state["parity_max_abs_diff"] <= 1e-5
    assert state["export_heads"] == {
        "AutoModelForSequenceClassification": "ModernBertForSequenceClassification"
    }
    config = json.loads((export / "config.json").read_text())
    assert config["architectures"] == ["ModernBertForMaskedLM"] and config["sparse_prediction"] is False
    res = subprocess.run(
        [sys.executable, "-c", LOAD_HEADS, str(export), str(tag_dir / "parity_probe.pt")],
        capture_output=True,
        text=True,
        env=child_env(),
        cwd=ROOT,
        timeout=120,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    info = json.loads(res.stdout.strip().splitlines()[-1])
    assert info["diff"] <= 1e-5 and info["class"] == "ModernBertForMaskedLM", info
    assert info["clf"] == "ModernBertForSequenceClassification" and info["clf_logits"] == [2, 5]


def test_flops_count_sliding_window_layers_on_their_window_only():
    from pretrain.run.metrics import flops_per_token

    m = load_config(TINY).model  # 4 layers: global 0 and 3, local 1 and 2 with a 64-token window
    n = 1_000_000
    # short sequences: every layer sees them whole
    assert flops_per_token(m, n, 32) == 6 * n + 12 * 128 * 4 * 32
    assert flops_per_token(m, n, 512) == 6 * n + 12 * 128 * (2 * 512 + 2 * 65)
