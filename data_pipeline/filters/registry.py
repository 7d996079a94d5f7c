"""Filters registered by name (built-ins here, outside packages through the `lmstack.filters` entry point group),
so the CLI, the process pool and Slurm array tasks, which all build filters from the config, see the same set.

A filter is a callable `Document -> (keep, reason)` or `(keep, reason, measured_value)`; it may rewrite
`doc.text`. A factory builds it from its parameters: `factory(**params)`. A built-in takes its parameters from
its typed section of `data.clean` (e.g. `clean.c4`, typed in runconfig/filters.py), overridden by the
`params:` of its `filters:` entry. An outside filter types its own: a pydantic model as the factory's `settings`
attribute, which `check_filter_settings` applies to its `params:` before the stage does any work.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ValidationError

from core.errors import ConfigError
from core.plugin_code import code_version
from core.registry import FILTERS
from runconfig.data import CleanConfig, FilterSpec
from runconfig.filters import BUILTIN_FILTER_KINDS, BUILTIN_FILTERS


@dataclass(frozen=True)
class FilterEntry:
    name: str
    factory: Callable[..., Any]
    section: str | None = None  # built-ins: the CleanConfig field holding their typed settings

    def build(self, clean: CleanConfig, params: dict[str, Any]) -> Any | None:
        """The filter for these settings, or None when its section says `enabled: false`."""
        if self.section is None:
            settings = getattr(self.factory, "settings", None)
            if isinstance(settings, type) and issubclass(settings, BaseModel):
                return self.factory(**settings.model_validate(params).model_dump())
            return self.factory(**params)
        sec: BaseModel = getattr(clean, self.section)
        if params:
            sec = type(sec).model_validate({**sec.model_dump(), **params})
        if not getattr(sec, "enabled", True):
            return None
        return self.factory(**sec.model_dump(exclude={"enabled"}))

    def code_version(self) -> str:
        """The filter's declared version, or a hash of its module and the project-local modules it imports: a
        changed filter, or a changed helper it uses, invalidates its completion markers."""
        return code_version(self.factory)


# The CleanConfig section holding each built-in filter's typed settings (an outside filter has none).
_SECTIONS: dict[str, str] = {k.name: k.section for k in BUILTIN_FILTER_KINDS if k.section is not None}


def register_filter(name: str, factory: Callable[..., Any], section: str | None = None) -> None:
    """Registers a filter factory in `core.registry.FILTERS` (outside packages: the `lmstack.filters` entry
    point group, whose target is the factory)."""
    FILTERS.register(name, factory)
    if section is not None:
        _SECTIONS[name] = section


def get_filter(name: str) -> FilterEntry:
    return FilterEntry(name, FILTERS.get(name), _SECTIONS.get(name))


def check_filter_settings(cfg: Any) -> None:
    """Every `filters:` step's params against its filter's settings type, before any shard runs: a ConfigError
    naming the key (`data.clean.filters.0.params.x`) instead of a failure inside every worker."""
    where = [("data.clean", cfg.data.clean)] + [
        (f"data.sources.{j}.clean", cfg.data.clean_for(src.name)) for j, src in enumerate(cfg.data.sources)
        if "filters" in src.clean]  # fmt: skip
    for prefix, clean in where:
        for i, spec in enumerate(filter_specs(clean)):
            entry = get_filter(spec.name)
            settings = getattr(entry.factory, "settings", None)
            if entry.section is not None or not (
                isinstance(settings, type) and issubclass(settings, BaseModel)
            ):
                continue
            try:
                settings.model_validate(spec.params)
            except ValidationError as e:
                err = e.errors()[0]
                key = ".".join(str(p) for p in err["loc"])
                raise ConfigError(
                    f"{prefix}.filters.{i}.params.{key}: {err['msg']} (filter {spec.name} takes "
                    f"{sorted(settings.model_fields)})"
                ) from None


def filter_specs(clean: CleanConfig) -> list[FilterSpec]:
    return list(clean.filters) if clean.filters is not None else [FilterSpec(name=n) for n in BUILTIN_FILTERS]


def replaced_defaults_note(clean: CleanConfig) -> str | None:
    """A `filters:` list that leaves built-ins out runs without them: the one line the clean stage prints,
    naming the ones left out (all of them, or only some: a list copied from an example must not silently lose
    language ID or Gopher)."""
    if clean.filters is None:
        return None
    names = [s.name for s in clean.filters]
    # a built-in its section switches off (fineweb by default) would not run anyway
    on = [b for b in BUILTIN_FILTERS if getattr(getattr(clean, _SECTIONS.get(b, ""), None), "enabled", True)]
    left_out = [b for b in on if b not in names]
    if not left_out:
        return None
    extend = "to add to them write filters: {defaults: true, extra: [...]}"
    if not any(b in names for b in BUILTIN_FILTERS):
        return f"data.clean.filters replaces the built-in filters ({', '.join(on)}): running only {names}; {extend}"
    return (
        f"data.clean.filters leaves out the built-in filters {', '.join(left_out)}: running only {names}; list "
        f"them to keep them, or {extend}"
    )


def build_filters(clean: CleanConfig) -> list[tuple[str, Any]]:
    """(name, filter) in the configured order; built-ins switched off by `enabled: false` are left out."""
    out = []
    for spec in filter_specs(clean):
        f = get_filter(spec.name).build(clean, spec.params)
        if f is not None:
            out.append((spec.name, f))
    return out


def filters_code_version(clean: CleanConfig) -> dict[str, str]:
    return {spec.name: get_filter(spec.name).code_version() for spec in filter_specs(clean)}
