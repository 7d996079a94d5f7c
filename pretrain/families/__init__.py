"""Model families as registered specs; see `registry.py`. Importing this package fills in the implementation of
every built-in family (one module each) and pulls in neither torch nor transformers."""

from pretrain.families import electra, gpt2, modernbert, roberta, t5  # noqa: F401  (registration)
from pretrain.families.registry import FamilySpec, family_names, get_family, implement_family, register_family

__all__ = ["FamilySpec", "family_names", "get_family", "implement_family", "register_family"]
