"""DeepSpeed pretraining of the registered model families (RoBERTa, GPT-2, Llama, T5, ModernBERT, ELECTRA) and the
Hugging Face export.

One room per concern: run/ (the training run: loop, step, engine, schedule, evaluation, metrics, the in-loop guards
and the callback runner), checkpoint/ (checkpoints that survive a kill, their safe loader, the parity probe and the
resume diff), callbacks/ (the built-in callbacks), export/ (the Hugging Face folder, its model card, merges) and
tools/ (`pretrain plan`, ladder, mixture, decay), beside families/ and objectives/. Fine-tuning an export is adapt's
(`python -m adapt`).
"""
