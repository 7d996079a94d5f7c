"""ELECTRA's replaced-token detection (Clark et al. 2020) as an objective: the whole spec. Its typed options and
checks are here; the collator is data_pipeline/objectives/electra.py, the generator + discriminator module and
the export of both pretrain/objectives/rtd.py. It trains every family that declares how it carries RTD
(`FamilySpec.rtd`). Imports no torch."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from core.specs import FamilySpec, ObjectiveSpec, Options
from data_pipeline.objectives.electra import collator
from pretrain.families.shapes import generator_shape


class ElectraOptions(Options):
    """`objective.options` of the electra objective (names follow the reference code's PretrainingConfig)."""

    # Generator width as a fraction of the discriminator's (model.hidden_size): the paper's best is 1/4-1/2
    # (Figure 3; Table 6: small 1/4, base 1/3, large 1/4).
    generator_hidden_fraction: float = Field(0.25, gt=0)
    generator_layers_fraction: float = Field(1.0, gt=0, le=1)  # generator depth / discriminator depth
    generator_num_heads: int | None = Field(None, gt=0)  # default: max(1, width // 64), as the reference code
    generator_ffn_size: int | None = Field(None, gt=0)  # default: 4 x generator width, as the reference code
    discriminator_weight: float = Field(50.0, gt=0)  # lambda in loss = MLM + lambda * BCE
    temperature: float = Field(1.0, gt=0)  # softmax temperature of the generator's samples
    # COCO-LM's sequence-contrastive loss (Meng et al. 2021, "SCL"): the discriminator's mean-pooled last states of
    # the corrupted sequence and of a cropped view of the original are pulled together against the other sequences
    # of the micro-batch (InfoNCE, both directions). On a small budget it is what brings RTD's body level with the
    # masked LM's (docs/results.md); spreading the pooled states alone did not. Weight 0: off, no second pass.
    contrastive_weight: float = Field(0.0, ge=0)
    contrastive_temperature: float = Field(0.1, gt=0)  # of the cosine similarities
    # the cropped view's length / the sequence's (COCO-LM's 0.9)
    contrastive_crop: float = Field(0.9, gt=0, le=1)


def carries_rtd(family: FamilySpec) -> bool:
    """The family declares replaced-token detection (its spec names an RTD adapter)."""
    return family.rtd is not None


def validate(cfg: Any) -> None:
    opts = ElectraOptions.model_validate(cfg.objective.options)
    m = cfg.model
    g = generator_shape(m.hidden_size, m.num_layers, opts)
    key = "objective.options.generator_hidden_fraction"
    if g["hidden_size"] > m.hidden_size:
        raise ValueError(
            f"{key} ({opts.generator_hidden_fraction:g}) makes the generator ({g['hidden_size']} "
            f"wide) wider than the discriminator (model.hidden_size {m.hidden_size}); ELECTRA "
            f"needs a generator at most as wide (the paper's best: 1/4 to 1/2)"
        )
    if g["hidden_size"] < 1:
        raise ValueError(
            f"{key} ({opts.generator_hidden_fraction:g}) leaves the generator no width "
            f"(model.hidden_size {m.hidden_size})"
        )
    if opts.generator_ffn_size is not None and opts.generator_ffn_size > m.ffn_size:
        raise ValueError(
            f"objective.options.generator_ffn_size ({opts.generator_ffn_size}) makes the generator's feed-forward "
            f"larger than the discriminator's (model.ffn_size {m.ffn_size}); the generator must be the smaller network"
        )
    if g["hidden_size"] % g["num_attention_heads"]:
        raise ValueError(
            f"objective.options.generator_num_heads ({g['num_attention_heads']}) does not divide the "
            f"generator's width ({g['hidden_size']} = {opts.generator_hidden_fraction:g} x "
            f"model.hidden_size)"
        )


def wrap(cfg: Any, model: Any, tokenizer: Any) -> Any:
    """The family's discriminator + a smaller generator of the same family sharing its embeddings (the family's
    RTD adapter, `FamilySpec.rtd`, builds both): the module trained."""
    from pretrain.objectives.rtd import Contrastive, ReplacedTokenDetection, rtd_family

    opts = ElectraOptions.model_validate(cfg.objective.options)
    adapter = rtd_family(cfg.model.spec)
    shape = generator_shape(cfg.model.hidden_size, cfg.model.num_layers, opts)
    if adapter.adjust_shape is not None:
        shape = adapter.adjust_shape(shape, cfg.model, opts)
    discriminator, generator = adapter.pair(model, shape)
    return ReplacedTokenDetection(
        discriminator,
        generator,
        tokenizer,
        opts.discriminator_weight,
        opts.temperature,
        adapter.mlm_transform,
        Contrastive(opts.contrastive_weight, opts.contrastive_temperature, opts.contrastive_crop),
    )


def rerun(cfg: Any, module: Any) -> tuple[int, float]:
    """The sequence-contrastive loss runs the discriminator again, forward and backward, on `contrastive_crop` of
    each sequence: its matmul weights (its input embedding is a lookup) for the FLOPs count."""
    opts = ElectraOptions.model_validate(cfg.objective.options)
    if opts.contrastive_weight == 0:
        return 0, 0.0
    disc = module.discriminator
    weights = sum(p.numel() for p in disc.parameters()) - disc.get_input_embeddings().weight.numel()
    return weights, opts.contrastive_crop


def export(cfg: Any, module: Any, out: Any, tokenizer: Any) -> Any:
    from pretrain.objectives.rtd import rtd_family

    return rtd_family(cfg.model.spec).export(cfg, module, out, tokenizer)


SPEC = ObjectiveSpec(
    "electra",
    ("full_sentences", "line_by_line"),
    build_collator=collator,
    wrap_model=wrap,
    export=export,
    validate=validate,
    options=ElectraOptions,
    needs_encoder=True,
    trains=carries_rtd,
    card_task="token_detection",
    rerun=rerun,
)
