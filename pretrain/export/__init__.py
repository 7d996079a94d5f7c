"""Export: a checkpoint to a Hugging Face folder, what it may replace, its model card, merged checkpoints."""
