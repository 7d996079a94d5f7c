"""ELECTRA replaced-token detection (Clark et al. 2020) as a registered objective.

A small MLM generator (ElectraForMaskedLM) fills the masked positions of each block with tokens sampled from its
softmax; the discriminator (the `electra` family's ElectraForPreTraining) labels every real token original or
replaced. Loss = generator MLM + lambda * discriminator BCE over all non-pad tokens (lambda = 50). Generator and
discriminator share the whole embedding module (token, position, segment embeddings and their LayerNorm), as
the reference code does (`untied_generator_embeddings: False`). The model code is in `rtd.py`; this file is the
spec, its typed options and the config checks, and imports no torch.

Masking follows the reference's defaults through the shared MLM keys: 15% of tokens (`objective.mlm_probability`),
85% of them `[MASK]` and 15% kept (`objective.mask_token_fraction: 0.85`, `random_token_fraction: 0`, set in
configs/base/electra.yaml).
"""

from __future__ import annotations

from typing import Any

from pydantic import Field

from data_pipeline.objectives.registry import ObjectiveSpec, register_objective
from runconfig.base import Section


class ElectraOptions(Section):
    """`objective.options` of the electra objective (names follow the reference code's PretrainingConfig)."""

    # Generator width as a fraction of the discriminator's (model.hidden_size): the paper's best is 1/4-1/2
    # (Figure 3; Table 6: small 1/4, base 1/3, large 1/4).
    generator_hidden_fraction: float = Field(0.25, gt=0)
    generator_layers_fraction: float = Field(1.0, gt=0, le=1)  # generator depth / discriminator depth
    generator_num_heads: int | None = Field(None, gt=0)  # default: max(1, width // 64), as the reference code
    generator_ffn_size: int | None = Field(None, gt=0)  # default: 4 x generator width, as the reference code
    discriminator_weight: float = Field(50.0, gt=0)  # lambda in loss = MLM + lambda * BCE
    temperature: float = Field(1.0, gt=0)  # softmax temperature of the generator's samples


def generator_shape(hidden: int, layers: int, opts: ElectraOptions) -> dict[str, int]:
    """The generator's width, depth, heads and FFN from the discriminator's (reference: get_generator_config)."""
    width = int(round(hidden * opts.generator_hidden_fraction))
    return {
        "hidden_size": width,
        "num_hidden_layers": max(1, int(round(layers * opts.generator_layers_fraction))),
        "num_attention_heads": opts.generator_num_heads or max(1, width // 64),
        "intermediate_size": opts.generator_ffn_size or 4 * width,
    }


def validate(cfg: Any) -> None:
    opts = ElectraOptions.model_validate(cfg.objective.options)
    m = cfg.model
    g = generator_shape(m.hidden_size, m.num_layers, opts)
    key = "objective.options.generator_hidden_fraction"
    if g["hidden_size"] > m.hidden_size:
        raise ValueError(f"{key} ({opts.generator_hidden_fraction:g}) makes the generator ({g['hidden_size']} "
                         f"wide) wider than the discriminator (model.hidden_size {m.hidden_size}); ELECTRA "
                         f"needs a generator at most as wide (the paper's best: 1/4 to 1/2)")
    if g["hidden_size"] < 1:
        raise ValueError(f"{key} ({opts.generator_hidden_fraction:g}) leaves the generator no width "
                         f"(model.hidden_size {m.hidden_size})")
    if g["hidden_size"] % g["num_attention_heads"]:
        raise ValueError(f"objective.options.generator_num_heads ({g['num_attention_heads']}) does not divide the "
                         f"generator's width ({g['hidden_size']} = {opts.generator_hidden_fraction:g} x "
                         f"model.hidden_size)")


def collator(cfg: Any, tokenizer: Any):
    """MLM inputs and labels plus `sample_u`, the uniform per position the generator's sample is drawn with."""
    from data_pipeline.objectives.builtin import masking_kwargs
    from data_pipeline.objectives.rtd import ElectraCollator

    return ElectraCollator(tokenizer, **masking_kwargs(cfg))


def wrap_model(cfg: Any, discriminator: Any, tokenizer: Any):
    """The family's discriminator + a generator built beside it, sharing its embeddings: the module trained."""
    from data_pipeline.objectives.rtd import ReplacedTokenDetection, build_generator

    opts = ElectraOptions.model_validate(cfg.objective.options)
    generator = build_generator(discriminator.config, generator_shape(
        discriminator.config.hidden_size, discriminator.config.num_hidden_layers, opts))
    return ReplacedTokenDetection(discriminator, generator, tokenizer, opts.discriminator_weight, opts.temperature)


def export(cfg: Any, module: Any, out: Any, tokenizer: Any):
    from data_pipeline.objectives.rtd import export_pair

    return export_pair(module, out, tokenizer)


SPEC = register_objective(ObjectiveSpec(
    "electra",
    ("full_sentences", "line_by_line"),
    collator,
    wrap_model=wrap_model,
    export=export,
    validate=validate,
    options=ElectraOptions,
    needs_encoder=True,
))
