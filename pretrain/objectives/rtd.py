"""Replaced-token detection (ELECTRA, Clark et al. 2020) for any encoder family that declares it: the generator +
discriminator module and the export. The spec and options are in pretrain/objectives/electra.py, the collator
(which draws `sample_u`) in data_pipeline/objectives/electra.py.

A family carries RTD by naming an `RTDFamily` in its spec (`FamilySpec.rtd`): how it builds its discriminator (a
module whose output's `.logits` is one logit per token) and a smaller generator of the same family (an HF masked-LM
model) sharing the discriminator's embeddings, and how it exports them. `ELECTRA` keeps transformers' ELECTRA
classes (`ElectraForPreTraining` + `ElectraForMaskedLM`, two folders); `MODERNBERT` trains a ModernBERT body with a
detection head and a narrower ModernBERT generator, and exports the discriminator's body as `ModernBertModel`.
The loss, sampling and metrics below are the same for every family.

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
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.utils import ModelOutput

from data_pipeline.objectives.mlm import special_token_ids


def generator_config(discriminator_config: Any, shape: dict[str, int]) -> Any:
    """The discriminator's HF config with the generator's width, depth, heads and FFN."""
    config = copy.deepcopy(discriminator_config)
    for key, value in shape.items():
        setattr(config, key, value)
    config.architectures = None
    return config


def build_generator(discriminator_config: Any, shape: dict[str, int]):
    """An ElectraForMaskedLM of the given shape on the discriminator's vocabulary and embedding size."""
    from transformers import ElectraForMaskedLM

    return ElectraForMaskedLM(generator_config(discriminator_config, shape))


