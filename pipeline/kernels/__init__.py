"""Triton kernels (attention, norms, cross-entropy) and their plain PyTorch references.

`flash_attention` is the API the model calls; until the Triton kernels land it runs the reference.
"""

from pipeline.kernels.reference import attention as flash_attention

__all__ = ["flash_attention"]
