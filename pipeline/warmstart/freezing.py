"""Which parameters the warmup trains; every other tensor (the transformer body) stays frozen, bit for bit.

Always the input embeddings; the untied LM head unless `warmup.train_head=false` (a tied head is the
embedding); with `warmup.train_norms=true` every norm's weights as well (the blocks', the final one and
BLOOM's embedding LayerNorm: a few thousand numbers that rescale what the new embeddings feed the frozen
body); `warmup.train_embedding_norm=true` adds the embedding LayerNorm alone. Given as parameter-name prefixes,
which the training job (pipeline/training/job.py) carries to the ranks.
"""

from __future__ import annotations


def warmup_trainable(train_head: bool, train_norms: bool, train_embedding_norm: bool, num_layers: int) -> list[str]:
    prefixes = ["embedding.tokens."]
    if train_head:
        prefixes.append("head.")
    if train_embedding_norm or train_norms:
        prefixes.append("embedding.norm.")
    if train_norms:
        prefixes += [f"blocks.{i}.{norm}." for i in range(num_layers) for norm in ("attn_norm", "mlp_norm")]
        prefixes.append("final_norm.")
    return prefixes
