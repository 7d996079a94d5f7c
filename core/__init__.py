"""The ground floor: torch-free pieces every other package builds on.

Floors, lowest first: core < runconfig < data_pipeline < pretrain < adapt < launch. A floor imports only from the
floors below it (an import-linter contract in pyproject.toml keeps it so). Here: the one `Registry` type and the
registries (registry.py), the data-only specs the config validates names against (specs.py), the error types the
CLIs print as one line (errors.py) and their exit codes (exit_codes.py), the one atomic writer and the hashing
helpers (io.py), the run folder layout and its store (layout.py, run_layout.py, storage.py), the checks a command
runs before its first stage (preflight.py, export_files.py), logging, paths, plug-in references and child
processes. Nothing here imports torch, transformers or any package of a higher floor.
"""
