"""Adaptation methods, each run as an arm pair (pretrained, random) of the transfer protocol: `full` (every weight
fine-tuned, adapt/transfer.py), `frozen` (frozen.py), `lora` (lora.py), `ulmfit` (ulmfit.py)."""