def sample_tokens(logits: torch.Tensor, allowed: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One token per row of `logits` [n, V] from softmax restricted to `allowed` [V], by inverse CDF at `u` [n]."""
    logits = logits.float().masked_fill(~allowed[: logits.shape[-1]], float("-inf"))
    cdf = torch.softmax(logits, dim=-1).cumsum(dim=-1)
    target = (u.float() * cdf[:, -1]).unsqueeze(-1)  # scaled by the total: float rounding never runs past it
    # The first index whose CDF exceeds the target: a token of zero probability (a flat step) is never picked.
    return torch.searchsorted(cdf, target, right=True).squeeze(-1).clamp_(max=logits.shape[-1] - 1)


@dataclass(frozen=True)
class Contrastive:
    """COCO-LM's sequence-contrastive loss (Meng et al. 2021) beside RTD: `weight` x InfoNCE between the
    discriminator's mean-pooled last states of each corrupted sequence and of a cropped view of its original (a
    contiguous `crop` of its length, starting where the collator's `crop_u` says), the micro-batch's other sequences
    the negatives, cosine similarity / `temperature`, both directions averaged. Weight 0: off."""

    weight: float = 0.0
    temperature: float = 0.1
    crop: float = 0.9


def mean_pooled(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Each row's mean over its real tokens, unit length (the fine-tuning head's `classifier_pooling: mean`)."""
    weights = mask.float().unsqueeze(-1)
    pooled = (hidden.float() * weights).sum(1) / weights.sum(1).clamp(min=1)
    return F.normalize(pooled, dim=-1)


def cropped_view(
    input_ids: torch.Tensor, mask: torch.Tensor, crop_u: torch.Tensor, fraction: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """A contiguous `fraction` of each row (at least one token), starting at floor(crop_u x the starts possible)."""
    length = input_ids.shape[1]
    keep = max(1, round(fraction * length))
    start = (crop_u.float() * (length - keep + 1)).long().clamp_(max=length - keep)
    index = start.unsqueeze(1) + torch.arange(keep, device=input_ids.device).unsqueeze(0)
    return input_ids.gather(1, index), mask.gather(1, index)


def info_nce(a: torch.Tensor, b: torch.Tensor, temperature: float) -> torch.Tensor:
    """Symmetric InfoNCE of unit rows: row i of `a` and of `b` are the positive pair, every other row a negative."""
    sim = a @ b.T / temperature
    target = torch.arange(len(a), device=a.device)
    return 0.5 * (F.cross_entropy(sim, target) + F.cross_entropy(sim.T, target))


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

    forward(input_ids, attention_mask, labels, sample_u) -> loss = MLM(generator) + weight * BCE(discriminator)
    (+ the sequence-contrastive loss where `contrastive.weight` > 0, with the collator's `crop_u`). Without labels
    (the parity probe): logits [batch, length, 1 + V] = the discriminator's logit, then the generator's vocabulary
    logits, at each position of the unmasked input.
    """

    def __init__(
        self,
        discriminator: nn.Module,
        generator: nn.Module,
        tokenizer: Any,
        weight: float = 50.0,
        temperature: float = 1.0,
        mlm_transform: str = "generator_predictions",
        contrastive: Contrastive = Contrastive(),
    ):
        super().__init__()
        self.contrastive = contrastive
        self.discriminator, self.generator = discriminator, generator
        self.mlm_transform = mlm_transform  # the generator's head before its vocabulary projection
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
        crop_u: torch.Tensor | None = None,
    ) -> RTDOutput:
        if labels is None:
            return RTDOutput(logits=self.probe(input_ids, attention_mask))
        if sample_u is None:
            raise ValueError("replaced-token detection needs `sample_u` from the electra collator")
        contrast = self.contrastive.weight > 0
        masked = labels != -100
        original = torch.where(masked, labels, input_ids)

        # Generator: MLM on the masked positions only (the reference gathers them before the output layer).
        hidden = self.generator.base_model(input_ids, attention_mask=attention_mask).last_hidden_state
        transform = getattr(self.generator, self.mlm_transform)
        logits = self.generator.get_output_embeddings()(transform(hidden[masked]))
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

        hidden = {"output_hidden_states": True} if contrast else {}
        disc = self.discriminator(input_ids=corrupted, attention_mask=attention_mask, **hidden)
        disc_logits = disc.logits
        # BCE over every real (non-pad) token, in fp32 whatever the training precision (HF's own loss would mix a
        # bf16 logit with an fp32 target).
        real = torch.ones_like(masked) if attention_mask is None else attention_mask.bool()
        disc_loss = F.binary_cross_entropy_with_logits(disc_logits.float()[real], replaced[real].float())
        loss = gen_loss + self.weight * disc_loss
        extra: dict[str, torch.Tensor] = {}
        if contrast:
            if crop_u is None:
                raise ValueError("the sequence-contrastive loss needs `crop_u` from the electra collator")
            view, view_mask = cropped_view(original, real, crop_u, self.contrastive.crop)
            view_states = self.discriminator(
                input_ids=view, attention_mask=view_mask.long(), output_hidden_states=True
            ).hidden_states[-1]
            scl = info_nce(
                mean_pooled(disc.hidden_states[-1], real),
                mean_pooled(view_states, view_mask),
                self.contrastive.temperature,
            )
            loss = loss + self.contrastive.weight * scl
            extra["contrastive_loss"] = scl.detach()
        with torch.no_grad():
            flagged, truth = disc_logits[real] > 0, replaced[real].bool()
            metrics = {
                "generator_loss": gen_loss.detach(),
                "discriminator_loss": disc_loss.detach(),
                "replaced_fraction": truth.float().mean(),  # of real tokens: the generator's errors
                "discriminator_accuracy": (flagged == truth).float().mean(),
                # Of the replaced tokens, how many the discriminator flags (0 while it predicts 'original' only).
                "replaced_recall": (flagged & truth).float().sum() / truth.float().sum().clamp(min=1),
                **extra,
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
        module.mlm_transform,
    )
    return reloaded.eval()


# ------------------------------------------------------------------------------------------- families' RTD


@dataclass(frozen=True)
class RTDFamily:
    """How a family carries replaced-token detection (named by its spec's `rtd`)."""

    # (the family's model as built, the generator's shape) -> (discriminator, generator), the generator using
    # the discriminator's embeddings
    pair: Callable[[Any, dict[str, int]], tuple[nn.Module, nn.Module]]
    mlm_transform: (
        str  # the generator's head applied before its output embeddings (the vocabulary projection)
    )
    # (run config, trained module, out folder, tokenizer) -> the export reloaded from disk (parity)
    export: Callable[[Any, ReplacedTokenDetection, Path, Any], nn.Module]
    # (generator shape, discriminator's HF config) -> the shape this family builds (e.g. its own FFN ratio)
    adjust_shape: Callable[[dict[str, int], Any, Any], dict[str, int]] | None = None


def rtd_family(family: Any) -> RTDFamily:
    """The family spec's RTD adapter; a family without one was refused at load (objective.type)."""
    from core.specs import resolve

    if family.rtd is None:
        raise ValueError(f"objective.type: model.family '{family.name}' declares no replaced-token detection")
    return resolve(family.rtd)


def _electra_pair(discriminator: nn.Module, shape: dict[str, int]) -> tuple[nn.Module, nn.Module]:
    """ElectraForPreTraining as built + an ElectraForMaskedLM sharing its whole embedding module (word, position,
    segment tables and LayerNorm at the embedding size; each network projects to its own width)."""
    generator = build_generator(discriminator.config, shape)
    if generator.config.embedding_size != discriminator.config.embedding_size:
        raise ValueError("generator and discriminator must have the same embedding size to share embeddings")
    generator.electra.embeddings = discriminator.electra.embeddings
    generator.generator_lm_head.weight = discriminator.electra.embeddings.word_embeddings.weight
    return discriminator, generator


ELECTRA = RTDFamily(
    pair=_electra_pair,
    mlm_transform="generator_predictions",
    export=lambda cfg, module, out, tokenizer: export_pair(module, out, tokenizer),
)
"""transformers' ELECTRA classes: the discriminator and generator exported as two HF folders."""


@dataclass
class DetectorOutput(ModelOutput):
    logits: torch.Tensor | None = None
    hidden_states: tuple[torch.Tensor, ...] | None = None  # (the body's last states,) when asked for


class TokenDetector(nn.Module):
    """An encoder body + ELECTRA's detection head (dense, GELU, one logit per token): the discriminator of a family
    whose HF classes have no replaced-token-detection model. The body is what the export carries."""

    def __init__(self, body: nn.Module):
        super().__init__()
        self.body = body
        h = body.config.hidden_size
        self.head = nn.Sequential(nn.Linear(h, h), nn.GELU(), nn.Linear(h, 1))
        std = body.config.initializer_range
        for layer in (self.head[0], self.head[2]):
            nn.init.normal_(layer.weight, std=std)
            nn.init.zeros_(layer.bias)

    @property
    def config(self) -> Any:
        return self.body.config

    def gradient_checkpointing_enable(self, **kwargs: Any) -> None:
        self.body.gradient_checkpointing_enable(**kwargs)

    def get_input_embeddings(self) -> nn.Module:
        return self.body.get_input_embeddings()

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False,
    ) -> DetectorOutput:
        hidden = self.body(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        logits = self.head(hidden).squeeze(-1)
        # only the last states (what the export's users read), not every layer's as HF models give
        return DetectorOutput(logits=logits, hidden_states=(hidden,) if output_hidden_states else None)


class ProjectedEmbeddings(nn.Module):
    """The discriminator's embedding module shared by a narrower generator: its output projected to the
    generator's width (ELECTRA's `embeddings_project`)."""

    def __init__(self, shared: nn.Module, width: int, out_width: int):
        super().__init__()
        self.shared = shared
        self.project = nn.Linear(width, out_width) if width != out_width else nn.Identity()
        if isinstance(self.project, nn.Linear):
            nn.init.normal_(self.project.weight, std=shared.config.initializer_range)
            nn.init.zeros_(self.project.bias)

    def forward(self, input_ids: torch.Tensor | None = None, inputs_embeds: torch.Tensor | None = None):
        return self.project(self.shared(input_ids=input_ids, inputs_embeds=inputs_embeds))


class TiedDecoder(nn.Module):
    """The vocabulary projection of a generator whose head outputs the discriminator's width, with the
    discriminator's token embedding matrix as its weight (ELECTRA ties the generator's output to the input
    embeddings) and a bias of its own."""

    def __init__(self, embedding: nn.Embedding, bias: bool = True):
        super().__init__()
        self.weight = embedding.weight
        self.bias = nn.Parameter(torch.zeros(embedding.num_embeddings)) if bias else None

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return F.linear(hidden, self.weight, self.bias)


def _modernbert_shape(shape: dict[str, int], m: Any, opts: Any) -> dict[str, int]:
    """The generator's GLU keeps the discriminator's FFN ratio (model.ffn_size / model.hidden_size) unless
    objective.options.generator_ffn_size sets it; heads of 64 as the reference unless set."""
    if opts.generator_ffn_size is None:
        shape = {
            **shape,
            "intermediate_size": max(1, round(m.ffn_size * shape["hidden_size"] / m.hidden_size)),
        }
    return shape


def _modernbert_pair(model: nn.Module, shape: dict[str, int]) -> tuple[nn.Module, nn.Module]:
    """The discriminator: the built model's ModernBertModel body + a detection head. The generator: a
    ModernBertForMaskedLM of the generator's shape whose embeddings are the discriminator's (projected to its
    width) and whose head projects back to the discriminator's width for the tied vocabulary projection."""
    from transformers import ModernBertForMaskedLM

    body = model.model  # ModernBertForMaskedLM as the family builds it; its MLM head is not trained
    discriminator = TokenDetector(body)
    config = generator_config(body.config, shape)
    generator = ModernBertForMaskedLM(config)
    width, g = body.config.hidden_size, config.hidden_size
    generator.model.embeddings = ProjectedEmbeddings(body.embeddings, width, g)
    head = generator.head  # dense -> act -> LayerNorm, ending at the discriminator's width
    head.dense = nn.Linear(g, width, bias=config.classifier_bias)
    head.norm = nn.LayerNorm(width, eps=config.norm_eps, bias=config.norm_bias)
    nn.init.normal_(head.dense.weight, std=config.initializer_range)
    generator.decoder = TiedDecoder(body.embeddings.tok_embeddings, bias=config.decoder_bias)
    return discriminator, generator


BODY_HEAD_FILE = "rtd_head.safetensors"


def _modernbert_export(cfg: Any, module: ReplacedTokenDetection, out: Path, tokenizer: Any) -> nn.Module:
    """The discriminator's body as the HF folder `out` (ModernBertModel, with the family's export config: dense
    logits), loadable by AutoModel and AutoModelForSequenceClassification; the detection head and the generator
    in `rtd_head.safetensors` (the module's other tensors, for parity and continued RTD). Returns the module
    rebuilt from these files."""
    from safetensors.torch import load_file, save_file
    from transformers import ModernBertModel

    from data_pipeline.tokenizers import make_portable

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    body = module.discriminator.body
    for key, value in cfg.model.spec.export_config.items():
        setattr(body.config, key, value)
    body.config.architectures = ["ModernBertModel"]
    body.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    make_portable(out)
    body_ids = {id(p) for p in body.parameters()}
    rest = {
        k: v.detach().contiguous().clone()
        for k, v in module.state_dict(keep_vars=True).items()
        if id(v) not in body_ids
    }
    save_file(rest, str(out / BODY_HEAD_FILE))

    reloaded_body = ModernBertModel.from_pretrained(str(out))
    disc, gen = _modernbert_pair(_BodyHolder(reloaded_body), _shape_of(module.generator.config))
    rebuilt = ReplacedTokenDetection(
        disc, gen, tokenizer, module.weight, module.temperature, module.mlm_transform
    )
    missing, unexpected = rebuilt.load_state_dict(load_file(str(out / BODY_HEAD_FILE)), strict=False)
    body_ids = {id(p) for p in reloaded_body.parameters()}
    from_body = {k for k, v in rebuilt.state_dict(keep_vars=True).items() if id(v) in body_ids}
    if unexpected or set(missing) - from_body:
        raise RuntimeError(f"RTD export does not reload: missing={missing} unexpected={unexpected}")
    return rebuilt.eval()


class _BodyHolder(nn.Module):
    """What `_modernbert_pair` reads of the family's built model: its `model` (the body)."""

    def __init__(self, body: nn.Module):
        super().__init__()
        self.model = body


def _shape_of(config: Any) -> dict[str, int]:
    keys = ("hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    return {k: getattr(config, k) for k in keys}


MODERNBERT = RTDFamily(
    pair=_modernbert_pair, mlm_transform="head", export=_modernbert_export, adjust_shape=_modernbert_shape
)
"""ModernBERT (issue 46): body + detection head as the discriminator, exported as ModernBertModel."""
