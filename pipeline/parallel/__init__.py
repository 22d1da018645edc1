"""Parallel training: starting the ranks and bounding their collectives (ranks.py), the transformer
as DeepSpeed pipeline layers (pipeline_model.py, with deepspeed_internals.py), tensor parallelism
(tensor_parallel.py) and the torch-free `parallel` section with its tensor-parallel fit check
(config.py)."""
