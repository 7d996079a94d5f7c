"""Adaptation methods, each one file whose `SPEC` (core/specs.py `MethodSpec`) is the whole method and one entry
point in the `lmstack.adapt_methods` group: `full` (full.py), `frozen` (frozen.py), `lora` (lora.py), `ulmfit`
(ulmfit.py). Each runs as an arm pair (pretrained, random) of the transfer protocol (adapt/transfer.py)."""
