"""core.errors.is_disk_full: the one test for "out of disk space" that the data stages, checkpoints, exports and
transfer reports share."""

from __future__ import annotations

import errno

import pytest

from core.errors import is_disk_full


def _raised_from(inner: BaseException, outer: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as e:
            raise outer from e
    except BaseException as e:
        return e


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT])
def test_the_errno_says_so(code):
    assert is_disk_full(OSError(code, "x"))


def test_a_cause_deep_in_the_chain_says_so():
    e = _raised_from(OSError(errno.ENOSPC, "No space left on device"), RuntimeError("saving failed"))
    assert is_disk_full(_raised_from(e, ValueError("outer")))


def test_text_reported_from_a_worker_process_says_so():
    assert is_disk_full(RuntimeError("task 3 failed: OSError: [Errno 28] No space left on device: '/x'"))


def test_other_errors_do_not():
    assert not is_disk_full(OSError(errno.EACCES, "Permission denied"))
    assert not is_disk_full(_raised_from(KeyError("k"), RuntimeError("wrapped")))


def test_a_cycle_in_the_chain_ends():
    a, b = RuntimeError("a"), RuntimeError("b")
    a.__context__, b.__context__ = b, a
    assert not is_disk_full(a)
