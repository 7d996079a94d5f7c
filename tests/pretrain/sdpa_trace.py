"""What every `scaled_dot_product_attention` call in the compiled training step receives, read from the graphs dynamo
captures (a recording backend: no inductor, no C++ toolchain). Imported by tests/pretrain/test_sdpa_fast_path.py
and run as a script in the transformers-5.17 side venv (the version on the GPU machines), printing JSON.

The model is built and prepared as the trainer does (build_model, prepare_model, compile_blocks), and one micro-batch
from the causal collator runs forward, loss and backward.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import torch

ROWS = 2
SEQ = 32


def _sdpa_calls(gm: torch.fx.GraphModule) -> list[dict[str, Any]]:
    calls = []
    for node in gm.graph.nodes:
        if node.op == "call_function" and "scaled_dot_product_attention" in str(node.target):
            mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
            calls.append(
                {
                    "mask": mask is not None,
                    "is_causal": node.kwargs.get("is_causal", False),
                    "enable_gqa": node.kwargs.get("enable_gqa", False),
                }
            )
    return calls


def trace(family: str, document_masking: bool = False) -> dict[str, Any]:
    """SDPA calls, graphs captured and the loss of one compiled training step of the tiny preset of `family`."""
    import transformers

    from data_pipeline.objectives.causal import CausalCollator
    from pretrain.objectives import prepare_model
    from pretrain.run.models import build_model, compile_blocks
    from pretrain.tools.plan import _VocabOnly
    from runconfig import load_config

    torch._dynamo.reset()
    cfg = load_config(
        f"configs/{family}-tiny.yaml",
        [
            f"objective.document_masking={str(document_masking).lower()}",
            "model.dropout=0",
            "model.attention_dropout=0",
        ],
    )
    tok = _VocabOnly(1000)
    torch.manual_seed(0)
    model = build_model(cfg.model, tok, cfg.packing.seq_len).train()
    prepare_model(cfg, model)
    ids = torch.randint(5, 1000, (ROWS, SEQ))
    rows = [{"input_ids": r.tolist(), "segment_ids": [0] * (SEQ // 2) + [1] * (SEQ - SEQ // 2)} for r in ids]
    batch = CausalCollator(tok, document_masking=document_masking)(rows)
    eager_loss = model(**batch).loss.item()

    calls: list[dict[str, Any]] = []
    graphs = 0

    def record(gm: torch.fx.GraphModule, example_inputs: list[Any]):
        nonlocal graphs
        graphs += 1
        calls.extend(_sdpa_calls(gm))
        return gm.forward

    blocks = compile_blocks(model, backend=record)
    out = model(**batch)
    out.loss.backward()
    return {
        "transformers": transformers.__version__,
        "family": family,
        "blocks": blocks,
        "graphs": graphs,
        "calls": calls,
        "batch_keys": sorted(batch),
        "loss": out.loss.item(),
        "eager_loss": eager_loss,
        "grads": all(p.grad is not None for p in model.parameters() if p.requires_grad),
    }


if __name__ == "__main__":
    print(json.dumps(trace(sys.argv[1], sys.argv[2] == "1")))
