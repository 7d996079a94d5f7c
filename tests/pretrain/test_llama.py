"""The Llama family: config checks at load, the model's recipe (RMSNorm, SwiGLU, rotary positions, grouped-query
attention, no biases), the size ladder, the export's rotary base for transformers 4.x and 5.x, document masking
in packed blocks, and through the real DeepSpeed engine on 2 ranks: ZeRO-3 training, export with fp32 parity,
the export loading as LlamaForCausalLM and as a sequence classifier."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pretrain.run.models import build_model
from pretrain.tools.plan import _VocabOnly, model_param_counts
from runconfig import ConfigError, load_config
from tests.pretrain.conftest import ROOT, child_env, run_module, torchrun
from tests.pretrain.test_train_deepspeed import isolated

TINY = "configs/llama-tiny.yaml"


@pytest.mark.parametrize(
    "override,message",
    [
        ("model.options.num_kv_heads=3", "model.options.num_kv_heads (3) must divide model.num_heads (4)"),
        ("model.options.num_kv_heads=0", "model.options.num_kv_heads: Input should be greater than 0"),
        ("model.options.rope_theta=0", "model.options.rope_theta: Input should be greater than 0"),
        (
            "model.options.local_attention=64",
            "model.options.local_attention: not a key of family 'llama' (its keys: num_kv_heads, rope_theta)",
        ),
        (
            "model.dropout=0.1",
            "model.dropout (0.1): model.family 'llama' has no residual or embedding dropout",
        ),
        ("model.d_kv=32", "model.d_kv: not used by model.family 'llama'"),
        (
            "objective.type=mlm",
            "objective.type: 'mlm' cannot train model.family 'llama' (allowed: ['causal'])",
        ),
        (
            "tokenizer.type=wordpiece",
            "tokenizer.type: 'wordpiece' has no special tokens for model.family 'llama'",
        ),
        (
            "packing.seq_len=256",
            "packing.seq_len (256) exceeds the positions model.max_position_embeddings allows (128)",
        ),
    ],
)
def test_bad_configs_are_rejected_at_load_naming_the_key(override, message):
    with pytest.raises(ConfigError) as e:
        load_config(TINY, [override])
    assert message in str(e.value), str(e.value)


def test_tiny_model_recipe():
    cfg = load_config(TINY)
    model = build_model(cfg.model, _VocabOnly(1000), cfg.packing.seq_len)
    c = model.config
    assert type(model).__name__ == "LlamaForCausalLM" and c.vocab_size == 1024  # padded to 64
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (4, 2, 32)
    assert c.rope_parameters["rope_theta"] == 500000.0 and c.hidden_act == "silu" and c.rms_norm_eps == 1e-5
    layer = model.model.layers[0]
    assert type(layer.input_layernorm).__name__ == "LlamaRMSNorm"  # pre-norm, RMSNorm (scale only)
    assert [n for n, _ in layer.input_layernorm.named_parameters()] == ["weight"]
    # GQA: 2 kv heads
    assert layer.self_attn.k_proj.out_features == layer.self_attn.v_proj.out_features == 2 * 32
    assert layer.self_attn.q_proj.out_features == 128
    mlp = layer.mlp  # SwiGLU: down(silu(gate(x)) * up(x))
    assert (mlp.gate_proj.out_features, mlp.up_proj.out_features, mlp.down_proj.in_features) == (
        352,
        352,
        352,
    )
    assert not any(n.endswith(".bias") for n, _ in model.named_parameters())  # no biases anywhere
    assert not any("position" in n for n, _ in model.named_parameters())  # rotary: no position table
    # tied in this preset
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids = torch.randint(5, 1000, (2, 16))
    assert torch.isfinite(model(input_ids=ids, labels=ids).loss)


def _expected_params(preset: str) -> int:
    """Llama's parameter count from its shape, written out: embeddings (+ an untied head), per layer the q/o
    projections (d x d), k/v (d x kv heads x head size), SwiGLU's three matrices and two RMSNorm scales, a final
    RMSNorm."""
    cfg = load_config(f"configs/{preset}.yaml")
    m = cfg.model
    vocab = -(-cfg.tokenizer.vocab_size // m.vocab_pad_multiple) * m.vocab_pad_multiple
    d, head = m.hidden_size, m.hidden_size // m.num_heads
    kv = (m.options.get("num_kv_heads") or m.num_heads) * head
    layer = 2 * d * d + 2 * d * kv + 3 * d * m.ffn_size + 2 * d
    return vocab * d * (1 if m.tie_word_embeddings else 2) + m.num_layers * layer + d


@pytest.mark.parametrize("preset,lo,hi", [("llama-small", 124e6, 126e6), ("llama-medium", 348e6, 350e6)])
def test_gpu_rungs_match_gpt2_rungs_in_size(preset, lo, hi):
    total, _ = model_param_counts(load_config(f"configs/{preset}.yaml"))
    assert total == _expected_params(preset) and lo <= total <= hi, total


def test_budget_recipe_differs_from_gpt2_budget_only_in_the_model():
    llama, gpt2 = load_config("configs/llama-budget.yaml"), load_config("configs/gpt2-budget.yaml")
    for section in ("tokenizer", "packing", "objective", "batch", "optim", "schedule", "deepspeed", "data"):
        assert getattr(llama, section) == getattr(gpt2, section), section
    assert (llama.model.hidden_size, llama.model.num_layers, llama.model.num_heads) == (128, 4, 4)
    assert model_param_counts(llama)[0] == _expected_params("llama-budget")


def test_export_carries_the_rotary_base_for_transformers_4_and_5(tmp_path):
    """5.x saves the base only inside `rope_parameters`; 4.x reads top-level `rope_theta` (and would silently use
    10K). Both keys are written, and the folder reloads with the same base and the same logits."""
    from transformers import AutoModelForCausalLM

    cfg = load_config(TINY)
    torch.manual_seed(0)
    model = build_model(cfg.model, _VocabOnly(1000), cfg.packing.seq_len).eval()
    model.save_pretrained(tmp_path, safe_serialization=True)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert saved["architectures"] == ["LlamaForCausalLM"] and saved["rope_theta"] == 500000.0
    assert saved["rope_parameters"]["rope_theta"] == 500000.0 and saved["num_key_value_heads"] == 2
    reloaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert reloaded.config.rope_parameters["rope_theta"] == 500000.0
    ids = torch.randint(5, 1000, (2, 24))
    with torch.no_grad():
        assert torch.equal(reloaded(input_ids=ids).logits, model(input_ids=ids).logits)


def test_document_masking_makes_each_packed_document_see_only_itself():
    """The causal objective's collator and model preparation (position_ids restarting per document, no KV cache)
    give the second document of a packed row the logits it gets alone: rotary positions restart and attention
    does not cross into the first document."""
    from data_pipeline.objectives.causal import CausalCollator
    from pretrain.objectives import prepare_model

    cfg = load_config(TINY, ["objective.document_masking=true"])
    torch.manual_seed(0)
    tok = _VocabOnly(1000)
    model = build_model(cfg.model, tok, cfg.packing.seq_len).eval()
    prepare_model(cfg, model)
    a, b = torch.randint(5, 1000, (10,)), torch.randint(5, 1000, (14,))
    row = {"input_ids": torch.cat([a, b]).tolist(), "segment_ids": [0] * 10 + [1] * 14}
    batch = CausalCollator(tok, document_masking=True)([row])
    assert batch["position_ids"][0, 10] == 0 and (batch["labels"][0, [0, 10]] == -100).all()
    batch.pop("labels")
    with torch.no_grad():
        packed = model(**batch).logits[0, 10:]
        alone = model(input_ids=b[None]).logits[0]
        unmasked = model(input_ids=batch["input_ids"]).logits[0, 10:]
    torch.testing.assert_close(packed, alone, rtol=1e-5, atol=1e-5)
    assert (unmasked - alone).abs().max() > 1e-3  # without the mask the second document does see the first


LOAD_HEADS = """
import json, sys, torch
from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer
path, probe_path = sys.argv[1], sys.argv[2]
tok = AutoTokenizer.from_pretrained(path)
probe = torch.load(probe_path, weights_only=False)
model = AutoModelForCausalLM.from_pretrained(path).eval()
with torch.no_grad():
    diff = (model(**probe["inputs"]).logits - probe["logits"]).abs().max().item()
