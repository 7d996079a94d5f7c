"""Model families as registered specs; see `registry.py`. Each module in this folder is one family, giving its
whole spec as `SPEC`; its `lmstack.families` entry point in pyproject.toml is the one line that registers it (read
when a family is first looked up). Pulls in neither torch nor transformers."""

from pretrain.families.registry import FamilySpec, family_names, get_family, register_family

__all__ = ["FamilySpec", "family_names", "get_family", "register_family"]
