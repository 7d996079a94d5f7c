"""One logging setup for every package: modules log, only a CLI's own output is printed.

`get_logger(__name__)` in any module of runconfig, data_pipeline, pretrain or launch. Messages keep the one-line
form users and tests know (`[train] resumed from ...`, `clean: redoing ...`): the console shows the message alone,
no level or logger name. Which console stream a package's messages go to is kept from before the move to logging:

- `data_pipeline`, `runconfig` (and `core`): stderr. A data stage's stdout carries its JSON summary, which scripts
  parse; progress, tables and notes must not mix into it.
- `pretrain`, `launch`: stdout. Training's lines are the run's log, which torchrun, the DeepSpeed launcher and
  Slurm's `%x-%j.out` collect from every rank.
- Warnings and errors of every package: stderr.

The console handler is installed the first time a module asks for a logger, so a library call, a test or a
torchrun rank prints as a CLI does without calling `setup`. `setup(verbose, log_file)` is for entry points:
`verbose` shows debug lines, `log_file` also writes every record (ours and third-party, with time and logger
name) to a file, for the run folder's log.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

# Our top-level packages and the console stream of each (see the module docstring for why).
PACKAGES: dict[str, str] = {
    "core": "stderr",
    "runconfig": "stderr",
    "data_pipeline": "stderr",
    "pretrain": "stdout",
    "launch": "stdout",
}
CONSOLE_FORMAT = "%(message)s"
FILE_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"

_console_installed = False


class _ConsoleHandler(logging.StreamHandler):
    """Writes to sys.stdout / sys.stderr as they are at the time of each record (pytest's capture, a redirected
    stream), never to the stream object that existed when the handler was made."""

    def __init__(self, stream_name: str) -> None:
        super().__init__()
        self.stream_name = stream_name
        self._target = stream_name

    def emit(self, record: logging.LogRecord) -> None:
        # Called under the handler's lock (Handler.handle), so the target cannot change before the write.
        self._target = "stderr" if record.levelno >= logging.WARNING else self.stream_name
        super().emit(record)

    @property
    def stream(self):  # noqa: D102 - StreamHandler reads self.stream on every emit
        return getattr(sys, self._target)

    @stream.setter
    def stream(self, value) -> None:  # StreamHandler.__init__ assigns it; the property decides instead
        pass

    def flush(self) -> None:
        """Every line reaches the terminal (or the rank's log) at once, as `print(..., flush=True)` did."""
        try:
            self.stream.flush()
        except (AttributeError, ValueError):  # a closed or replaced stream
            pass


def _install_console(level: int = logging.INFO) -> None:
    global _console_installed
    for package, stream_name in PACKAGES.items():
        logger = logging.getLogger(package)
        for h in [h for h in logger.handlers if isinstance(h, _ConsoleHandler)]:
            logger.removeHandler(h)
        handler = _ConsoleHandler(stream_name)
        handler.setFormatter(logging.Formatter(CONSOLE_FORMAT))
        handler.setLevel(level)
        logger.addHandler(handler)
        # the handlers decide: the console shows INFO (DEBUG when verbose), a file all
        logger.setLevel(logging.DEBUG)
        # Our console lines are printed once, by our handler, even when an application configures the root logger.
        logger.propagate = False
    _console_installed = True


def get_logger(name: str) -> logging.Logger:
    """The logger of a module (`get_logger(__name__)`); installs the console handler on first use."""
    if not _console_installed:
        _install_console()
    return logging.getLogger(name)


def setup(verbose: bool = False, log_file: Path | str | None = None) -> None:
    """Configure logging for a command: console at INFO (DEBUG with `verbose`), and, with `log_file`, every
    record of ours and of third-party libraries at DEBUG in that file. Safe to call again (handlers are replaced)."""
    _install_console(logging.DEBUG if verbose else logging.INFO)
    if log_file is None:
        return
    path = Path(log_file)
    path.parent.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setFormatter(logging.Formatter(FILE_FORMAT))
    handler.setLevel(logging.DEBUG)
    handler._lmstack = True  # type: ignore[attr-defined]  # ours to replace on the next setup()
    root = logging.getLogger()
    for logger in (root, *(logging.getLogger(p) for p in PACKAGES)):
        for h in [h for h in logger.handlers if getattr(h, "_lmstack", False)]:
            logger.removeHandler(h)
            h.close()
        logger.addHandler(handler)  # ours do not propagate to root, so they get the file handler themselves
    if root.level > logging.INFO:
        # third-party INFO and warnings reach the file (root's default is WARNING)
        root.setLevel(logging.INFO)


# ------------------------------------------------------------------------------------------- quiet console
# A quiet console: third-party notices go to the run's log file, the terminal keeps our progress bars and
# one-line messages. `--verbose` (or LMSTACK_VERBOSE=1, which launched ranks inherit) leaves everything on the
# terminal.
#
# Libraries attach their console handlers at import time (DeepSpeed's "Setting accelerator to CPU" is logged while
# `import deepspeed` runs, transformers adds its stderr handler on first use), so routing must be in place before
# they are imported and must hold for handlers added later. The loggers below are therefore created up front as
# `_RoutedLogger`s: a console handler a library adds to them is replaced by the run's log file, and Python warnings
# (torch's FutureWarnings) are captured into the `py.warnings` logger, routed the same way.
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

    def emit(self, record: logging.LogRecord) -> None:
        """A log folder that cannot be created (an unwritable output folder, which the checks refuse anyway) sends
        the record to stderr instead of raising inside a library's logging call."""
        if self.stream is None:
            try:
                self.stream = self._open()
            except OSError:
                logging.StreamHandler(sys.stderr).emit(record)
                return
        super().emit(record)


def _is_console(handler: logging.Handler) -> bool:
    return isinstance(handler, logging.StreamHandler) and getattr(handler, "stream", None) in (
        sys.stdout,
        sys.stderr,
        sys.__stdout__,
        sys.__stderr__,
    )


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
        _file_handler.setFormatter(
            logging.Formatter("%(asctime)s %(process)d %(name)s %(levelname)s %(message)s")
        )
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
