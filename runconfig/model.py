"""Model family and size. Presets in configs/ mirror the papers' sizes; every field can be overridden."""

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from core.registry import FAMILIES
from core.specs import FamilySpec
from runconfig.base import Section, checks_plugin_options, registered_in


class ModelConfig(Section):
    # a registered family (`lmstack.families` entry point; built-ins: pyproject.toml)
    family: Annotated[str, registered_in(FAMILIES)] = "roberta"
    size: str = "tiny"  # a label for the preset (tiny, base, large, small, medium); the numbers below decide
    hidden_size: int = Field(128, gt=0)
    num_layers: int = Field(2, gt=0)
    num_decoder_layers: int | None = None  # T5 only; defaults to num_layers
    num_heads: int = Field(2, gt=0)
    ffn_size: int = Field(512, gt=0)
    d_kv: int | None = None  # T5 only; defaults to hidden_size // num_heads
    max_position_embeddings: int = Field(514, gt=0)  # RoBERTa reserves 2 positions (padding_idx + 1)
    dropout: float = Field(0.1, ge=0, lt=1)
    attention_dropout: float = Field(0.1, ge=0, lt=1)
    layer_norm_eps: float = Field(1e-5, gt=0)
    initializer_range: float = Field(0.02, gt=0)
    # T5 v1.0: relu; v1.1: gated-gelu (untied head). We follow the original paper by default.
    feed_forward_proj: str = "relu"
    tie_word_embeddings: bool = True
    # Pad the embedding matrix for fast matmuls; extra rows are never produced (their logits are masked).
    vocab_pad_multiple: int = Field(8, ge=1)
    # Family-specific keys, typed by the family's spec (`FamilySpec.options`), e.g. ModernBERT's local attention.
    options: dict[str, Any] = Field(default_factory=dict)
    # Continued pretraining: an lmstack export or a Hugging Face folder of this family (local). Its weights,
    # config and tokenizer are the run's: the architecture keys above are read from its config.json, and
    # tokenizer.pretrained_path defaults to it. A resumed run loads its checkpoint instead.
    init_from: str | None = None
    # sp: the family's own parametrization. mup: Tensor Programs V (Yang et al. 2022) for Adam, relative to a model
    # of width mup_base_width: hidden weights' init std and LR scaled by base/width, logits by base/width,
    # attention by 1/head_dim; a LR tuned at the base width then holds at every width (pretrain/run/mup.py).
    parametrization: Literal["sp", "mup"] = "sp"
    mup_base_width: int | None = Field(None, gt=0)  # the width the LR was tuned at (required with mup)
    # FP8 training (torchao.float8, as torchtitan): the decoder blocks' linears run their three matmuls in float8
    # with dynamic scales, one per tensor (tensorwise) or per row (rowwise); the LM head, embeddings and norms stay in
    # deepspeed.precision, and the weights, checkpoints and export stay high precision. Needs a GPU of compute
    # capability >= 8.9 (Hopper, Ada) and a family that declares its block linears (gpt2, llama).
    float8: Literal["none", "tensorwise", "rowwise"] = "none"
    # torchao's emulation of the float8 matmuls (same casts, high-precision products): runs on CPU, for tests; no
    # speed-up anywhere
    float8_emulate: bool = False

    @model_validator(mode="before")
    @classmethod
    def _from_folder(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("init_from"):
            from runconfig.init_from import fill_model_section

            return fill_model_section(data)
        return data

    @property
    def spec(self) -> FamilySpec:
        """The family's registered spec: the one place its name is looked up; the run reads it from here."""
        return FAMILIES.get(self.family)

    @property
    def position_limit(self) -> int | None:
        """The longest sequence the family's position table allows (None: no table bounds it)."""
        return self.spec.position_limit(self.max_position_embeddings)

    # The family's builder fills in the defaults of what the check leaves unset.
    _family_options = checks_plugin_options("model.options", "family", "family")

    @model_validator(mode="after")
    def _heads_divide(self) -> "ModelConfig":
        if self.d_kv is None and self.hidden_size % self.num_heads:
            raise ValueError(
                f"model.hidden_size ({self.hidden_size}) must be divisible by model.num_heads ({self.num_heads})"
            )
        return self

    @model_validator(mode="after")
    def _mup(self) -> "ModelConfig":
        if self.parametrization == "sp":
            if self.mup_base_width is not None:
                raise ValueError("model.mup_base_width applies to model.parametrization: mup")
            return self
        if self.spec.mup_readout is None:
            raise ValueError(
                f"model.parametrization: mup is not declared for family '{self.family}' (its spec has no mup_readout)"
            )
        if self.mup_base_width is None:
            raise ValueError(
                "model.mup_base_width: required with model.parametrization: mup (the width the LR was tuned at)"
            )
        if self.mup_base_width > self.hidden_size:
            raise ValueError(
                f"model.mup_base_width ({self.mup_base_width}) is above model.hidden_size ({self.hidden_size}): "
                "the base is the small model the LR was tuned on"
            )
        if self.init_from is not None:
            raise ValueError(
                "model.parametrization: mup trains from scratch; model.init_from's weights are SP"
            )
        return self

    @model_validator(mode="after")
    def _float8(self) -> "ModelConfig":
        if self.float8 == "none":
            if self.float8_emulate:
                raise ValueError("model.float8_emulate applies to model.float8: tensorwise or rowwise")
            return self
        shapes = self.spec.float8_linears
        if shapes is None:
            raise ValueError(
                f"model.float8: {self.float8} is not declared for family '{self.family}' (its spec has no "
                "float8_linears); families with FP8: "
                + ", ".join(n for n in FAMILIES.names() if FAMILIES.get(n).float8_linears is not None)
            )
        for name, dims in shapes(self).items():
            if any(d % 16 for d in dims):
                raise ValueError(
                    f"model.float8: the block linear '{name}' is {dims[0]}x{dims[1]}; FP8 matmuls need both widths "
                    "to be multiples of 16 (model.hidden_size, model.ffn_size, heads x head width)"
                )
        return self

    @property
    def width_mult(self) -> float:
        """hidden_size / mup_base_width under μP, 1 otherwise."""
        return (
            self.hidden_size / self.mup_base_width
            if self.parametrization == "mup" and self.mup_base_width
            else 1.0
        )
