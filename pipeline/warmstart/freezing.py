"""Which parameters the warmup trains; every other tensor (the transformer body) stays frozen, bit for bit.

Always the input embeddings; the untied LM head unless `warmup.train_head=false` (a tied head is the
embedding); with `warmup.train_norms=true` every norm's weights as well (the blocks', the final one and
BLOOM's embedding LayerNorm: a few thousand numbers that rescale what the new embeddings feed the frozen
body); `warmup.train_embedding_norm=true` adds the embedding LayerNorm alone.
"""

from __future__ import annotations

from typing import Callable


def is_norm(name: str) -> bool:
    """`blocks.3.attn_norm.weight`, `final_norm.weight`, `embedding.norm.bias`: the module's name ends in `norm`."""
    module = name.rsplit(".", 1)[0]
    return module.rsplit(".", 1)[-1].endswith("norm")


def warmup_trainable(train_head: bool, train_norms: bool, train_embedding_norm: bool) -> Callable[[str], bool]:
    prefixes = ("embedding.tokens.",) + (("head.",) if train_head else ()) + \
        (("embedding.norm.",) if train_embedding_norm else ())
    return lambda name: name.startswith(prefixes) or (train_norms and is_norm(name))
