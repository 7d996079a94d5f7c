"""Family + size -> a `transformers` model built from scratch (no pretrained weights are ever fetched), or, with
`model.init_from`, loaded from a local folder (continued pretraining; runconfig/init_from.py checked it at load).

The family's spec (pretrain/families/) gives the HF config and class. Initialisation is each family's own
`_init_weights` in transformers (BERT/RoBERTa N(0, 0.02); GPT-2's 1/sqrt(2L)-scaled residual projections; T5's
factor-scaled fan-in init), which is what the papers specify.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

from pretrain.families import get_family
from pretrain.run import mup
from runconfig.model import ModelConfig


def padded_vocab_size(tokenizer_len: int, multiple: int) -> int:
    """Round the embedding rows up for fast matmuls. Ids >= len(tokenizer) are never produced: the tokenizer
    cannot emit them, collators draw random tokens from the real vocabulary, and exported generation configs
    suppress them."""
    return -(-tokenizer_len // multiple) * multiple


def build_hf_config(m: ModelConfig, tokenizer: PreTrainedTokenizerBase, seq_len: int) -> PretrainedConfig:
    """The family's HF config; the sequence length is checked here, once, against the family's position table
    (the builders never read it)."""
    family = get_family(m.family)
    limit = m.position_limit
    if limit is not None and seq_len > limit:
        raise ValueError(
            f"packing.seq_len ({seq_len}) does not fit model.family '{m.family}': model.max_position_embeddings "
            f"({m.max_position_embeddings}) leaves {limit} usable positions"
        )
    if m.init_from is not None:  # the folder's own config is what its weights fit (positions checked above)
        model_cls: Any = family.model_cls()  # a transformers PreTrainedModel subclass, resolved by name
        return model_cls.config_class.from_pretrained(m.init_from)
    vocab = padded_vocab_size(len(tokenizer), m.vocab_pad_multiple)
    return family.build_config(m, tokenizer, vocab)


def build_model(
    m: ModelConfig, tokenizer: PreTrainedTokenizerBase, seq_len: int, weights: bool = True
) -> PreTrainedModel:
    """The family's pretraining model: `model.init_from`'s weights (unless `weights` is false: export and
    resume overwrite them from a checkpoint), else freshly initialised."""
    cls: Any = get_family(m.family).model_cls()  # a transformers PreTrainedModel subclass, resolved by name
    if m.init_from is not None and weights:
        return cls.from_pretrained(m.init_from, config=build_hf_config(m, tokenizer, seq_len))
    model = mup.prepare(cls(build_hf_config(m, tokenizer, seq_len)), m)  # μP's multipliers (no-op for SP)
    mup.scale_init(model, m)
    return model


def count_parameters(model: PreTrainedModel, exclude_embeddings: bool = False) -> int:
    seen: set[int] = set()
    total = 0
    emb = {
        id(p)
        for n, p in model.named_parameters()
        if "embed" in n or "wte" in n or "wpe" in n or "shared" in n
    }
    for p in model.parameters():
        if id(p) in seen or (exclude_embeddings and id(p) in emb):
            continue
        seen.add(id(p))
        total += p.numel()
    return total


def repeated_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's repeated layers (decoder/encoder blocks): the members of every outermost `nn.ModuleList` whose
    members share one class and hold parameters. Families differ in where they keep them (GPT-2 `transformer.h`,
    Llama `model.layers`, T5's two stacks, ELECTRA's discriminator and generator); this finds them all."""
    blocks: list[torch.nn.Module] = []
    taken: list[str] = []
    for name, mod in model.named_modules():
        if any(name.startswith(t + ".") for t in taken):
            continue
        if isinstance(mod, torch.nn.ModuleList) and len(mod) and len({type(m) for m in mod}) == 1:
            if any(True for _ in mod[0].parameters()):
                blocks.extend(mod)
                taken.append(name)
    return blocks


def compile_blocks(model: torch.nn.Module, backend: str = "inductor") -> int:
    """Regional compilation (torchtitan's per-block `compile`): each repeated block is compiled in place, and since
    every block runs the same code on same-shaped inputs, dynamo traces one graph that all of them reuse. The
    first compile is one block's, not the whole model's (docs/training.md has the measured times).

    It also keeps attention on SDPA's fast path: the attention mask is built by transformers outside the compiled
    region, eagerly, where an unpadded batch without document boundaries gets no mask at all, so SDPA inside the
    block is called with `attn_mask=None, is_causal=True` (and `enable_gqa` for grouped-query attention).
    Compiled whole, transformers 5.17 builds a [B,1,T,T] mask while tracing (masking_utils `is_tracing`), and any
    version does once `use_cache=False` passes position_ids to packed-sequence detection, which cannot be decided
    while tracing. State-dict names are unchanged (no `_orig_mod`). Returns the number of blocks compiled."""
    blocks = repeated_blocks(model)
    for block in blocks:
        block.compile(backend=backend)
    if hasattr(
        model, "_lmstack_loss_step"
    ):  # the chunked loss's step (pretrain/objectives/losses.py), one graph per shape
        model._lmstack_loss_step = torch.compile(model._lmstack_loss_step, backend=backend, dynamic=False)
    return len(blocks)
