"""One rank of a training stage: `python -m pipeline.parallel.worker --entry M:F --config C --work-dir W`.

Started by `pipeline.parallel.launch`; reads the config the launching process resolved, so every
rank trains with exactly the same settings.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from pathlib import Path

from omegaconf import OmegaConf

from pipeline.contract import StageInterrupted

log = logging.getLogger("pipeline")


def load_config(path: Path):
    from pipeline.config import PipelineConfig

    return OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(PipelineConfig), OmegaConf.load(path)))


def run_entry(entry: str, cfg, work_dir: Path) -> None:
    module, _, function = entry.partition(":")
    getattr(importlib.import_module(module), function)(cfg, work_dir)


def slurm_ranks() -> None:
    """Under srun, torch.distributed's rank variables from Slurm's task ids."""
    if "RANK" not in os.environ and "SLURM_PROCID" in os.environ:
        os.environ.update(RANK=os.environ["SLURM_PROCID"], LOCAL_RANK=os.environ["SLURM_LOCALID"],
                          WORLD_SIZE=os.environ["SLURM_NTASKS"])


def main() -> None:
    slurm_ranks()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--entry", required=True, help="module:function, called as function(cfg, work_dir)")
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--work-dir", required=True, type=Path)
    args = parser.parse_args()
    rank = os.environ.get("RANK", "?")
    logging.basicConfig(level=logging.INFO, format=f"[%(asctime)s][rank {rank}][%(name)s] %(message)s")
    try:
        run_entry(args.entry, load_config(args.config), args.work_dir)
    except StageInterrupted as stop:
        log.warning("%s", stop)
        sys.exit(StageInterrupted.exit_code)
    except Exception:
        log.exception("This rank failed")
        sys.exit(1)


if __name__ == "__main__":
    main()
