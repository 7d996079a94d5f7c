"""Base model for every config section: unknown keys are errors, assignments are validated, and no float may
be inf or NaN (an infinite LR passed every `gt=0` bound and checkpointed non-finite weights). The same policy as
the typed options of the specs (core/specs.py `Options`), which it extends."""

from core.specs import Options


class Section(Options):
    """One section of the run config."""


def check_path_component(value: str) -> str:
    """A config value that becomes one folder or file name (a source name, a task name, run.name): a separator,
    `..` or an absolute path would let a stage write outside run.output_dir (issue 25, row 3)."""
    bad = None
    if not value or not value.strip():
        bad = "is empty"
    elif value in (".", ".."):
        bad = f"is {value!r}"
    elif any(c in value for c in ("/", "\\")):
        bad = "contains a path separator"
    elif "\x00" in value or any(ord(c) < 32 for c in value):
        bad = "contains a control character"
    elif value.startswith("~"):
        bad = "starts with '~'"
    if bad:
        raise ValueError(
            f"{value!r} {bad}; it becomes a path component, so use a plain name "
            "(letters, digits, '.', '-', '_')"
        )
    return value
