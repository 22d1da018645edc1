"""Triton kernels (attention, norms, cross-entropy) and their plain PyTorch references.

Empty until the kernels land; the package exists so the layout of DESIGN.md section 2 is in place.
"""
