"""Training on DeepSpeed's pipeline engine, shared by the warmup and pretrain stages."""
