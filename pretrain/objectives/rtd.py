"""Replaced-token detection (ELECTRA, Clark et al. 2020): the generator + discriminator module and the export of
both as Hugging Face folders. The spec and options are in core/specs.py, the collator (which draws `sample_u`) in
data_pipeline/objectives/electra.py.

Sampling. The reference code samples with Gumbel noise from TF's global RNG. Here each masked position's sample
is the inverse CDF of the generator's softmax at a uniform drawn by the collator from the counter-based stream
of (seed, epoch, sample_id, position) (see `_rng`): an exact draw from the same categorical distribution, with
no gradient through it, that a resumed, re-sharded or re-batched run reproduces bit for bit without carrying
any RNG state. Departures from the reference: the sample is restricted to the tokenizer's real, non-special
tokens (the reference may draw `[MASK]`, `[PAD]` or a padding row of the vocabulary into the discriminator's
input), and the generator predicts only the masked positions (as the reference's gather) in training.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

from data_pipeline.objectives.mlm import special_token_ids


def build_generator(discriminator_config: Any, shape: dict[str, int]):
    """An ElectraForMaskedLM of the given shape on the discriminator's vocabulary and embedding size."""
    from transformers import ElectraForMaskedLM

    config = copy.deepcopy(discriminator_config)
    for key, value in shape.items():
        setattr(config, key, value)
    config.architectures = None
    return ElectraForMaskedLM(config)


