"""Shared command-line plumbing: every command takes --config plus key.sub=value overrides."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runconfig.console import route_third_party, verbose_requested
from runconfig.load import ConfigError, load_config
from runconfig.run import RunConfig


def add_config_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--config", "-c", required=required, help="run YAML (see configs/)")
    p.add_argument("overrides", nargs="*", metavar="key.sub=value", help="override any config key")
    p.add_argument("--verbose", "-v", action="store_true",
                   help="show third-party warnings and notices on the terminal (default: <run>/logs/third_party.log)")


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run config; third-party notices from here on go to the run's log file unless --verbose."""
    try:
        cfg = load_config(args.config, args.overrides)
    except ConfigError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    route_third_party(Path(cfg.run.root) / "logs", verbose_requested(getattr(args, "verbose", False)))
    return cfg


def preflight(cfg: RunConfig, *checks) -> None:
    """Run config checks against this machine (runconfig/preflight.py) before any stage starts; a failure is
    printed like a config error (exit 2)."""
    for check in checks:
        try:
            check(cfg)
        except ConfigError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(2) from None
