"""Packed training data: tokenized shards of the mix plan's sources (tokenize.py, shards.py,
output.py), their layout and repeats index (packed.py), and the sampler the training ranks read them
with (sampler.py). config.py, the `pack` section, imports neither numpy nor torch, so that the
command line checks it in a moment."""
