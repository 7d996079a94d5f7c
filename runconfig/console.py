"""A quiet console: third-party notices go to the run's log file, the terminal keeps our progress bars and
one-line messages. `--verbose` (or LMSTACK_VERBOSE=1, which launched ranks inherit) leaves everything on the
terminal.

Libraries attach their console handlers at import time (DeepSpeed's "Setting accelerator to CPU" is logged while
`import deepspeed` runs, transformers adds its stderr handler on first use), so routing must be in place before
they are imported and must hold for handlers added later. The loggers below are therefore created up front as
`_RoutedLogger`s: a console handler a library adds to them is replaced by the run's log file, and Python warnings
(torch's FutureWarnings) are captured into the `py.warnings` logger, routed the same way.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

VERBOSE_ENV = "LMSTACK_VERBOSE"
LOG_NAME = "third_party.log"
# Top-level loggers of the libraries we run; their children propagate to them.
THIRD_PARTY = (
    "DeepSpeed", "deepspeed", "transformers", "torch", "py.warnings", "warcio", "datasets", "huggingface_hub",
    "accelerate", "fsspec", "s3fs", "gcsfs", "urllib3", "filelock", "tokenizers", "sentencepiece", "trafilatura",
    "htmldate", "courlan", "ray", "mlflow", "wandb", "matplotlib", "PIL",
)  # fmt: skip

_file_handler: logging.Handler | None = None


class _LazyFileHandler(logging.FileHandler):
    """Creates the log folder with the first record, so a command that logs nothing leaves no folder behind."""

    def _open(self):  # noqa: ANN202 (logging's API)
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()


def _is_console(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) in (
        sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)


class _RoutedLogger(logging.Logger):
    """A library logger whose console handlers become the run's log file."""

    def addHandler(self, hdlr: logging.Handler) -> None:  # noqa: N802 (logging's API)
        if _file_handler is not None and _is_console(hdlr):
            hdlr = _file_handler
        if hdlr not in self.handlers:
            super().addHandler(hdlr)


def verbose_requested(flag: bool = False) -> bool:
    """--verbose on this command, or inherited from the command that launched this process."""
    if flag:
        os.environ[VERBOSE_ENV] = "1"  # ranks started by torchrun / the DeepSpeed launcher inherit it
    return os.environ.get(VERBOSE_ENV) == "1"


def route_third_party(log_dir: str | os.PathLike[str], verbose: bool = False) -> Path | None:
    """Send third-party log records and Python warnings to `<log_dir>/third_party.log` (not the terminal).
    Idempotent; returns the log file, or None with verbose (nothing is routed)."""
    global _file_handler
    if verbose:
        return None
    path = Path(log_dir) / LOG_NAME
    if _file_handler is None or Path(getattr(_file_handler, "baseFilename", "")) != path.resolve():
        _file_handler = _LazyFileHandler(path, encoding="utf-8", delay=True)
        _file_handler.setFormatter(logging.Formatter("%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"))
    logging.captureWarnings(True)
    manager = logging.Logger.manager
    for name in THIRD_PARTY:
        existing = manager.loggerDict.get(name)
        if not isinstance(existing, logging.Logger):  # not created yet, or a placeholder its children made
            previous = logging.getLoggerClass()
            logging.setLoggerClass(_RoutedLogger)  # getLogger builds (and links the children of) a routed one
            try:
                logger = logging.getLogger(name)
            finally:
                logging.setLoggerClass(previous)
        else:  # imported before us: swap its console handlers now
            logger = existing
            for h in [h for h in logger.handlers if _is_console(h)]:
                logger.removeHandler(h)
        logger.propagate = False  # never also to the root logger's console handler
        if _file_handler not in logger.handlers:
            logging.Logger.addHandler(logger, _file_handler)
    return path
