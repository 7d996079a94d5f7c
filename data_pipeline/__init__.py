"""Web crawl -> cleaned shards -> tokenizer -> token shards -> packed, resumable batches.

The data floor: readers (one per input format), HTML extraction, the cleaning filters and n-gram
decontamination, exact and MinHash dedup as stages of tasks for an executor (process pool, Ray, Slurm arrays),
tokenizer training, token shards, packing, the deterministic loader, the objectives' collators, and labelled
data as downstream teams hold it (read by adapt). It imports core and runconfig only.
"""
