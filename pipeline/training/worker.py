"""One rank of a training stage: `python -m pipeline.training.worker <job.yaml>`, started by
pipeline/training/launch.py through pipeline/parallel/ranks.py."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from pipeline.errors import StageInterrupted
from pipeline.parallel.ranks import slurm_ranks
from pipeline.training.job import read_job
from pipeline.training.rank import train_rank

log = logging.getLogger("pipeline")


def main() -> None:
    slurm_ranks()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("job", type=Path, help="the job file the launching process wrote")
    args = parser.parse_args()
    rank = os.environ.get("RANK", "?")
    logging.basicConfig(level=logging.INFO, format=f"[%(asctime)s][rank {rank}][%(name)s] %(message)s")
    try:
        train_rank(read_job(args.job))
    except StageInterrupted as stop:
        log.warning("%s", stop)
        sys.exit(StageInterrupted.exit_code)
    except Exception:
        log.exception("This rank failed")
        sys.exit(1)
    # Every output is written (train_rank's last barrier saw to it). Leave without the interpreter's teardown: with
    # gloo, objects of DeepSpeed's process groups destroyed there can abort the process (SIGABRT, "terminate called
    # without an active exception"), which srun reports as a failed rank and answers by killing the others.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
