"""The files of a training stage's work folder, shared by the launching process and the ranks."""

INIT = "init"                  # the starting model (single-model names), written before the ranks start
HELDOUT_FILE = "heldout.npz"   # the held-out rows every rank scores
CHECKPOINTS = "checkpoints"    # resumable training states (pretrain)
METRICS_FILE = "metrics.jsonl"
RESULT_FILE = "train_result.json"
TRAINED = "checkpoint"         # the trained model as a pipeline checkpoint (what pretrain's init=warmup reads)
EXPORT = "hf"                  # the trained model as a transformers folder
