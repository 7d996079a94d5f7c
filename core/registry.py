"""ONE registry type, and every registry of lmstack declared in one place (llm-foundry's registry.py style).

A registry maps a name to an object: a family or objective spec, a filter factory, a reader, an executor class,
a tokenizer convention, a training callback. Built-ins and outside packages alike are entry points of the registry's group
(`lmstack.families`, `lmstack.filters`, ...): the built-ins' are declared in this project's pyproject.toml, one
line each, and an entry point's target is the object, a factory returning it, or a module that registers on
import. Some kinds also register on import (`register_reader`, `@register_executor`); and a YAML value `module.path:Name` names an object in any importable
module, without packaging (torchtitan and llm-foundry allow the same). An unknown name raises `UnknownNameError`, which names the registry,
the bad name, every registered name and a close match.

This module imports nothing above the ground floor. A spec registry (families, objectives) loads its entry
points when a name is first looked up: the target is a spec module, torch-free by rule, which the config reads
for its data (objectives, options, checks); it is found through package metadata, as an outside plug-in is,
never by an import written in a lower floor. The other registries' config checks read entry point names only.

From a source tree (a checkout on PYTHONPATH or installed editable) the built-ins' entry points are read from its
pyproject.toml, so they match the code beside it even where the installed metadata predates a change to them
(`pip install -e .` refreshes that); from an installed wheel, from the `lmstack` distribution's metadata.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from functools import cache
from importlib.metadata import EntryPoint, PackageNotFoundError, distribution, entry_points
from pathlib import Path
from types import ModuleType
from typing import Any, Generic, TypeVar

from core.errors import PluginError, UnknownNameError
from core.plugin_code import is_ref, load_ref
from core.specs import FamilySpec, MethodSpec, ObjectiveSpec, resolve

__all__ = [
    "ADAPT_METHODS",
    "CALLBACKS",
    "EXECUTORS",
    "FAMILIES",
    "FILTERS",
    "OBJECTIVES",
    "READERS",
    "REGISTRIES",
    "TOKENIZER_CONVENTIONS",
    "Registry",
    "resolve",
]

T = TypeVar("T")


PROJECT = "lmstack"
_PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


@cache
def builtin_entry_points() -> dict[str, tuple[EntryPoint, ...]]:
    """This project's own entry points by group: the source tree's pyproject.toml when there is one (see the
    module docstring), else the installed distribution's metadata."""
    table: dict[str, dict[str, str]] | None = None
    if _PYPROJECT.is_file() and sys.version_info >= (3, 11):  # tomllib; Python 3.10 reads the metadata below
        import tomllib

        project = tomllib.loads(_PYPROJECT.read_text(encoding="utf-8")).get("project", {})
        if project.get("name") == PROJECT:
            table = project.get("entry-points", {})
    if table is None:
        try:
            eps = distribution(PROJECT).entry_points
        except PackageNotFoundError:
            return {}
        out: dict[str, list[EntryPoint]] = {}
        for ep in eps:
            out.setdefault(ep.group, []).append(ep)
        return {g: tuple(v) for g, v in out.items()}
    return {g: tuple(EntryPoint(n, v, g) for n, v in eps.items()) for g, eps in table.items()}


@cache
def group_entry_points(group: str) -> tuple[EntryPoint, ...]:
    """The built-ins' entry points of `group`, then those of every other installed package (a name the project
    declares is the built-in's)."""
    own = builtin_entry_points().get(group, ())
    names = {ep.name for ep in own}
    outside = [
        ep
        for ep in entry_points(group=group)
        if ep.name not in names and getattr(ep.dist, "name", None) != PROJECT
    ]
    return (*own, *outside)


def _group_names(group: str) -> frozenset[str]:
    return frozenset(ep.name for ep in group_entry_points(group))


