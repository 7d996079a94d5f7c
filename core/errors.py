"""The error types of lmstack. Every CLI catches `LmstackError` and prints its message as one line (its exit_code):
the message names the key, file or host, so no traceback is needed to act on it."""

from __future__ import annotations

import errno

from core.exit_codes import CANNOT_CONTINUE, USAGE


class LmstackError(Exception):
    """Base of the errors a user can act on from the message alone. `exit_code`: what the CLIs exit with
    (core/exit_codes.py)."""

    exit_code = USAGE


class CannotContinueError(LmstackError):
    """Said in one line like any LmstackError, but found during the work, and a rerun would meet it again (a full
    disk): exit CANNOT_CONTINUE, a code the Slurm scripts do not requeue on."""

    exit_code = CANNOT_CONTINUE


class DiskFullError(CannotContinueError, OSError):
    """Out of disk space: said in one line with the folder and its free space (exit CANNOT_CONTINUE, as a
    checkpoint save or an export on a full disk)."""


def is_disk_full(err: BaseException) -> bool:
    """ENOSPC or EDQUOT anywhere in the cause/context chain, or "No space left" in an error's text: a worker
    process's error reaches the parent as text, and torch's C++ writer raises without an errno."""
    seen: set[int] = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if getattr(e, "errno", None) in (errno.ENOSPC, errno.EDQUOT) or "No space left" in str(e):
            return True
        e = e.__cause__ or e.__context__
    return False


class ConfigError(LmstackError, ValueError):
    """A config problem, with the offending key (and file) in the message. A ValueError too, so pydantic
    validators may raise it and callers written against ValueError keep working."""


class UnknownNameError(ConfigError, KeyError):
    """A name that no registry entry has: names the registry, the bad name and the registered names, with a
    "did you mean" when one is close."""

    def __init__(self, registry: str, kind: str, name: str, known: list[str], hint: str = ""):
        self.registry, self.kind, self.name, self.known, self.hint = registry, kind, name, known, hint
        from difflib import get_close_matches

        close = get_close_matches(name, known, n=1)
        msg = f"unknown {kind} '{name}' (registered: {known})"
        if close:
            msg += f"; did you mean '{close[0]}'?"
        if hint:
            msg += f"; {hint}"
        super().__init__(msg)

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])

    def __reduce__(self) -> tuple[type, tuple[str, str, str, list[str], str]]:
        """Picklable as itself (a process pool worker's error reaches the parent)."""
        return type(self), (self.registry, self.kind, self.name, self.known, self.hint)


class PluginError(LmstackError, RuntimeError):
    """An entry point of an outside package that failed to load or gave the wrong kind of object."""
