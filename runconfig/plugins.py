"""Names that outside packages register through Python entry points (llm-foundry's pattern), readable without
importing them: the config validates `format:` and `filters:` names against built-ins plus these."""

from __future__ import annotations

from functools import cache
from importlib.metadata import entry_points

FILTER_GROUP = "lmstack.filters"
READER_GROUP = "lmstack.readers"


@cache
def entry_point_names(group: str) -> frozenset[str]:
    return frozenset(ep.name for ep in entry_points(group=group))
