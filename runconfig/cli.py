"""Shared command-line plumbing: every command takes --config plus key.sub=value overrides."""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from core.errors import LmstackError
from core.exit_codes import USAGE
from core.layout import LOGS
from core.log import route_third_party, verbose_requested
from runconfig.load import load_config
from runconfig.run import RunConfig

# a config override, `key.sub=value` (list indices and dashes in keys): accepted anywhere on the command line
OVERRIDE = re.compile(r"[A-Za-z_][\w.\-]*=.*", re.DOTALL)


def add_config_args(p: argparse.ArgumentParser, required: bool = True) -> None:
    p.add_argument("--config", "-c", required=required, help="run YAML (see configs/)")
    p.add_argument(
        "overrides", nargs="*", metavar="key.sub=value", help="override any config key (anywhere on the line)"
    )
    p.add_argument(
        "--verbose",
        "-v",
        action="store_true",
        help="show third-party warnings and notices on the terminal (default: <run>/logs/third_party.log)",
    )


def config_from_args(args: argparse.Namespace) -> RunConfig:
    """The run config; third-party notices from here on go to the run's log file unless --verbose."""
    try:
        cfg = load_config(args.config, args.overrides)
    except LmstackError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(e.exit_code) from None
    route_third_party(Path(cfg.run.root) / LOGS, verbose_requested(getattr(args, "verbose", False)))
    return cfg


def run_cli(main: Callable[[list[str] | None], int], argv: list[str] | None = None) -> int:
    """Runs a CLI's main; an `LmstackError` (a bad key, file, host or name, or a full disk, said in its message) is
    printed as one line and exits with its `exit_code` (core/exit_codes.py), without a traceback."""
    try:
        return main(argv)
    except LmstackError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code


def preflight(cfg: RunConfig, *checks) -> None:
    """Run config checks against this machine (core/preflight.py) before any stage starts; a failure is
    printed like a config error (exit USAGE)."""
    for check in checks:
        try:
            check(cfg)
        except LmstackError as e:
            print(f"error: {e}", file=sys.stderr)
            raise SystemExit(USAGE) from None


@dataclass(frozen=True)
class Command:
    """One subcommand of a CLI (every `python -m <package>` is a table of these): its name, its help, the function
    that runs it with the parsed arguments and returns the exit code, and the arguments it adds."""

    name: str
    help: str
    run: Callable[[argparse.Namespace], int]
    arguments: Callable[[argparse.ArgumentParser], None] | None = None
    config: bool = True  # takes --config and key.sub=value overrides


def dispatch(prog: str, description: str | None, commands: Sequence[Command], argv: list[str] | None) -> int:
    """Parses `argv` against the table of subcommands and runs the one named."""
    parser = argparse.ArgumentParser(
        prog=prog, description=description, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for c in commands:
        p = sub.add_parser(c.name, help=c.help, description=c.help)
        if c.config:
            add_config_args(p)
        if c.arguments is not None:
            c.arguments(p)
        p.set_defaults(_run=c.run)
    args, extra = parser.parse_known_args(argv)
    # a `key=value` after an option: argparse had taken the positional list already; it is an override too
    takes = hasattr(args, "overrides")
    unknown = [a for a in extra if not (takes and OVERRIDE.fullmatch(a))]
    if unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    if extra:
        args.overrides = [*args.overrides, *extra]  # in command-line order: a later one wins
    return args._run(args)
