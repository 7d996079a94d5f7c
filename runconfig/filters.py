"""The cleaning chain's steps as the config sees them: their names, their default order and their typed settings,
all read from the `lmstack.filters` entry points. Nothing here lists a step.

A step (a filter that keeps or drops a document, or a formatter that rewrites its text) declares its settings once,
as its constructor's keyword parameters: typed, with defaults, a comment beside each (the generated reference
shows it), constraints as `Annotated[..., Field(...)]`. The config derives the `data.clean.<name>` section of a
step from that signature (`step_settings`), with an `enabled` switch in front (the step's `enabled_by_default`),
and checks a `filters:` step's `params` against the same model. So a built-in and an outside step are declared
the same way; the built-ins are the project's own entry points (pyproject.toml), and their order there is the
chain's default order.

How this keeps the floors: runconfig never imports data_pipeline. The step's class is found through its entry
point (package metadata, as an outside plug-in is found, and as the config finds a family's spec), and only when
a section is first validated, never when runconfig is imported (a filter module may import runconfig, as the URL
filter imports runconfig/blocklist.py: deriving at import time would be a cycle). A step module imports no ML
framework at module level (tests/runconfig/test_config_reference.py runs the generator without torch).

What a step may declare beside its constructor (class attributes, all optional):
- `enabled_by_default: bool` (True): the default of its section's `enabled` switch (FineWeb's is False);
- `presets: {preset: {key: value}}`: what a per-source `clean_preset` sets in its section (the `curated` preset
  switches the quality rules and language ID off);
- `removed_params: {old key: replacement}`: a parameter that no longer exists, refused at load naming what to use;
- a keyword parameter named `run_config` is no setting: the chain passes the run's config (decontamination
  reads the evaluation tasks from it).
"""

from __future__ import annotations

import ast
import inspect
import io
import textwrap
import tokenize
import typing
from collections.abc import Callable
from functools import cache
from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, create_model
from pydantic.fields import FieldInfo

from core.registry import FILTERS, builtin_entry_points
from core.specs import Options

# The parameter through which the chain hands a step the run's config; never a setting.
RUN_CONFIG_PARAM = "run_config"

Share = Annotated[float, Field(ge=0, le=1)]  # a setting that is a fraction: between 0 and 1


def builtin_steps() -> tuple[str, ...]:
    """The project's own steps in their default order: the order of its `lmstack.filters` entry points."""
    return tuple(ep.name for ep in builtin_entry_points().get(FILTERS.group, ()))


def step_factory(name: str) -> Callable[..., Any]:
    """The registered step (a class or a factory function), loaded through its entry point or `module:Name`."""
    return FILTERS.get(name)


def _signature_target(factory: Callable[..., Any]) -> Callable[..., Any]:
    return factory.__init__ if isinstance(factory, type) else factory  # type: ignore[misc]


def _param_comments(func: Callable[..., Any]) -> dict[str, str]:
    """Parameter name -> the comment beside it (on its last line) or on the `#` lines right above it."""
    try:
        src = textwrap.dedent(inspect.getsource(func))
    except (OSError, TypeError):
        return {}
    by_line = {
        tok.start[0]: tok.string.lstrip("#").strip()
        for tok in tokenize.generate_tokens(io.StringIO(src).readline)
        if tok.type == tokenize.COMMENT
    }
    lines = src.splitlines()
    node = ast.parse(src).body[0]
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return {}
    out: dict[str, str] = {}
    for arg in [*node.args.args, *node.args.kwonlyargs]:
        above: list[str] = []
        ln = arg.lineno - 1
        while ln >= 1 and lines[ln - 1].lstrip().startswith("#"):
            above.insert(0, by_line.get(ln, ""))
            ln -= 1
        end = arg.end_lineno or arg.lineno
        # the comment at the end of the parameter's line (after its default and comma)
        after = by_line.get(end, "") if not lines[end - 1].lstrip().startswith("#") else ""
        text = " ".join(t for t in (*above, after) if t)
        if text:
            out[arg.arg] = text
    return out


def _removed(name: str, key: str, replacement: str) -> Any:
    """A field that exists only to refuse a parameter that no longer exists, at its own key, naming the
    replacement (one line); never dumped, so it reaches no constructor and no fingerprint."""

    def refuse(value: Any) -> Any:
        raise ValueError(f"removed from step {name}: {replacement}")

    return (Annotated[Any, AfterValidator(refuse)], Field(None, exclude=True, repr=False))


