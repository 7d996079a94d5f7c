"""The cleaning chain built from the config: which steps run, in which order, with which settings.

Steps are registered by name in `core.registry.FILTERS` through `lmstack.filters` entry points (the built-ins'
in pyproject.toml, in the chain's default order), so the CLI, the process pool and Slurm array tasks, which all
build the chain from the config, see the same set. A step is a callable `Document -> (keep, reason)` or
`(keep, reason, measured_value)` (a filter), or a `Formatter` that rewrites text and keeps every document. A
factory (the registered class or function) is called with its settings as keywords: its `data.clean.<name>`
section (typed from its constructor, runconfig/filters.py), overridden by the `params:` of its `filters:` entry.
A factory that needs the run (decontamination: the evaluation tasks) takes it as `run_config`. A factory that
returns None, or a step whose `empty()` is true (a URL filter with no list), has nothing to do and is left out.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from pydantic import BaseModel, ValidationError

from core.errors import ConfigError
from core.plugin_code import code_version
from core.registry import FILTERS
from runconfig.data import CleanConfig, FilterSpec
from runconfig.filters import RUN_CONFIG_PARAM, builtin_steps, params_model, setting_names, step_settings


def _takes_run_config(factory: Callable[..., Any]) -> bool:
    target = factory.__init__ if isinstance(factory, type) else factory  # type: ignore[misc]
    try:
        return RUN_CONFIG_PARAM in inspect.signature(target).parameters
    except (TypeError, ValueError):
        return False


def step_config(clean: CleanConfig, name: str, params: dict[str, Any]) -> BaseModel | None:
    """A registered step's settings: its section (None for a `module:Name` step, which has none) with the step's
    `params` over it."""
    sec = clean.section(name)
    if sec is None:
        return None
    return type(sec).model_validate({**sec.model_dump(), **params}) if params else sec


def build_step(clean: CleanConfig, name: str, params: dict[str, Any], run_config: Any = None) -> Any | None:
    """The step for these settings, or None when it is switched off (`enabled: false`) or has nothing to do."""
    factory = FILTERS.get(name)
    sec = step_config(clean, name, params)
    if (
        sec is None
    ):  # `module:Name`, which has no section: its params typed as its constructor (or `settings`) says
        kwargs = params_model(name).model_validate(params).model_dump()
    else:
        if not getattr(sec, "enabled", True):
            return None
        kwargs = sec.model_dump(exclude={"enabled"})
    if _takes_run_config(factory):
        if run_config is None:
            raise ValueError(f"step {name} needs the run's config (build_filters(clean, run_config=cfg))")
        kwargs[RUN_CONFIG_PARAM] = run_config
    step = factory(**kwargs)
    if step is None or (callable(getattr(step, "empty", None)) and step.empty()):
        return None
    return step


def check_filter_settings(cfg: Any) -> None:
    """Every `filters:` step's params against its settings, before any shard runs: a built-in's were checked at
    load; another package's step and a `module:Name` one are imported here, their params checked against the
    settings their constructors declare (or the `settings` model they bring). A ConfigError naming the key
    (`data.clean.filters.0.params.x`) instead of a failure inside every worker."""
    where = [("data.clean", cfg.data.clean)] + [
        (f"data.sources.{j}.clean", cfg.data.clean_for(src.name))
        for j, src in enumerate(cfg.data.sources)
        if "filters" in src.clean
    ]
    builtins = builtin_steps()
    for prefix, clean in where:
        for i, spec in enumerate(filter_specs(clean)):
            if spec.name in builtins:
                continue
            try:
                settings = params_model(spec.name)
            except TypeError as e:  # a constructor the settings cannot be read from
                raise ConfigError(f"{prefix}.filters.{i}: {e}") from None
            try:
                settings.model_validate(spec.params)
            except ValidationError as e:
                err = e.errors()[0]
                key = ".".join(str(p) for p in err["loc"])
                raise ConfigError(
                    f"{prefix}.filters.{i}.params.{key}: {err['msg']} (filter {spec.name} takes "
                    f"{setting_names(settings)})"
                ) from None


def filter_specs(clean: CleanConfig) -> list[FilterSpec]:
    return list(clean.filters) if clean.filters is not None else [FilterSpec(name=n) for n in builtin_steps()]


def replaced_defaults_note(clean: CleanConfig) -> str | None:
    """A `filters:` list that leaves built-ins out runs without them: the one line the clean stage prints,
    naming the ones left out (all of them, or only some: a list copied from an example must not silently lose
    language ID, Gopher or decontamination)."""
    if clean.filters is None:
        return None
    names = [s.name for s in clean.filters]
    builtins = builtin_steps()
    # a built-in its section switches off (fineweb by default) would not run anyway
    on = [b for b in builtins if getattr(clean.section(b), "enabled", True)]
    left_out = [b for b in on if b not in names]
    if not left_out:
        return None
    extend = "to add to them write filters: {defaults: true, extra: [...]}"
    if not any(b in names for b in builtins):
        return f"data.clean.filters replaces the built-in filters ({', '.join(on)}): running only {names}; {extend}"
    return (
        f"data.clean.filters leaves out the built-in filters {', '.join(left_out)}: running only {names}; list "
        f"them to keep them, or {extend}"
    )


def build_filters(clean: CleanConfig, run_config: Any = None) -> list[tuple[str, Any]]:
    """(name, step) in the configured order; steps switched off or with nothing to do are left out."""
    out = []
    for spec in filter_specs(clean):
        step = build_step(clean, spec.name, spec.params, run_config)
        if step is not None:
            out.append((spec.name, step))
    return out


def filters_code_version(clean: CleanConfig) -> dict[str, str]:
    """Each step's declared version, or a hash of its module and the project-local modules it imports: a changed
    step, or a changed helper it uses, invalidates its completion markers."""
    return {spec.name: code_version(FILTERS.get(spec.name)) for spec in filter_specs(clean)}


__all__ = [
    "build_filters",
    "build_step",
    "check_filter_settings",
    "filter_specs",
    "filters_code_version",
    "replaced_defaults_note",
    "step_config",
    "step_settings",
]
