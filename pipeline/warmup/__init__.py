"""The warm start: a new vocabulary's embeddings built from the base model's, before any training."""
