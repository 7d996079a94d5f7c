"""The typed run config shared by all stages.

It is its own floor, above core/ and below data_pipeline, pretrain, adapt and launch, which all read one schema while
the data flow stays one-way: runconfig imports only core (the registries and the data-only specs it validates
names against), never an implementation, lazily or not (the import-linter contract in pyproject.toml). Loading a
config imports no torch. Sections live in one module per concern.
"""

from runconfig.load import ConfigError, load_config, parse_overrides, save_resolved
from runconfig.run import RunConfig

__all__ = ["ConfigError", "RunConfig", "load_config", "parse_overrides", "save_resolved"]