enc = tok(["A short sentence about markets.", "Another one."], padding=True, return_tensors="pt")
clf = AutoModelForSequenceClassification.from_pretrained(path, num_labels=5).eval()
prompt = tok(["The bank"], return_tensors="pt")
gen = model.generate(**prompt, max_new_tokens=4, do_sample=False)
print(json.dumps({"diff": diff, "class": type(model).__name__, "clf": type(clf).__name__,
                  "clf_logits": list(clf(**enc).logits.shape), "prompt": prompt["input_ids"].shape[1], "generated": gen.shape[1]}))
"""


@pytest.mark.integration
@pytest.mark.deepspeed
@pytest.mark.timeout(600)
def test_zero3_gqa_document_masking_trains_exports_with_parity(llama_run, tmp_path):
    out = isolated(llama_run, tmp_path)
    run_dir = Path(out.split("=", 1)[1])
    # 2 query heads on 1 key/value head (multi-query, the extreme of GQA), parameters sharded on both ranks.
    # The export builds the model from the config it is given, so it gets the same model override.
    mqa = "model.options.num_kv_heads=1"
    torchrun(llama_run, [out, "deepspeed.zero_stage=3", "objective.document_masking=true", mqa])
    tag_dir = run_dir / "checkpoints" / "step00000008"
    assert len(list(tag_dir.glob("*optim_states.pt"))) == 2  # sharded across both ranks
    rows = [json.loads(x) for x in (run_dir / "logs" / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if r["split"] == "train"]
    assert train and all(0 < r["loss"] < 20 and r["mfu"] > 0 for r in train)
    run_module(["-m", "pretrain", "export", "--config", str(llama_run), out, mqa])
    export = run_dir / "export"
    state = json.loads((export / "training_state.json").read_text())
    assert state["step"] == 8 and state["parity_max_abs_diff"] <= 1e-5
    assert state["export_heads"] == {"AutoModelForSequenceClassification": "LlamaForSequenceClassification"}
    config = json.loads((export / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_key_value_heads"] == 1
    assert config["rope_theta"] == 500000.0
    assert "pipeline_tag: text-generation" in (export / "README.md").read_text()
    assert (export / "generation_config.json").is_file()
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
    assert info["diff"] <= 1e-5 and info["class"] == "LlamaForCausalLM", info
    assert info["clf"] == "LlamaForSequenceClassification" and info["clf_logits"] == [2, 5]
    # new tokens after the prompt (generation may stop early at EOS)
    assert info["generated"] > info["prompt"]

    # lm-evaluation-harness scores the Llama export on the run's local tasks, as it does GPT-2's (issue 68)
    run_module(["-m", "data_pipeline", "eval-tasks", "--config", str(llama_run), out, mqa])
    run_module(["-m", "adapt", "evaluate", "--model", str(export), "--tasks", "lmstack", "--limit", "4"])
    results = json.loads((export / "lm_eval_results.json").read_text())["results"]
    assert {"lmstack_bbc_choice", "lmstack_bbc_cloze", "lmstack_bbc_ppl"} <= set(results)
    assert 0 < results["lmstack_bbc_ppl"]["word_perplexity,none"] < float("inf")
