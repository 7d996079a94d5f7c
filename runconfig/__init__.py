"""The typed run config shared by all stages.

It is its own package so that data_pipeline, pretrain and launch all read one schema while the data flow stays
one-way (data_pipeline never imports pretrain). Sections live in one module per concern.
"""

from runconfig.load import ConfigError, load_config, parse_overrides, save_resolved
from runconfig.run import RunConfig

__all__ = ["ConfigError", "RunConfig", "load_config", "parse_overrides", "save_resolved"]
