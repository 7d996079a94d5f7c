"""Checks of a loaded config against this machine, run by a command before its first stage starts.

It sits on the ground floor beside the storage layer a remote check needs; the data, pretrain and launch CLIs all
run it. Schema validation (runconfig/load.py) cannot know the file system or the accelerator; without these checks a missing
data path surfaced as a traceback from a worker, an unwritable output folder after the first stage, a missing
resume folder as a fresh run, and fp16 on a CPU accelerator deep inside DeepSpeed. Each error names the key.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING

from core.errors import ConfigError
from core.layout import TOKEN_MANIFEST, TOKENS
from core.paths import filesystem
from core.storage import RunStore

if TYPE_CHECKING:  # the type only: core imports nothing above it at run time
    from runconfig import RunConfig


def check_output_writable(cfg: RunConfig) -> None:
    """The local run folder (or the staging folder of a remote one) and, for a URL, the remote store accept a
    file; an unreachable bucket or a missing fsspec backend stops here, naming the key."""
    out = Path(cfg.run.root)
    key = "run.local_dir" if cfg.run.is_remote else "run.output_dir"
    try:
        out.mkdir(parents=True, exist_ok=True)
        # Earlier versions probed with a named file, which a kill during this check left behind; a minute-old one
        # is such a leftover (a probe lives for microseconds).
        for probe in out.glob(".write-test-*"):
            with contextlib.suppress(FileNotFoundError):
                if time.time() - probe.stat().st_mtime > 60:
                    probe.unlink()
        # An unnamed file (O_TMPFILE on Linux, which TemporaryFile tries first): a kill at any instant of the probe
        # leaves nothing in the run folder. Where the file system lacks O_TMPFILE, tempfile names it and unlinks it
        # at once.
        with tempfile.TemporaryFile(dir=out, prefix=".write-test-") as f:
            f.write(b"0")
    except OSError as e:
        raise ConfigError(f"{key}: {out} is not writable ({e.strerror or e})") from None
    if cfg.run.is_remote:
        try:
            RunStore.from_config(cfg).check_writable()
        except (OSError, ImportError, ValueError) as e:
            raise ConfigError(f"run.output_dir: {cfg.run.output_dir} is not writable ({e})") from None


def check_checkpoint_dir(cfg: RunConfig) -> None:
    """checkpoint.dir (or <run>/checkpoints) can be created: no regular file on its way, a writable ancestor.
    Without this a folder under a file surfaced as a raw NotADirectoryError at the first save."""
    key = "checkpoint.dir" if cfg.checkpoint.dir else "run.output_dir"
    path = Path(cfg.checkpoint_dir)
    if "://" in str(cfg.checkpoint_dir):
        return
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        raise ConfigError(f"{key}: the checkpoint folder {path} is under {probe}, which is a regular file")
    if probe.is_dir() and not os.access(probe, os.W_OK | os.X_OK):
        raise ConfigError(f"{key}: the checkpoint folder {path} cannot be created ({probe} is not writable)")


def check_tokens(cfg: RunConfig) -> None:
    """The token shards `train` reads exist: their manifest (written last by `tokenize`) is there."""
    if cfg.loader.tokens_url is not None or cfg.run.is_remote:
        return  # read (or fetched) through fsspec by the loader, which names the URL
    manifest = Path(cfg.run.root) / TOKENS / TOKEN_MANIFEST
    if not manifest.is_file():
        raise ConfigError(
            f"run.output_dir: no token shards at {manifest.parent} (tokens/manifest.json is "
            "missing); run `python -m data_pipeline tokenize` first, or set loader.tokens_url"
        )


def check_train(cfg: RunConfig, accelerator: str) -> None:
    """`accelerator`: DeepSpeed's device name ("cpu", "cuda", ...), given by the caller (runconfig does not
    import DeepSpeed)."""
    if cfg.deepspeed.precision == "fp16" and accelerator == "cpu":
        raise ConfigError(
            "deepspeed.precision: fp16 needs a GPU accelerator (DeepSpeed's accelerator here is "
            "'cpu'); use bf16 or fp32"
        )
    resume = cfg.checkpoint.resume
    if "://" in resume:  # a checkpoint in a bucket (downloaded by the trainer)
        try:
            found = filesystem(resume).exists(f"{resume.rstrip('/')}/COMPLETE")
        except (OSError, ValueError) as e:
            raise ConfigError(f"checkpoint.resume: {resume} cannot be read ({e})") from None
        if not found:
            raise ConfigError(f"checkpoint.resume: {resume} is not a complete checkpoint (no COMPLETE file)")
    elif resume not in ("auto", "none"):
        if not os.path.isdir(resume):
            raise ConfigError(
                f"checkpoint.resume: {resume} does not exist (give a step folder such as "
                f"<checkpoint dir>/step00000100, or 'auto' / 'none')"
            )
        if not (Path(resume) / "COMPLETE").is_file():
            raise ConfigError(f"checkpoint.resume: {resume} is not a complete checkpoint (no COMPLETE file)")
    check_output_writable(cfg)
    check_checkpoint_dir(cfg)
