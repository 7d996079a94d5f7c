"""A named registry of plug-in specs (model families, objectives), as llm-foundry's registries.

Built-in specs are modules imported on first lookup; outside packages add theirs through a Python entry point
group (`lmstack.families`, `lmstack.objectives`) whose target is a spec, a callable returning one, or a module
that registers on import. Lives on the ground floor and imports neither torch nor transformers: config
validation reads the specs, so a spec module must import without them (heavy imports go inside its functions).
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Generic, TypeVar

T = TypeVar("T")


class Registry(Generic[T]):
    """name -> spec. `get` of an unknown name raises ValueError naming the config key and the registered names."""

    def __init__(self, key: str, group: str, spec_type: type, builtins: tuple[str, ...]):
        self.key, self.group, self.spec_type, self.builtins = key, group, spec_type, builtins
        self._specs: dict[str, T] = {}
        self._loaded = False

    def register(self, spec: T, *, replace: bool = False) -> T:
        name = spec.name  # type: ignore[attr-defined]
        old = self._specs.get(name)
        if old is not None and old is not spec and not replace:
            raise ValueError(f"{self.key}: '{name}' is registered twice")
        self._specs[name] = spec
        return spec

    def _load(self) -> None:
        if self._loaded:
            return
        self._loaded = True  # set first: builtin modules call register() while we import them
        for module in self.builtins:
            importlib.import_module(module)
        for ep in entry_points(group=self.group):
            try:
                obj = ep.load()
            except Exception as e:  # name the broken plug-in rather than fail with its bare traceback
                raise RuntimeError(f"entry point {ep.name} = {ep.value} in group {self.group} failed to load: "
                                   f"{e}") from e
            if callable(obj) and not isinstance(obj, type | self.spec_type):
                obj = obj()
            if isinstance(obj, self.spec_type):
                if self._specs.get(obj.name) is not obj:  # type: ignore[attr-defined]
                    self.register(obj)
            elif obj is not None and not hasattr(obj, "__file__"):  # a module registers itself on import
                raise TypeError(f"entry point {ep.name} in {self.group} gave {type(obj).__name__}, "
                                f"not a {self.spec_type.__name__}")

    def names(self) -> list[str]:
        self._load()
        return sorted(self._specs)

    def get(self, name: str) -> T:
        self._load()
        try:
            return self._specs[name]
        except KeyError:
            raise ValueError(f"{self.key}: unknown name '{name}' (registered: {sorted(self._specs)})") from None

    def __contains__(self, name: str) -> bool:
        self._load()
        return name in self._specs


def resolve(ref: object) -> object:
    """A class given directly or by reference: 'module:Name', or a bare name in `transformers`."""
    if not isinstance(ref, str):
        return ref
    module, _, attr = ref.rpartition(":")
    return getattr(importlib.import_module(module or "transformers"), attr)
