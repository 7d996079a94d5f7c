"""Cleaning filters: each is a callable Document -> (keep, reason[, measured value]) and may rewrite doc.text
(C4 drops lines). A filter may keep counts in a `stats` Counter (kept with its shard's marker and summed in the clean
report). Formatters, which rewrite text and never drop (PII redaction), are in data_pipeline/formatters/.

Every step of the chain, built-in or outside, is registered the same way: one `lmstack.filters` entry point
(pyproject.toml), its settings its constructor's keyword parameters (runconfig/filters.py derives the `data.clean`
sections from them). `registry.build_filters(clean)` gives the configured chain. Nothing here lists the steps.
"""