def settings_from_signature(name: str, factory: Callable[..., Any], section: bool) -> type[Options]:
    """The typed settings a step's constructor declares: one field per keyword parameter (its annotation, its
    default, the comment beside it as the description). `section`: with the `enabled` switch in front, as a
    `data.clean.<name>` section has it."""
    func = _signature_target(factory)
    try:
        hints = typing.get_type_hints(func, include_extras=True)
    except Exception as e:  # noqa: BLE001 - an annotation that does not resolve: say which step
        raise TypeError(f"step {name}: its constructor's annotations do not resolve ({e})") from None
    comments = _param_comments(func)
    params = inspect.signature(factory).parameters.values()  # a class's: its __init__'s, without self
    # a constructor taking **kwargs takes any setting: the keys it does not name are passed on unchecked
    open_ = any(p.kind is p.VAR_KEYWORD for p in params)
    base: type[Options] = (
        (_OpenSection if open_ else StepSection) if section else (_Open if open_ else Options)
    )
    fields: dict[str, Any] = {}
    if section:
        on = bool(getattr(factory, "enabled_by_default", True))
        fields["enabled"] = (bool, Field(on, description="run this step (its section's switch)"))
    for p in params:
        if p.name in ("self", RUN_CONFIG_PARAM) or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        if p.kind is p.POSITIONAL_ONLY:
            raise TypeError(f"step {name}: parameter {p.name} is positional-only; a setting is a keyword")
        tp = hints.get(p.name, Any)
        default = ... if p.default is p.empty else p.default
        fields[p.name] = (tp, _field(default, comments.get(p.name)))
    for key, replacement in getattr(factory, "removed_params", {}).items():
        fields[key] = _removed(name, key, replacement)
    model = create_model(
        _class_name(name), __base__=base, __doc__=_doc(factory), __module__=__name__, **fields
    )
    return typing.cast(type[Options], model)


class StepSection(Options):
    """A step's `data.clean.<name>` section: its settings and its `enabled` switch."""

    def active(self) -> bool:
        """Whether the step runs with these settings: switched on, and (where the step can tell from its settings
        alone, as the URL filter with no list cannot) given something to do: the step's `active(settings)`."""
        if not getattr(self, "enabled", True):
            return False
        step = step_factory(type(self).__name__.removesuffix(_SUFFIX))
        check = getattr(step, "active", None)
        return bool(check(self)) if callable(check) else True


class _Open(Options):
    """The settings of a constructor that takes `**kwargs`: its named keywords typed, any other key passed on."""

    model_config = ConfigDict(extra="allow")


class _OpenSection(StepSection, _Open):
    """A step section whose constructor takes `**kwargs`."""


def params_model(name: str) -> type[Options]:
    """What a `filters:` step's `params` are checked against: a registered step's section type; for a
    `module:Name` step, the pydantic model it brings as `settings`, else the settings its constructor declares."""
    if name in FILTERS.entry_point_names():
        return step_settings(name)
    factory = step_factory(name)
    own = getattr(factory, "settings", None)
    if isinstance(own, type) and issubclass(own, BaseModel):
        return typing.cast(type[Options], own)
    return settings_from_signature(name, factory, section=False)


def _field(default: Any, description: str | None) -> FieldInfo:
    return typing.cast(FieldInfo, Field(default, description=description))


def _doc(factory: Callable[..., Any]) -> str | None:
    """The step's docstring, for the section's heading in the reference."""
    return inspect.getdoc(factory) if factory.__doc__ else None


_SUFFIX = "_settings"


def _class_name(step: str) -> str:
    return step + _SUFFIX


def __getattr__(attr: str) -> Any:
    """`<step>_settings`: a derived settings class, found by name, so a config pickled to a worker process (the
    local pool, Ray) unpickles there; the class is derived again from the step's entry point when it is new."""
    if attr.endswith(_SUFFIX) and not attr.startswith("__"):
        return step_settings(attr.removesuffix(_SUFFIX))
    raise AttributeError(f"module {__name__!r} has no attribute {attr!r}")


@cache
def step_settings(name: str) -> type[Options]:
    """The `data.clean.<name>` section of a registered step (its `enabled` switch and its constructor's
    settings). An outside step may bring its own model as a `settings` attribute (a pydantic model of its
    params), then the section is that model with the switch in front."""
    factory = step_factory(name)
    own = getattr(factory, "settings", None)
    if isinstance(own, type) and issubclass(own, BaseModel):
        on = bool(getattr(factory, "enabled_by_default", True))
        return typing.cast(
            type[Options],
            create_model(
                _class_name(name), __base__=(own, StepSection), __module__=__name__, enabled=(bool, Field(on))
            ),
        )
    return settings_from_signature(name, factory, section=True)


def preset_overrides(preset: str) -> dict[str, dict[str, Any]]:
    """What a `clean_preset` sets, step by step, as each built-in step declares it (`presets`)."""
    out: dict[str, dict[str, Any]] = {}
    for name in builtin_steps():
        over = getattr(step_factory(name), "presets", {}).get(preset)
        if over:
            out[name] = dict(over)
    return out


def setting_names(model: type[Options]) -> list[str]:
    """The keys a step's settings take (its removed parameters, which only refuse, left out)."""
    return sorted(k for k, f in model.model_fields.items() if not f.exclude)
