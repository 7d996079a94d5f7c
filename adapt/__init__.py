"""What downstream teams do with an export: fine-tune, transfer evaluation (pretrained vs random init), the
adaptation methods (full, frozen, LoRA, ULMFiT) and continued pretraining on a task's text. The labelled data
itself is read by data_pipeline/labelled.py."""
