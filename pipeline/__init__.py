"""Continual pretraining of language models for low-resource languages, as a staged Hydra pipeline.

Run `python -m pipeline stage=<stage> lang=<code>`; see README.md.
"""
