"""Model families as registered specs; see `registry.py`. Importing this package fills in the implementation of
every built-in family: each module in this folder (one per family, declared as data in core/specs.py) is
imported, so a new family is its file plus its spec entry, with no list to edit here. Pulls in neither torch nor
transformers."""

import importlib
import pkgutil

from pretrain.families.registry import FamilySpec, family_names, get_family, implement_family, register_family

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in ("registry", "shapes"):
        importlib.import_module(f"{__name__}.{_module.name}")

__all__ = ["FamilySpec", "family_names", "get_family", "implement_family", "register_family"]
