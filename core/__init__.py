"""The ground floor: torch-free pieces every other package builds on.

Floors, lowest first: core < runconfig < data_pipeline < pretrain < launch. A floor imports only from the floors
below it (an import-linter contract in pyproject.toml keeps it so). Here: the one `Registry` type and the
registries (registry.py), the data-only specs the config validates names against (specs.py), the error types the
CLIs print as one line (errors.py), the one atomic writer and the hashing helpers (io.py), and the run folder
layout (layout.py). Nothing here imports torch, transformers or any package of a higher floor.
"""
