"""`model.init_from`: continued pretraining from an existing folder (an lmstack export, or any Hugging Face folder
of a registered family). The folder's config.json decides the architecture; it is read and checked at load,
before any work: the family, the weights, the vocabulary against the tokenizer, the positions against
packing.seq_len, and the pretraining head against the objective. Each refusal names the key or file and both
values."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from core.errors import ConfigError
from core.export_files import ExportMismatchError, verify_export
from core.layout import TOKENIZER
from core.paths import expand_placeholders
from core.registry import FAMILIES, OBJECTIVES
from core.specs import FamilySpec

# What transformers' from_pretrained loads weights from (sharded or not, safetensors or pickle).
WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

# model.<key> <- the first of these config.json keys present (the families name them differently).
ARCHITECTURE_KEYS = {
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "num_decoder_layers": ("num_decoder_layers",),
    "num_heads": ("num_attention_heads", "n_head", "num_heads"),
    "ffn_size": ("intermediate_size", "n_inner", "d_ff"),
    "d_kv": ("d_kv",),
    "max_position_embeddings": ("max_position_embeddings", "n_positions"),
    "tie_word_embeddings": ("tie_word_embeddings",),
}


def resolve_folder(raw: str) -> str:
    """The folder as an absolute local path (placeholders and ~ expanded); URLs are refused."""
    if "://" in raw and not raw.startswith("file://"):
        raise ValueError(f"model.init_from: '{raw}' is a URL; give a local folder (download it first)")
    return os.path.abspath(expand_placeholders(raw.removeprefix("file://")))


def folder_config(folder: str) -> dict[str, Any]:
    """The folder's config.json, after checking that the folder holds one and loadable weights."""
    path = Path(folder)
    if not path.is_dir():
        raise ValueError(f"model.init_from: '{folder}' is not a folder")
    config = path / "config.json"
    if not config.is_file():
        raise ValueError(f"model.init_from: {config} does not exist (not a Hugging Face model folder)")
    if not any((path / name).is_file() for name in WEIGHT_FILES):
        raise ValueError(
            f"model.init_from: '{folder}' holds no weights (none of {', '.join(WEIGHT_FILES)}); "
            "continued pretraining needs the trained weights, not only a config"
        )
    try:
        return json.loads(config.read_text())
    except (OSError, ValueError) as e:
        raise ValueError(f"model.init_from: {config} is not valid JSON: {e}") from None


def _class_name(ref: object) -> str | None:
    name = ref if isinstance(ref, str) else getattr(ref, "__name__", None)
    return None if name is None else name.rsplit(":", 1)[-1]


def architecture(config: dict[str, Any]) -> dict[str, Any]:
    """The model section's architecture keys, as the folder's config.json gives them."""
    out: dict[str, Any] = {}
    for key, names in ARCHITECTURE_KEYS.items():
        for name in names:
            if config.get(name) is not None:
                out[key] = config[name]
                break
    if "ffn_size" not in out and "n_embd" in config:  # GPT-2 leaves n_inner null: 4 x the width
        out["ffn_size"] = 4 * config["n_embd"]
    return out


def is_family_of(spec: FamilySpec, model_type: str | None, architectures: list[str] | None) -> bool:
    """The one rule for a folder's family: the built-in families are named by their transformers `model_type`;
    an outside one (the guide's `tinybert`, model_type `bert`) is known by its model class among the folder's
    `architectures`."""
    head = _class_name(spec.model_class)
    return model_type == spec.name or (head is not None and head in (architectures or []))


def find_family(model_type: str | None, architectures: list[str] | None) -> FamilySpec | None:
    """The registered family of a folder's config (`model_type` and `architectures`, from config.json or a
    transformers config): the family named by its model_type, else the first whose model class the folder
    saved (is_family_of); None where no registered family fits."""
    if model_type is not None and model_type in FAMILIES:
        return FAMILIES.get(model_type)
    return next((spec for _, spec in FAMILIES.items() if is_family_of(spec, model_type, architectures)), None)


def fill_model_section(data: dict[str, Any]) -> dict[str, Any]:
    """Before the model section is validated: the folder's family is checked and its architecture replaces the
    section's (the folder's config is what gets built)."""
    folder = resolve_folder(str(data["init_from"]))
    config = folder_config(folder)
    family = data.get("family", "roberta")
    got = config.get("model_type")
    if not is_family_of(FAMILIES.get(family), got, config.get("architectures")):
        raise ValueError(
            f"model.init_from: the folder's config.json has model_type '{got}', but model.family is '{family}' "
            "(set model.family to the folder's family)"
        )
    return {**data, **architecture(config), "init_from": folder}


def tokenizer_vocab(folder: str) -> dict[str, int] | None:
    """The token -> id map of the tokenizer saved in `folder`, read from its files without loading transformers
    (a config loads without ML frameworks): tokenizer.json (added tokens included), else vocab.json or
    vocab.txt. None: none of these files (nothing to check)."""
    path = Path(folder)
    if (path / "tokenizer.json").is_file():
        data = json.loads((path / "tokenizer.json").read_text())
        vocab = data.get("model", {}).get("vocab", {})
        if isinstance(vocab, list):  # Unigram: [piece, score] by id
            vocab = {piece: i for i, (piece, _) in enumerate(vocab)}
        return {**vocab, **{t["content"]: t["id"] for t in data.get("added_tokens", [])}}
    if (path / "vocab.json").is_file():
        return json.loads((path / "vocab.json").read_text())
    if (path / "vocab.txt").is_file():
        return {t: i for i, t in enumerate((path / "vocab.txt").read_text().splitlines())}
    return None


