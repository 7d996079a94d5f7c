"""Base model for every config section: unknown keys are errors, assignments are validated, and no float may
be inf or NaN (an infinite LR passed every `gt=0` bound and checkpointed non-finite weights). The same policy as
the typed options of the specs (core/specs.py `Options`), which it extends."""

from core.specs import Options


class Section(Options):
    """One section of the run config."""
