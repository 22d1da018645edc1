"""Parallel training: starting the ranks, and (issue 9) the 3D layout on DeepSpeed."""
