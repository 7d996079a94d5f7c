"""Model families as registered specs; see `registry.py`. Importing this package pulls in neither torch nor
transformers."""

from pretrain.families.registry import FamilySpec, family_names, get_family, register_family

__all__ = ["FamilySpec", "family_names", "get_family", "register_family"]
