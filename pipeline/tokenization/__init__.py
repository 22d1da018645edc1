"""The tokenizer stage's parts: the training sample, the two trainers, the folder on disk, the
scores."""
