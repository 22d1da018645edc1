"""Parallel training: starting the ranks (launch.py, worker.py), the transformer as DeepSpeed pipeline layers
(pipeline_model.py) and tensor parallelism (tensor_parallel.py, tensor_parallel_fit.py)."""
