"""One logging setup for every package: modules log, only a CLI's own output is printed.

`get_logger(__name__)` in any module of runconfig, data_pipeline, pretrain or launch. Messages keep the one-line
form users and tests know (`[train] resumed from ...`, `clean: redoing ...`): the console shows the message alone,
no level or logger name. Which console stream a package's messages go to is kept from before the move to logging:

- `data_pipeline`, `runconfig` (and `core`): stderr. A data stage's stdout carries its JSON summary, which scripts
  parse; progress, tables and notes must not mix into it.
- `pretrain`, `adapt`, `launch`: stdout. Training's lines are the run's log, which torchrun, the DeepSpeed launcher and
  Slurm's `%x-%j.out` collect from every rank.
- Warnings and errors of every package: stderr.

The console handler is installed the first time a module asks for a logger, so a library call, a test or a
torchrun rank prints as a CLI does without calling `setup`. `setup(verbose, log_file)` is for entry points:
`verbose` shows debug lines, `log_file` also writes every record (ours and third-party, with time and logger
name) to a file, for the run folder's log.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

# Our top-level packages and the console stream of each (see the module docstring for why).
PACKAGES: dict[str, str] = {
    "core": "stderr",
    "runconfig": "stderr",
    "data_pipeline": "stderr",
    "pretrain": "stdout",
    "adapt": "stdout",
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
        bar = _shown_bar_class()
        if bar is None:
            super().emit(record)
            return
        try:  # a bar is on the terminal: clear it, write the line alone, draw it again (tqdm's own write)
            bar.write(self.format(record), file=self.stream)
            self.flush()
        except Exception:  # noqa: BLE001 - logging's contract: a failed emit is reported, never raised
            self.handleError(record)

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


def _shown_bar_class() -> Any:
    """tqdm's class while one of its bars is shown in this process (training's progress bar), else None. A line
    written beside a bar without it lands on the bar's line (`| 4/10[spikes] ...`). tqdm is looked up, not
    imported: a process that never imported it shows no bar."""
    std = sys.modules.get("tqdm.std")
    if std is None:
        return None
    cls = std.tqdm
    shown = any(not getattr(b, "disable", True) for b in list(getattr(cls, "_instances", ())))
    return cls if shown else None


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


# ------------------------------------------------------------------------------------------------ log files
# Both log files (setup's `log_file`, route_third_party's `<run>/logs/third_party.log`) are attached through
# `attach_file`: one handler per file in this process, however often and by whichever path it is asked for.
_files: dict[str, logging.FileHandler] = {}
_files_lock = threading.Lock()


class _LazyFileHandler(logging.FileHandler):
    """Creates its folder when it opens the file (with `delay`: at the first record, so a command that logs
    nothing leaves no folder behind). Folder and file get the modes `mkdir` and `open` give them (0o777 / 0o666
    less the umask), as core.io's writers do, so teammates can read a shared run folder's logs."""

    def _open(self):  # noqa: ANN202 (logging's API)
        Path(self.baseFilename).parent.mkdir(parents=True, exist_ok=True)
        return super()._open()

    _unwritable = False  # the file could not be opened: said once, then warnings go to the real stderr

    def emit(self, record: logging.LogRecord) -> None:
        """A log file that cannot be opened (a read-only run being exported, an unwritable output folder) is said
        once on the process's real stderr; from then on warnings and errors go there and lower records are
        dropped. Never `sys.stderr`: inside `third_party_prints` it is routed back into this very handler."""
        if self.stream is None and not self._unwritable:
            try:
                self.stream = self._open()
            except OSError as e:
                self._unwritable = True
                self._stderr(
                    f"warning: cannot write the log file {self.baseFilename} ({e.strerror or e}): "
                    "its warnings go to stderr, lower records are dropped (--verbose shows them)"
                )
        if self._unwritable:
            if record.levelno >= logging.WARNING:
                self._stderr(record.getMessage())
            return
        super().emit(record)

    @staticmethod
    def _stderr(line: str) -> None:
        stream = sys.__stderr__
        if stream is not None:
            try:
                stream.write(line + "\n")
                stream.flush()
            except (OSError, ValueError):  # a closed stream: nowhere left to say it
                pass

    def close(self) -> None:
        """A closed handler is no longer the file's handler: the next `attach_file` of that file makes a new one."""
        with _files_lock:
            for key in [k for k, h in _files.items() if h is self]:
                del _files[key]
        super().close()


