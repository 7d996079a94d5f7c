"""Shared command-line plumbing: every command takes --config plus key.sub=value overrides."""

from __future__ import annotations

import argparse
import sys

from runconfig.load import ConfigError, load_config
from runconfig.run import RunConfig


def add_config_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--config", "-c", required=required, help="run YAML (see configs/)")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="override any config key")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    try:
        return load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None


def preflight(cfg: RunConfig, *checks) -> None:
    """Run config checks against this machine (runconfig/preflight.py) before any stage starts; a failure is
    printed like a config error (exit 2)."""
    for check in checks:
        try:
            check(cfg)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