def sample_tokens(logits: torch.Tensor, allowed: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of `logits` [n, V] from softmax restricted to `allowed` [V], by inverse CDF at `u` [n]."""
    logits = logits.float().masked_fill(~allowed[: logits.shape[-1]], float("-inf"))
    cdf = torch.softmax(logits, dim=-1).cumsum(dim=-1)
    target = (u.float() * cdf[:, -1]).unsqueeze(-1)  # scaled by the total: float rounding never runs past it
    # The first index whose CDF exceeds the target: a token of zero probability (a flat step) is never picked.
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=logits.shape[-1] - 1)


@dataclass
class RTDOutput(ModelOutput):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    generator_loss: torch.Tensor | None = None
    discriminator_loss: torch.Tensor | None = None
    replaced: torch.Tensor | None = None  # [batch, length] 1 where the discriminator saw a replaced token
    # logged by the trainer (means over micro-batches and ranks)
    metrics: dict[str, torch.Tensor] | None = None


class ReplacedTokenDetection(nn.Module):
    """Generator + discriminator trained together; the generator uses the discriminator's embedding module.

    forward(input_ids, attention_mask, labels, sample_u) -> loss = MLM(generator) + weight * BCE(discriminator).
    Without labels (the parity probe): logits [batch, length, 1 + V] = the discriminator's logit, then the
    generator's vocabulary logits, at each position of the unmasked input.
    """

    def __init__(
        self,
        discriminator: nn.Module,
        generator: nn.Module,
        tokenizer: Any,
        weight: float = 50.0,
        temperature: float = 1.0,
        share_embeddings: bool = True,
    ):
        super().__init__()
        if generator.config.embedding_size != discriminator.config.embedding_size:
            raise ValueError(
                "generator and discriminator must have the same embedding size to share embeddings"
            )
        self.discriminator, self.generator = discriminator, generator
        if share_embeddings:
            generator.electra.embeddings = discriminator.electra.embeddings
            generator.generator_lm_head.weight = discriminator.electra.embeddings.word_embeddings.weight
        self.weight, self.temperature = float(weight), float(temperature)
        vocab = discriminator.config.vocab_size
        allowed = torch.zeros(vocab, dtype=torch.bool)
        allowed[: len(tokenizer)] = True  # padding rows of the embedding are never sampled
        allowed[[i for i in special_token_ids(tokenizer) if i < vocab]] = False
        self.register_buffer("allowed", allowed, persistent=False)

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        self.generator.gradient_checkpointing_enable(**kwargs)
        self.discriminator.gradient_checkpointing_enable(**kwargs)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        sample_u: torch.Tensor | None = None,
    ) -> RTDOutput:
        if labels is None:
            return RTDOutput(logits=self.probe(input_ids, attention_mask))
        if sample_u is None:
            raise ValueError("replaced-token detection needs `sample_u` from the electra collator")
        masked = labels != -100
        original = torch.where(masked, labels, input_ids)

        # Generator: MLM on the masked positions only (the reference gathers them before the output layer).
        hidden = self.generator.electra(input_ids, attention_mask=attention_mask).last_hidden_state
        logits = self.generator.generator_lm_head(self.generator.generator_predictions(hidden[masked]))
        targets = labels[masked]
        if targets.numel():
            gen_loss = F.cross_entropy(logits.float(), targets)
        else:  # no maskable token in the batch: a zero that still touches every generator weight
            gen_loss = logits.float().sum() * 0.0

        # Sample without gradient; a sample equal to the original counts as original (reference: labels are
        # masked & changed).
        with torch.no_grad():
            sampled = sample_tokens(logits.detach() / self.temperature, self.allowed, sample_u[masked])
        corrupted = original.masked_scatter(masked, sampled.to(original.dtype))
        replaced = (corrupted != original).long()

        disc_logits = self.discriminator(input_ids=corrupted, attention_mask=attention_mask).logits
        # BCE over every real (non-pad) token, in fp32 whatever the training precision (HF's own loss would mix a
        # bf16 logit with an fp32 target).
        real = torch.ones_like(masked) if attention_mask is None else attention_mask.bool()
        disc_loss = F.binary_cross_entropy_with_logits(disc_logits.float()[real], replaced[real].float())
        loss = gen_loss + self.weight * disc_loss
        with torch.no_grad():
            flagged, truth = disc_logits[real] > 0, replaced[real].bool()
            metrics = {
                "generator_loss": gen_loss.detach(),
                "discriminator_loss": disc_loss.detach(),
                "replaced_fraction": truth.float().mean(),  # of real tokens: the generator's errors
                "discriminator_accuracy": (flagged == truth).float().mean(),
                # Of the replaced tokens, how many the discriminator flags (0 while it predicts 'original' only).
                "replaced_recall": (flagged & truth).float().sum() / truth.float().sum().clamp(min=1),
            }
        return RTDOutput(
            loss=loss,
            logits=disc_logits,
            generator_loss=gen_loss.detach(),
            discriminator_loss=disc_loss.detach(),
            replaced=replaced,
            metrics=metrics,
        )

    def probe(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        disc = self.discriminator(input_ids=input_ids, attention_mask=attention_mask).logits
        gen = self.generator(input_ids=input_ids, attention_mask=attention_mask).logits
        return torch.cat([disc.unsqueeze(-1).float(), gen.float()], dim=-1)


GENERATOR_DIR = "generator"


def export_pair(module: ReplacedTokenDetection, out: Path, tokenizer: Any) -> nn.Module:
    """The discriminator as the HF folder `out` (ElectraForPreTraining), the generator in `out/generator`
    (ElectraForMaskedLM, embeddings copied in), each with the tokenizer. Returns both reloaded from disk, as a
    module whose probe logits must equal the engine's (export parity)."""
    from transformers import ElectraForMaskedLM, ElectraForPreTraining

    from data_pipeline.tokenizers import make_portable

    out = Path(out)
    for model, folder in ((module.discriminator, out), (module.generator, out / GENERATOR_DIR)):
        folder.mkdir(parents=True, exist_ok=True)
        model.save_pretrained(folder, safe_serialization=True)
        tokenizer.save_pretrained(folder)
        make_portable(folder)  # loads with transformers 4.40+ as well as 5.x
    reloaded = ReplacedTokenDetection(
        ElectraForPreTraining.from_pretrained(str(out)),
        ElectraForMaskedLM.from_pretrained(str(out / GENERATOR_DIR)),
        tokenizer,
        module.weight,
        module.temperature,
        share_embeddings=False,
    )
    return reloaded.eval()
