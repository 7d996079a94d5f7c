"""DeepSpeed checkpoint -> Hugging Face folder (safetensors, config, tokenizer, generation config, model card).

Weights are consolidated on the CPU from the ZeRO shards with DeepSpeed's zero_to_fp32 (lazy, tensor by tensor),
so a ZeRO-3 model is exported without ever being whole on one rank's GPU.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

import torch
from transformers import AutoTokenizer, GenerationConfig, PreTrainedModel

from core.errors import CannotContinueError
from core.export_files import weight_files
from core.io import follow_umask, replace_dir, sha256_bytes
from core.layout import CLEAN_STATS, TOKEN_MANIFEST
from core.log import get_logger, third_party_prints
from core.run_layout import RunLayout
from core.storage import RunStore
from data_pipeline.tokenizers import frame_pairs, make_portable
from pretrain.checkpoint import safe_load
from pretrain.checkpoint.disk import disk_full, free_bytes
from pretrain.checkpoint.meta import COMPLETE, TAG_RE, complete_tags, read_complete
from pretrain.checkpoint.parity import PROBE_FILE, check_parity
from pretrain.checkpoint.remote import fetch_url
from pretrain.checkpoint.resume import find_resume_tag, select_resume_tag
from pretrain.checkpoint.tokenizer import check_tokenizer
from pretrain.export.folder import (
    TRAINING_STATE,
    check_export_target,
    make_staging,
    started_from,
    weights_hash,
)
from pretrain.export.merge import merged_state_dict, tags_to_merge
from pretrain.export.model_card import write_model_card
from pretrain.objectives import wrap_model
from pretrain.run import mup
from pretrain.run.models import build_model
from pretrain.tools.decay import read_branch
from runconfig import RunConfig

log = get_logger(__name__)


def resolve_checkpoint(cfg: RunConfig, checkpoint: str | None) -> tuple[Path, str]:
    """Accepts a tag folder, a checkpoints folder (newest complete tag), or None (the run's own); any of them may
    be a URL (s3://.../checkpoints[/stepNNNNNNNN]), downloaded into the staging folder, as is the run's own
    checkpoint on a remote run."""
    remote = cfg.checkpoint_remote if not checkpoint else None
    if checkpoint and "://" in checkpoint and not checkpoint.startswith("file://"):
        url = checkpoint.rstrip("/")
        cache = Path(cfg.run.root) / "fetched-checkpoints"
        if TAG_RE.match(url.rsplit("/", 1)[-1]):  # one checkpoint
            local, tag = fetch_url(url, cache)
            checkpoint = str(local / tag)
        else:  # a checkpoints folder: its newest complete checkpoint, below
            remote = url
            checkpoint = str(cache / sha256_bytes(url)[:12])
    path = Path(checkpoint.removeprefix("file://")) if checkpoint else Path(cfg.checkpoint_dir)
    if (path / COMPLETE).is_file():
        print(f"[export] exporting {path.name} (the checkpoint given)", file=sys.stderr, flush=True)
        return path.parent, path.name
    tag = select_resume_tag(path, remote=remote) if remote else find_resume_tag(path)
    if tag is None:
        raise FileNotFoundError(f"no complete checkpoint (a step folder with {COMPLETE}) under {path}")
    print(f"[export] {_why(path, tag)}", file=sys.stderr, flush=True)
    return path, tag


def _why(ckpt_dir: Path, tag: str) -> str:
    """Which step is exported and why, naming newer steps passed over (incomplete, or damaged)."""
    newer = (
        sorted({p.name for p in ckpt_dir.iterdir() if TAG_RE.match(p.name) and p.name > tag})
        if ckpt_dir.is_dir()
        else []
    )
    latest = ckpt_dir / "latest"
    pointed = latest.read_text().strip() if latest.is_file() else None
    if pointed and pointed != tag and pointed not in newer and TAG_RE.match(pointed) and pointed > tag:
        newer.append(pointed)
    if not newer:
        return f"exporting {tag}: the newest complete checkpoint"
    why = [
        f"{t} is {'incomplete (no ' + COMPLETE + ')' if not (ckpt_dir / t / COMPLETE).is_file() else 'damaged'}"
        for t in newer[::-1]
    ]
    return f"{'; '.join(why)}: exporting {tag}"


def _swap_into_place(stage: Path, final: Path) -> None:
    """The staged export becomes `final` by rename (the earlier export, transfer.json included, goes): a killed
    export leaves the previous folder whole, or inside the hidden staging folder the next export removes."""
    replace_dir(stage, final, aside=stage.parent / f"{final.name}.previous")
    shutil.rmtree(stage.parent, ignore_errors=True)


def consolidated_state_dict(ckpt_dir: Path, tag: str) -> dict[str, torch.Tensor]:
    meta = read_complete(ckpt_dir, tag)
    if meta.get("zero_stage", 0) >= 1:
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

        with third_party_prints("DeepSpeed"):  # "Processing zero checkpoint ..." and three more print()s
            lazy = get_fp32_state_dict_from_zero_checkpoint(str(ckpt_dir), tag=tag, lazy_mode=True)
            return {k: v.contiguous().float() for k, v in lazy.items()}
    states = safe_load.load(ckpt_dir / tag / "mp_rank_00_model_states.pt")
    return {k: v.float() for k, v in states["module"].items()}


def client_state(ckpt_dir: Path, tag: str) -> dict[str, Any]:
    """Our client state rides in rank 0's model-states file (named `zero_pp_rank_0_...` under ZeRO-3)."""
    folder = ckpt_dir / tag
    path = folder / "mp_rank_00_model_states.pt"
    if not path.is_file():
        path = folder / "zero_pp_rank_0_mp_rank_00_model_states.pt"
    states = safe_load.load(path)
    keep = ("step", "tokens_seen", "loss", "plan")
    return {k: states[k] for k in keep if k in states}


def _loaded_through_an_alias(model: torch.nn.Module, missing: list[str]) -> set[str]:
    """Missing keys whose parameter is shared with a key that was loaded (a module used twice, e.g. ELECTRA's
    embeddings shared by generator and discriminator): loading one name filled them all."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    gone = set(missing)
    return {
        k for group in names.values() if len(group) > 1 and not set(group) <= gone for k in group if k in gone
    }


def load_trained_model(
    cfg: RunConfig, ckpt_dir: Path, tag: str, tokenizer: Any, merge: list[str] | None = None
) -> torch.nn.Module:
    """The module the trainer checkpointed (the family's model, or the objective's wrapper around it), loaded;
    with `merge`, the mean of those checkpoints' weights (pretrain/export/merge.py)."""
    for t in merge or [tag]:
        check_tokenizer(ckpt_dir, t, RunLayout(cfg).tokenizer, len(tokenizer))
    # init_from's weights are not read: the checkpoint's replace every tensor
    model = wrap_model(cfg, build_model(cfg.model, tokenizer, cfg.packing.seq_len, weights=False), tokenizer)
    if merge:
        sd = merged_state_dict(merge, lambda t: consolidated_state_dict(ckpt_dir, t))
    else:
        sd = consolidated_state_dict(ckpt_dir, tag)
    missing, unexpected = model.load_state_dict(sd, strict=False)
    tied = set(getattr(model, "_tied_weights_keys", None) or [])  # a list (4.x) or a dict keyed by name (5.x)
    shared = _loaded_through_an_alias(model, missing)
    real_missing = [k for k in missing if k not in tied and k not in shared]
    if real_missing or unexpected:
        raise RuntimeError(
            f"checkpoint {ckpt_dir / tag} does not match the model: missing={real_missing} "
            f"unexpected={unexpected}"
        )
    if isinstance(model, PreTrainedModel):
        model.tie_weights()
    return model.eval()


def _load_heads(family: Any, out: Path) -> dict[str, str]:
    """Each fine-tuning head the family promises loads from the folder (its new head weights are expected, so
    transformers' missing-weights report is silenced)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return {
            name: type(family.auto_cls(name).from_pretrained(str(out))).__name__
            for name in family.export_heads
        }
    finally:
        hf_logging.set_verbosity(level)


def export(
    cfg: RunConfig, checkpoint: str | None = None, out_dir: str | None = None, merge_last: int | None = None
) -> Path:
    """Write the HF folder locally (`out_dir`, default <run>/export); when `out_dir` is a URL, or the run folder
    is remote and no `out_dir` is given, the folder is written in the staging folder and then uploaded (its
    model card last). `merge_last` K: the mean of the last K complete checkpoints up to the one chosen. Returns
    the local folder."""
    layout = RunLayout(cfg)
    remote_out = bool(out_dir and "://" in out_dir and not out_dir.startswith("file://"))
    if not remote_out:  # before any work: never replace what is not an export of ours
        check_export_target(Path(out_dir.removeprefix("file://")) if out_dir else layout.export)
    ckpt_dir, tag = resolve_checkpoint(cfg, checkpoint)
    merge = tags_to_merge(complete_tags(ckpt_dir), tag, merge_last, ckpt_dir) if merge_last else None
    # before anything of it is unpickled (zero_to_fp32 loads with weights_only=False): no file may name code
    for t in merge or [tag]:
        safe_load.check_folder(ckpt_dir / t)
    upload: RunStore | None = None
    if out_dir and remote_out:
        digest = sha256_bytes(out_dir)[:12]
        out = layout.root / "export-staging" / digest
        upload = RunStore(out, out_dir.rstrip("/"))
    else:
        out = Path(out_dir.removeprefix("file://")) if out_dir else layout.export
        if not out_dir and layout.store.remote:
            upload = RunStore(layout.export, layout.store.url(layout.export))
    # a remote run: what the export and its model card read (tokenizer, manifest, clean stats, metrics)
    layout.store.pull(
        [layout.tokenizer, layout.tokens / TOKEN_MANIFEST, layout.clean / CLEAN_STATS, layout.logs]
    )
    if upload is not None and out.exists():
        shutil.rmtree(out)  # nothing of an older export may be uploaded with this one
    final = out
    # Written in a staging folder (same parent, so the rename is atomic; same folder name, which the card uses)
    # with COMPLETE last, then renamed into place.
    # one a killed export left goes first; check_export_target has refused anything else of that name
    staging = make_staging(final)
    out = staging / final.name
    try:
        _write_staged(cfg, layout, ckpt_dir, tag, out, final, merge)
    except Exception as e:  # nothing half-written stays behind; a full disk is one line, as for a checkpoint
        free = free_bytes(final.parent)
        shutil.rmtree(staging, ignore_errors=True)
        if not isinstance(e, CannotContinueError) and disk_full(e, free):
            raise CannotContinueError(
                f"exporting to {final} failed: the disk is full ({free / 2**20:.1f} MiB free on the filesystem "
                f"of {final.parent}); the staging folder was removed"
                + (" and the previous export is left whole" if final.exists() else "")
                + "; free space, then export again"
            ) from None
        raise
    out = final
    if upload is not None:
        upload = RunStore(out, upload.remote)
        upload.remove(out)
        files = sorted(p for p in out.rglob("*") if p.is_file())
        upload.push([p for p in files if p.name != "README.md"])
        upload.push([p for p in files if p.name == "README.md"])  # the card last: the folder is complete
        log.info(f"[export] uploaded {len(files)} files to {upload.remote}")
    return out


def _parity(
    cfg: RunConfig, probe: Path, reloaded: Any, out: Path, merged: torch.nn.Module | None
) -> float | None:
    """Max |logit difference| between the reloaded export and the engine on the saved probe batch (None without
    one); a merge is checked against the merged module itself, whose weights the engine never held."""
    if not probe.is_file():
        return None
    if reloaded is None:
        reloaded = cfg.model.spec.auto_cls().from_pretrained(str(out))
    diff = check_parity(reloaded, probe, reference=merged)
    if diff > 1e-5 and cfg.deepspeed.precision == "fp32":
        raise RuntimeError(
            f"export parity failed: max |logit difference| {diff:.3g} > 1e-5 between the engine and the reloaded export"
        )
    return diff


def _origin(cfg: RunConfig, layout: RunLayout, merge: list[str] | None) -> dict[str, Any]:
    """Where the weights came from, for training_state.json and the card: merged checkpoints, a decay branch of
    another run (pretrain/tools/decay.py), the weights a continued run started from."""
    out: dict[str, Any] = {}
    if merge:
        out["merged_from"] = merge
    branch = read_branch(layout.root)
    if branch:
        out["decay_branch"] = branch
    if cfg.model.init_from is not None:
        out["init_from"] = started_from(cfg.model.init_from)
    return out


def _write_staged(
    cfg: RunConfig,
    layout: RunLayout,
    ckpt_dir: Path,
    tag: str,
    out: Path,
    final: Path,
    merge: list[str] | None = None,
) -> None:
    """The export, written into the staging folder `out` (COMPLETE last), then renamed into place as `final`."""
    out.mkdir(parents=True)
    tokenizer = AutoTokenizer.from_pretrained(str(layout.tokenizer))
    # tokenizer(a, b) of the export frames a pair as `pretrain finetune` trains on it: GPT-2's and Llama's put
    # nothing between the texts, so they get `a <|endoftext|> b` in their saved pair template (single texts as trained)
    frame_pairs(tokenizer)
    model = load_trained_model(cfg, ckpt_dir, tag, tokenizer, merge)
    mup.fold(model, cfg.model)  # μP's multipliers into the weights: a standard folder, the same logits
    objective = cfg.objective.spec
    family = cfg.model.spec
    # the objective writes its own folders (ELECTRA: discriminator + generator/)
    if objective.export is not None:
        reloaded = objective.export(cfg, model, out, tokenizer)
    else:
        for key, value in family.export_config.items():
            setattr(model.config, key, value)
        model.save_pretrained(out, safe_serialization=True)
        tokenizer.save_pretrained(out)
        make_portable(out)  # loads with transformers 4.40+ as well as 5.x
        if family.generative:
            padded = list(range(len(tokenizer), model.config.vocab_size))
            gen = GenerationConfig.from_model_config(model.config)
            if padded:
                gen.suppress_tokens = padded  # padding rows of the embedding are never produced
            gen.save_pretrained(out)
        reloaded = None
    state_parity = _parity(cfg, ckpt_dir / tag / PROBE_FILE, reloaded, out, model if merge else None)
    heads = _load_heads(family, out)
    state = client_state(ckpt_dir, tag) | {"parity_max_abs_diff": state_parity, "export_heads": heads}
    state |= _origin(cfg, layout, merge)
    n_params = sum(p.numel() for p in model.parameters())
    (out / TRAINING_STATE).write_text(
        json.dumps({"checkpoint": str(ckpt_dir / tag), **state, "n_params": n_params}, indent=1, default=str)
    )
    write_model_card(cfg, out)  # README.md for the Hub, data_manifest.json and resolved_config.yaml beside it
    (out / COMPLETE).write_text(
        json.dumps(
            {
                "checkpoint": str(ckpt_dir / tag),
                "step": state.get("step"),
                "weights_files": weight_files(
                    out
                ),  # what the hash covers: only these are the export's weights
                "weights_sha256": weights_hash(out),
            },
            indent=1,
        )
    )
    from pretrain.export.model_card import TRANSFER_FILE, bound_transfer

    if (
        (final / TRANSFER_FILE).is_file()
        and weights_hash(final) == weights_hash(out)
        and bound_transfer(final)
    ):
        shutil.copy2(final / TRANSFER_FILE, out / TRANSFER_FILE)  # the same weights again: their results stay
        write_model_card(cfg, out)
    follow_umask(out)  # safetensors writes 0600
    _swap_into_place(out, final)
