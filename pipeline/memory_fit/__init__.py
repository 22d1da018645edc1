"""Will a training layout fit? Memory per rank of the pretrain engine, before a job starts
(torch-free).

`python -m pipeline stage=plan model=<preset> parallel.tp=.. parallel.pp=.. parallel.dp=..
cluster=lumi` prints, per pipeline stage, the weights, gradients, ZeRO-1 optimizer partition,
activations (with and without activation checkpointing), the LM head and loss, and communication
buffers against the device's memory, the pipeline bubble, the tokens per step and LUMI's rules of
thumb; a layout that does not fit is refused with the smallest one that does. `check_layout(cfg)` is
the same check for `stage=pretrain`; `fitting_micro_batch` picks the largest micro-batch that fits
where a training section leaves it null (the real-base defaults do). The pieces:

- devices.py: the devices and their memory (MI250X GCD, H100, H200, the host's memory for CPU
  ranks);
- layout.py: tp x pp x dp, micro-batches, bubble, DeepSpeed's split of the blocks over the
  pipeline-parallel stages;
- memory.py: the memory of one rank, term by term (its docstring has the formulas; docs/plan.md
  explains them);
- plan.py: every pipeline-parallel stage of a layout, the rules of thumb, and the smallest layout
  that fits;
- check.py: the entry points and the table (model.base's shape comes from
  pipeline/model/base_shape.py).
"""

from __future__ import annotations

from pipeline.memory_fit.check import (
    LayoutError,
    check_layout,
    fitting_micro_batch,
    node_filling_layout,
    plan_for_config,
    print_plan,
)
from pipeline.memory_fit.plan_config import PlanConfig, validate_plan

__all__ = [
    "LayoutError",
    "PlanConfig",
    "check_layout",
    "fitting_micro_batch",
    "node_filling_layout",
    "plan_for_config",
    "print_plan",
    "validate_plan",
]
