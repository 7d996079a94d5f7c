"""DeepSpeed pretraining of the registered model families (RoBERTa, GPT-2, Llama, T5, ModernBERT, ELECTRA) and the
Hugging Face export.

The training run (loop, engine, schedule, evaluation and the in-loop guards), checkpoints that survive a kill, the
export folder with its parity check and model card, and the tools that start nothing (`pretrain plan`, plots, the
resume diff), beside `families/` and `objectives/`. Fine-tuning an export is adapt's (`python -m adapt`).
"""
