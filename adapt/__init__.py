"""What downstream teams do with an export: fine-tune, transfer evaluation (pretrained vs random init), labelled data."""
