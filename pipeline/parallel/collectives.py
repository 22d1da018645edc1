"""Bounded collectives: a collective of the training ranks that waits longer than `parallel.collective_timeout_s`
fails with an error naming the rank and the operation, instead of holding every rank (and the Slurm allocation)
forever; the launcher then stops the other ranks (pipeline/parallel/ranks.py).

`bound_collectives` runs in each rank before its process group starts, and returns the timeout to start it with:
- `init_process_group(timeout=...)` bounds the world group only. A group made later by `new_group` without a
  timeout of its own, as DeepSpeed makes the tensor, pipeline and data-parallel groups, gets torch's default
  instead (10 minutes on NCCL, 30 on gloo), which torch reads from two attributes of
  `torch.distributed.distributed_c10d` when the group is made: they are set to the same timeout (private names,
  checked on torch 2.13; tests/unit/parallel/test_collectives.py fails if they move).
- NCCL: with TORCH_NCCL_ASYNC_ERROR_HANDLING=3 (torch's default, set unless the user chose another), a collective
  past its timeout aborts the rank after the watchdog logs `[Rank N] Watchdog caught collective operation
  timeout: WorkNCCL(SeqNum=.., OpType=ALLREDUCE, NumelIn=..) ran for .. milliseconds before timing out`.
- gloo raises the timeout in the waiting rank's collective, whose traceback names it.
- TORCH_DISTRIBUTED_DEBUG=DETAIL, which the tests set and a user may set for a run: before each collective, the
  ranks of its group check that they all run the same one (kind, shapes, dtypes). A mismatch then fails at once,
  naming what each rank runs ("Detected mismatch between collectives on ranks. Rank 1 is running collective:
  CollectiveFingerPrint(OpType=ALLREDUCE, TensorShape=[5349] ..."), and a rank that does not arrive is named
  within the timeout ("Rank 1 failed to pass monitoredBarrier"). It costs a gloo round trip per collective, so
  runs that are timed go without it.
"""

from __future__ import annotations

import os
from datetime import timedelta

import torch.distributed.distributed_c10d as c10d

# torch's defaults for a group made without a timeout (see above).
_GROUP_DEFAULT_TIMEOUTS = ("default_pg_timeout", "default_pg_nccl_timeout")


def bound_collectives(timeout_s: float) -> timedelta:
    """Every process group this rank makes from now on, the world's included, times out after `timeout_s`; the
    timeout for `init_process_group` (or deepspeed.init_distributed) is returned."""
    timeout = timedelta(seconds=timeout_s)
    missing = [name for name in _GROUP_DEFAULT_TIMEOUTS if not hasattr(c10d, name)]
    if missing:
        raise RuntimeError(f"torch.distributed.distributed_c10d has no {', '.join(missing)} in this torch version: "
                           f"parallel.collective_timeout_s cannot bound the process groups DeepSpeed makes. "
                           f"Update pipeline/parallel/collectives.py for torch's new name.")
    for name in _GROUP_DEFAULT_TIMEOUTS:
        # None where torch was built without NCCL (its default is then never read).
        if getattr(c10d, name) is not None:
            setattr(c10d, name, timeout)
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")
    return timeout
