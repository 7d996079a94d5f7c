"""DeepSpeed pretraining of RoBERTa-, GPT- and T5-style transformers models, export and fine-tune."""