class Registry(Generic[T]):
    """name -> object, plus the outside objects of one entry point group (loaded on the first lookup that needs
    them). `kind` words the error ("unknown family 'x'"); `key` is the config key that names entries."""

    def __init__(
        self, name: str, kind: str, key: str, group: str, description: str = "", spec_type: type | None = None
    ):
        self.name, self.kind, self.key, self.group, self.description = name, kind, key, group, description
        # Set for registries of spec objects: an entry point may then name a factory (called to get the spec),
        # and the spec's `name` attribute is its registered name.
        self.spec_type = spec_type
        self._entries: dict[str, T] = {}
        self._entry_points_loaded = False

    def __repr__(self) -> str:
        return f"Registry({self.name!r}, group={self.group!r}, {len(self._entries)} registered)"

    def register(self, name: str, obj: T, *, replace: bool = False) -> T:
        old = self._entries.get(name)
        if old is not None and old is not obj and not replace:
            raise PluginError(f"{self.name}: '{name}' is registered twice ({old!r} and {obj!r})")
        self._entries[name] = obj
        return obj

    def add(self, spec: T, *, replace: bool = False) -> T:
        """Registers a spec under its own `name`."""
        return self.register(spec.name, spec, replace=replace)  # type: ignore[attr-defined]

    def decorator(self, name: str) -> Callable[[T], T]:
        """`@REGISTRY.decorator("name")` over a class or function registers it under that name."""

        def deco(obj: T) -> T:
            return self.register(name, obj)

        return deco

    def entry_point_names(self) -> frozenset[str]:
        """Names the built-ins (pyproject.toml) and outside packages declare in this registry's group, read from
        the metadata without importing them (what config validation may look at)."""
        return _group_names(self.group)

    def builtin_names(self) -> frozenset[str]:
        """Names this project declares in the group (its pyproject.toml): the built-ins."""
        return frozenset(ep.name for ep in builtin_entry_points().get(self.group, ()))

    def load_entry_points(self) -> None:
        if self._entry_points_loaded:
            return
        self._entry_points_loaded = True
        for ep in group_entry_points(self.group):
            if ep.name in self._entries and self.spec_type is None:
                continue  # a built-in (or an earlier registration) of that name wins
            try:
                obj = ep.load()
            except Exception as e:  # name the broken plug-in rather than fail with its bare traceback
                raise PluginError(
                    f"entry point {ep.name} = {ep.value} in group {self.group} failed to load: {e}"
                ) from e
            if self.spec_type is None:
                if isinstance(obj, ModuleType):  # a module that registers its objects on import
                    if ep.name not in self._entries:
                        raise PluginError(
                            f"entry point {ep.name} = {ep.value} in group {self.group}: importing the module "
                            f"registered no {self.kind} '{ep.name}'"
                        )
                    continue
                self.register(ep.name, obj)
                continue
            if callable(obj) and not isinstance(obj, type | self.spec_type):
                obj = obj()
            if isinstance(obj, self.spec_type):
                if self._entries.get(obj.name) is not obj:  # type: ignore[attr-defined]
                    self.add(obj)  # type: ignore[arg-type]
            elif obj is not None and not hasattr(obj, "__file__"):  # a module registers itself on import
                raise PluginError(
                    f"entry point {ep.name} in {self.group} gave {type(obj).__name__}, "
                    f"not a {self.spec_type.__name__}"
                )

    def get(self, name: str) -> T:
        # `module.path:Name` from the YAML: no packaging needed
        if name not in self._entries and is_ref(name):
            obj = load_ref(name, self.key)
            if self.spec_type is not None and callable(obj) and not isinstance(obj, type | self.spec_type):
                obj = obj()
            self.register(name, obj)
        if name not in self._entries:
            self.load_entry_points()
        try:
            return self._entries[name]
        except KeyError:
            raise UnknownNameError(self.name, self.kind, name, self.names()) from None

    def names(self) -> list[str]:
        self.load_entry_points()
        return sorted(self._entries)

    def items(self) -> Iterator[tuple[str, T]]:
        for name in self.names():
            yield name, self._entries[name]

    def __contains__(self, name: object) -> bool:
        if name not in self._entries:
            self.load_entry_points()
        return name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(self.names())

    def __len__(self) -> int:
        return len(self.names())


def _declare() -> dict[str, Registry[Any]]:
    registries: tuple[Registry[Any], ...] = (
        Registry(
            "families",
            "family",
            "model.family",
            "lmstack.families",
            "model families: HF classes, config builder, probe inputs, FLOPs (pretrain/families/)",
            FamilySpec,
        ),
        Registry(
            "objectives",
            "objective",
            "objective.type",
            "lmstack.objectives",
            "pretraining objectives: collator, block length, framing, model prep (data_pipeline/objectives/)",
            ObjectiveSpec,
        ),
        Registry(
            "filters",
            "filter",
            "data.clean.filters",
            "lmstack.filters",
            "cleaning steps: filters, Document -> (keep, reason[, value]), and formatters (data_pipeline/filters/, formatters/)",
        ),
        Registry(
            "readers",
            "format",
            "data.sources.*.format",
            "lmstack.readers",
            "input formats: one reader per format (data_pipeline/readers/)",
        ),
        Registry(
            "executors",
            "executor",
            "data.executor",
            "lmstack.executors",
            "where data tasks run: local process pool, Ray (data_pipeline/executors/)",
        ),
        Registry(
            "tokenizer_conventions",
            "tokenizer convention",
            "tokenizer.type",
            "lmstack.tokenizer_conventions",
            "special tokens, post-processing and HF class of a saved tokenizer (data_pipeline/tokenizers/)",
        ),
        Registry(
            "adapt_methods",
            "adaptation method",
            "finetune.methods",
            "lmstack.adapt_methods",
            "adaptation methods: settings, training, saving, description (adapt/methods/)",
            MethodSpec,
        ),
        Registry(
            "callbacks",
            "callback",
            "callbacks",
            "lmstack.callbacks",
            "in-loop behaviours of a training run: hooks, typed settings, state (core/callbacks.py)",
        ),
    )
    return {r.name: r for r in registries}


REGISTRIES: dict[str, Registry[Any]] = _declare()
FAMILIES: Registry[FamilySpec] = REGISTRIES["families"]
OBJECTIVES: Registry[ObjectiveSpec] = REGISTRIES["objectives"]
FILTERS = REGISTRIES["filters"]
READERS = REGISTRIES["readers"]
EXECUTORS = REGISTRIES["executors"]
TOKENIZER_CONVENTIONS = REGISTRIES["tokenizer_conventions"]
ADAPT_METHODS: Registry[MethodSpec] = REGISTRIES["adapt_methods"]
CALLBACKS = REGISTRIES["callbacks"]
