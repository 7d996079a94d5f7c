"""Web crawl -> cleaned shards -> tokenizer -> token shards -> packed, resumable batches."""
