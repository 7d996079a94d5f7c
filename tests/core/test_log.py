"""core.log: the console shows our messages as one plain line on the package's stream, once; a log file
gets ours and third-party records."""

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from core import log

pytestmark = pytest.mark.timeout(60)

ROOT = Path(__file__).resolve().parents[2]


def test_each_package_writes_plain_lines_to_its_stream(capsys):
    log.get_logger("data_pipeline.some_stage").info("clean: redoing 2 finished shard(s) of notes: why")
    log.get_logger("pretrain.some_module").info("[train] resumed from x at step 4")
    log.get_logger("launch.some_module").warning("[launch] warning: something")
    log.get_logger("pretrain.some_module").debug("hidden unless verbose")
    out, err = capsys.readouterr()
    assert err == "clean: redoing 2 finished shard(s) of notes: why\n[launch] warning: something\n"
    assert out == "[train] resumed from x at step 4\n"  # info of pretrain / launch: stdout; warnings: stderr


def test_verbose_shows_debug_and_a_log_file_gets_every_record(tmp_path, capsys):
    try:
        log.setup(verbose=True, log_file=tmp_path / "logs" / "run.log")
        log.get_logger("pretrain.x").debug("a debug line")
        logging.getLogger("some_library").warning("a third-party warning")
        out, err = capsys.readouterr()
        assert out == "a debug line\n" and "third-party" not in out + err  # not ours: file only
        text = (tmp_path / "logs" / "run.log").read_text()
        assert (
            "DEBUG pretrain.x: a debug line" in text and "WARNING some_library: a third-party warning" in text
        )
    finally:
        log.setup(verbose=False)
        for logger in (logging.getLogger(), *(logging.getLogger(p) for p in log.PACKAGES)):
            for h in [h for h in logger.handlers if getattr(h, "_lmstack", False)]:
                logger.removeHandler(h)
                h.close()
    log.get_logger("pretrain.x").debug("quiet again")
    assert capsys.readouterr() == ("", "")


def test_a_configured_root_logger_does_not_print_our_lines_twice():
    """An application that calls logging.basicConfig still sees each of our lines once, without prefixes."""
    code = (
        "import logging, sys; logging.basicConfig(stream=sys.stdout, level=logging.INFO); "
        "from core.log import get_logger; get_logger('pretrain.run.train').info('[train] one line')"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout == "[train] one line\n"


def test_a_log_file_gets_one_handler_however_it_is_asked_for(tmp_path):
    """attach_file is idempotent: a second request for the same file (another spelling of its path, a logger
    named twice) adds no second handler, so each record is written once."""
    logger = logging.getLogger("lmstack_test.attach_file")
    logger.propagate = False
    first = log.attach_file(tmp_path / "logs" / "x.log", [logger], "%(message)s")
    try:
        again = log.attach_file(tmp_path / "logs" / ".." / "logs" / "x.log", [logger, logger], "%(message)s")
        assert again is first and logger.handlers == [first]
        assert not (tmp_path / "logs").exists()  # delayed: created by the first record
        logger.warning("written once")
        assert (tmp_path / "logs" / "x.log").read_text() == "written once\n"
    finally:
        logger.removeHandler(first)
        first.close()
    # closed, it is no longer the file's handler: the next request gets a new one
    fresh = log.attach_file(tmp_path / "logs" / "x.log", [], "%(message)s")
    assert fresh is not first
    fresh.close()


UNWRITABLE_LOG = r"""
import logging, sys
from core.log import route_third_party, third_party_prints
route_third_party(sys.argv[1])
with third_party_prints("DeepSpeed"):  # as export consolidates the ZeRO shards: print()s routed to the log file
    print("Reconstructed fp32 state dict")
logging.getLogger("transformers").warning("a third-party warning")
logging.getLogger("DeepSpeed").info("a third-party notice")
print("our one-line message")
"""


def test_a_log_file_that_cannot_be_opened_warns_once_and_never_recurses(tmp_path):
    """Issue 43 fault 3: a run folder whose logs/ cannot be written (a read-only run being exported) gave 140
    chained OSError tracebacks and a RecursionError, the stderr fallback being routed back into the same handler.
    Now: one warning naming the file, the third-party warnings on stderr, the command goes on."""
    blocker = tmp_path / "run"
    blocker.write_text(
        "a file where the run's folder would be"
    )  # logs/ cannot be made under it, even by root
    res = subprocess.run(
        [sys.executable, "-c", UNWRITABLE_LOG, str(blocker / "logs")],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout == "our one-line message\n"
    assert "Traceback" not in res.stderr and "RecursionError" not in res.stderr, res.stderr[-3000:]
    lines = res.stderr.strip().splitlines()
    assert len([x for x in lines if str(blocker / "logs" / "third_party.log") in x]) == 1, lines
    assert lines[1:] == ["a third-party warning"], (
        lines
    )  # warnings stay visible; notices are dropped, as said
