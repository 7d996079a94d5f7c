"""Base model for every config section: unknown keys are errors, assignments are validated, and no float may
be inf or NaN (an infinite LR passed every `gt=0` bound and checkpointed non-finite weights). The same policy as
the typed options of the specs (core/specs.py `Options`), which it extends."""

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ValidationError, model_validator

from core.registry import Registry
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


# A value that becomes one folder or file name, checked where the field is declared (one rule for every such key).
PathComponent = Annotated[str, AfterValidator(check_path_component)]


def registered_in(registry: Registry[Any]) -> AfterValidator:
    """A validator for a key whose value names an entry of `registry` (`model.family`, `objective.type`): a
    built-in, an entry point or a `module.path:Name`; an unknown name is refused at load naming the known ones
    (the registry's own error), before any work starts."""

    def check(value: str) -> str:
        registry.get(value)
        return value

    return AfterValidator(check)


def check_plugin_options(
    section: str, kind: str, name: str, options_type: type[BaseModel] | None, options: dict[str, Any]
) -> None:
    """A family's `model.options` or an objective's `objective.options` against its spec's typed section: an
    unknown (e.g. misspelled) key is refused naming it and the keys that family or objective takes."""
    if not options:
        return
    if options_type is None:
        raise ValueError(f"{section}: {kind} '{name}' takes no options (got {sorted(options)})")
    try:
        options_type.model_validate(options)
    except ValidationError as e:
        valid = ", ".join(sorted(options_type.model_fields))
        raise ValueError(
            "; ".join(
                f"{section}.{'.'.join(str(p) for p in err['loc'])}: "
                + (
                    f"not a key of {kind} '{name}' (its keys: {valid})"
                    if err["type"] == "extra_forbidden"
                    else f"{err['msg']} ({kind} '{name}')"
                )
                for err in e.errors()
            )
        ) from None


def checks_plugin_options(section: str, kind: str, name_field: str) -> Any:
    """The `options` check of a section that names a registered spec (`model.family`, `objective.type`), as a
    model validator: `options` against the spec's typed section once the section is built, by
    `check_plugin_options`, written once for every such section."""

    def check(self: Any) -> Any:
        check_plugin_options(section, kind, getattr(self, name_field), self.spec.options, self.options)
        return self

    check.__doc__ = f"Checks `{section}` against the {kind}'s typed section (its spec's `options`)."
    return model_validator(mode="after")(check)


def unknown_key_text(key: str, valid: list[str], section: str) -> str:
    """'unknown key', with the section's closest valid keys (difflib by spelling, and a key spelt as the unknown
    one's initials: learning_rate -> lr), or, where none is close, every key the section takes."""
    from difflib import get_close_matches

    close = get_close_matches(key, valid, n=3)
    initials = "".join(part[0] for part in key.split("_") if part)
    close += [k for k in valid if k == initials and k not in close]
    if close:
        names = [f"'{k}'" for k in close]
        listed = names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
        return f"unknown key; did you mean {listed}?"
    return f"unknown key ({section or 'the config'} takes: {', '.join(valid)})" if valid else "unknown key"
