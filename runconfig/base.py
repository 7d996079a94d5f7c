"""Base model for every config section: unknown keys are errors, assignments are validated, and no float may
be inf or NaN (an infinite LR passed every `gt=0` bound and checkpointed non-finite weights)."""

from pydantic import BaseModel, ConfigDict


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True, protected_namespaces=(), allow_inf_nan=False)