def _present(folder: str) -> list[str]:
    return [n for n in TOKENIZER_FILES if (Path(folder) / n).is_file()]


def check_run(cfg: Any) -> None:
    """Across sections: the run's tokenizer is the folder's (tokenizer.pretrained_path defaults to it), its
    vocabulary fits the folder's embedding, the folder's positions hold packing.seq_len, and the objective trains
    the head the folder carries."""
    folder = cfg.model.init_from
    config = folder_config(folder)
    try:  # adapt's check: whole weight files, and an export of ours still holding the weights it recorded
        verify_export(folder)
    except ExportMismatchError as e:
        raise ValueError(f"model.init_from: {e}") from None
    fam, obj = cfg.model.spec, cfg.objective.spec
    if obj.needs_encoder:  # replaced-token detection: a generator and a discriminator
        alone = sorted(n for n in fam.objectives if n in OBJECTIVES and not OBJECTIVES.get(n).needs_encoder)
        way = (
            f"continue it with objective.type {alone}"
            if alone
            else f"model.family '{fam.name}' trains with no other objective, so its folders cannot be continued"
        )
        raise ValueError(
            f"objective.type: '{obj.name}' trains a second model beside the family's (a generator), which "
            f"model.init_from ('{folder}') does not hold; {way}"
        )
    archs = config.get("architectures") or []
    head = _class_name(fam.model_class)
    if head and archs and head not in archs:
        raise ValueError(
            f"objective.type: '{obj.name}' trains {head}, but model.init_from's config.json "
            f"saved {archs}: its pretraining head is not in the folder"
        )
    if cfg.tokenizer.pretrained_path is None:
        if not _present(folder):
            raise ValueError(
                f"model.init_from: '{folder}' holds no tokenizer (none of {', '.join(TOKENIZER_FILES)}); "
                "set tokenizer.pretrained_path to the tokenizer the weights were trained with"
            )
        cfg.tokenizer.pretrained_path = folder  # the run tokenizes with the folder's own tokenizer
    tok_dir = resolve_folder(cfg.tokenizer.pretrained_path)
    if not _present(tok_dir):
        raise ValueError(
            f"tokenizer.pretrained_path: '{tok_dir}' holds no tokenizer (none of {', '.join(TOKENIZER_FILES)})"
        )
    vocab = tokenizer_vocab(tok_dir)
    n_tok = max(vocab.values(), default=-1) + 1 if vocab is not None else 0
    rows = config.get("vocab_size")
    if rows is not None and n_tok > rows:
        raise ValueError(
            f"tokenizer.pretrained_path: the tokenizer in '{tok_dir}' has {n_tok} tokens, but model.init_from's "
            f"config.json vocab_size is {rows}: ids past the embedding"
        )
    own_vocab = tokenizer_vocab(folder) if tok_dir != folder else None
    if own_vocab is not None and vocab is not None and own_vocab != vocab:
        n_own = max(own_vocab.values(), default=-1) + 1
        raise ValueError(
            f"tokenizer.pretrained_path: the tokenizer in '{tok_dir}' ({n_tok} tokens) is not the one "
            f"model.init_from's weights were trained with ('{folder}', {n_own} tokens)"
        )
    limit = fam.position_limit(cfg.model.max_position_embeddings)
    if limit is not None and cfg.packing.seq_len > limit:
        raise ValueError(
            f"packing.seq_len: {cfg.packing.seq_len} exceeds the {limit} positions of model.init_from's "
            f"config.json (max_position_embeddings {cfg.model.max_position_embeddings})"
        )
    if rows is not None:
        cfg.tokenizer.vocab_size = max(rows, 256)  # what the plan sizes the embedding by


def check_run_tokenizer(cfg: Any) -> None:
    """Before training (`pretrain plan`, `pretrain train`): the tokenizer a continued run's weights were trained
    with (tokenizer.pretrained_path, by default model.init_from's own) maps every token to the id the run's
    tokenizer/ gave it when tokens/ were made; other ids would train each embedding row on another token's text,
    without a word. Not at config load: rerunning `train-tokenizer` and `tokenize` is the way out, and they load
    the same config."""
    if cfg.model.init_from is None or cfg.tokenizer.pretrained_path is None or cfg.run.is_remote:
        return
    run_tok = Path(cfg.run.root) / TOKENIZER
    used = resolve_folder(cfg.tokenizer.pretrained_path)
    theirs, ours = tokenizer_vocab(used), tokenizer_vocab(str(run_tok)) if run_tok.is_dir() else None
    if theirs is None or ours is None or theirs == ours:
        return
    moved = sorted(t for t in theirs.keys() & ours.keys() if theirs[t] != ours[t])
    only = len(theirs.keys() ^ ours.keys())
    example = f"'{moved[0]}' is id {theirs[moved[0]]} there, {ours[moved[0]]} here" if moved else ""
    what = f"gives {len(moved)} of its {len(theirs)} tokens other ids than" if moved else "is not"
    raise ConfigError(
        f"tokenizer.pretrained_path: '{used}' {what} the run's tokenizer {run_tok}, which tokens/ were made with"
        + (f" (e.g. {example}" if example else " (")
        + (f"; {only} tokens are in only one of them" if only else "")
        + "): model.init_from's weights fit the first; rerun `python -m data_pipeline train-tokenizer` and "
        "`tokenize` for this run (or use a new run.output_dir)"
    )