def attach_file(
    path: str | os.PathLike[str],
    loggers: Iterable[logging.Logger],
    fmt: str,
    level: int = logging.NOTSET,
    delay: bool = True,
) -> logging.FileHandler:
    """Add the handler of the log file `path` to each of `loggers` that lacks it, and return it. Idempotent: a
    file has one handler in this process (a second request, even by another spelling of the path, gets the same
    one, with the format and level it was made with), so no record is written to a file twice. With `delay`, the
    file and its folder are created by the first record, otherwise at once."""
    key = os.path.realpath(os.fspath(path))
    with _files_lock:
        handler = _files.get(key)
        if handler is None:
            handler = _LazyFileHandler(key, encoding="utf-8", delay=delay)
            handler.setFormatter(logging.Formatter(fmt))
            handler.setLevel(level)
            _files[key] = handler
    for logger in loggers:
        if handler not in logger.handlers:
            # the base method: a routed logger (below) would otherwise pass it through its own check
            logging.Logger.addHandler(logger, handler)
    return handler


def _in_use(handler: logging.Handler) -> bool:
    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    return any(handler in lg.handlers for lg in loggers if isinstance(lg, logging.Logger))


def setup(verbose: bool = False, log_file: Path | str | None = None) -> None:
    """Configure logging for a command: console at INFO (DEBUG with `verbose`), and, with `log_file`, every
    record of ours and of third-party libraries at DEBUG in that file. Safe to call again (handlers are replaced)."""
    _install_console(logging.DEBUG if verbose else logging.INFO)
    if log_file is None:
        return
    root = logging.getLogger()
    # ours do not propagate to root, so they get the file handler themselves
    loggers = (root, *(logging.getLogger(p) for p in PACKAGES))
    handler = attach_file(log_file, loggers, FILE_FORMAT, logging.DEBUG, delay=False)
    handler._lmstack = True  # type: ignore[attr-defined]  # ours to replace on the next setup()
    for logger in loggers:
        for h in [h for h in logger.handlers if getattr(h, "_lmstack", False) and h is not handler]:
            logger.removeHandler(h)
            if not _in_use(h):
                h.close()
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
    "DeepSpeed",
    "deepspeed",
    "transformers",
    "torch",
    "torchao",  # imported by transformers when installed: a warning per optional kernel library it cannot load
    "py.warnings",
    "warcio",
    "datasets",
    "huggingface_hub",
    "accelerate",
    "fsspec",
    "s3fs",
    "gcsfs",
    "urllib3",
    "filelock",
    "tokenizers",
    "sentencepiece",
    "trafilatura",
    "htmldate",
    "courlan",
    "ray",
    "mlflow",
    "wandb",
    "matplotlib",
    "PIL",
)
THIRD_PARTY_FORMAT = "%(asctime)s %(process)d %(name)s %(levelname)s %(message)s"

_file_handler: logging.Handler | None = None


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
    manager = logging.Logger.manager
    loggers = []
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
        loggers.append(logger)
    _file_handler = attach_file(path, loggers, THIRD_PARTY_FORMAT)
    logging.captureWarnings(True)
    _quiet_hf_progress_bars()
    return path


def _quiet_hf_progress_bars() -> None:
    """No Hugging Face progress bar ("Loading weights", downloads) on the console. The environment variable
    covers modules imported later and child processes (huggingface_hub reads it on import, transformers asks
    huggingface_hub on its own import); libraries imported already are switched off by their own call. Nothing
    is imported here: core stays free of ML frameworks."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    hub = sys.modules.get("huggingface_hub.utils")
    if hub is not None:
        hub.disable_progress_bars()
    hf_logging = sys.modules.get("transformers.utils.logging")
    if hf_logging is not None:
        hf_logging.disable_progress_bar()


class _LinesToLogger(io.TextIOBase):
    """A text stream whose every line becomes an INFO record of one logger."""

    def __init__(self, logger: logging.Logger):
        self.logger, self.pending = logger, ""

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        for line in lines:
            self._emit(line)
        return len(text)

    def flush(self) -> None:
        self._emit(self.pending)
        self.pending = ""

    def _emit(self, line: str) -> None:
        # handle(), not info(): a print is kept whatever level the library set its logger to (DeepSpeed: WARNING)
        if line.strip():
            self.logger.handle(
                self.logger.makeRecord(self.logger.name, logging.INFO, "print", 0, line, (), None)
            )


@contextlib.contextmanager
def third_party_prints(name: str) -> Iterator[None]:
    """What a library print()s or draws on stderr inside the block becomes records of its logger `name` (one of
    THIRD_PARTY): the run's third_party.log when routed, the console with --verbose. DeepSpeed's zero_to_fp32
    reports through print() and tqdm bars ("Loading checkpoint shards"), not logging. Not routed (--verbose, or no
    run folder yet): they stay on the console."""
    if _file_handler is None:
        yield
        return
    stream = _LinesToLogger(logging.getLogger(name))
    with contextlib.redirect_stdout(stream), contextlib.redirect_stderr(stream):
        try:
            yield
        finally:
            stream.flush()
