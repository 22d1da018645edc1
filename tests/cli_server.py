"""`python -m pipeline` for the tests, without paying its imports each time.

The suite runs the CLI about 170 times; each process spent 2-3 s importing Hydra and datatrove before it did
anything, a training stage 6-8 s (torch, DeepSpeed, torch._dynamo): minutes of the 2-core budget. This server
imports the CLI's modules once, then runs each command in a child forked from it (a fork server, as
multiprocessing's): the child takes the command's working folder, environment and argv and runs
`pipeline/__main__.py` as `python -m pipeline` would, with stdin from /dev/null and stdout/stderr to files.

What a fork shares that a fresh process would not, and why it does not matter here:
- import-time reads of the environment (torch.distributed reads TORCH_DISTRIBUTED_DEBUG, OpenMP its
  OMP_NUM_THREADS): the client forks only for a command whose environment is the one the server started with,
  and starts a real process otherwise (tests/conftest.py: run_cli);
- random state: the child reseeds Python's and NumPy's global generators, as a new process would;
- threads: the server starts none (torch's thread pools start on first use, in the child).
The ranks of a multi-rank stage are started by the stage itself, as fresh processes, as for a user.

Protocol, one JSON line each way over a Unix socket: {"argv", "cwd", "env", "stdout", "stderr"} ->
{"pid"} when the child starts, then {"code"} (its exit code) when it ends.
"""

from __future__ import annotations

import atexit
import importlib
import json
import os
import random
import runpy
import selectors
import socket
import sys
import threading
import traceback

# What `python -m pipeline` imports for some command: the CLI, every stage (torch, datatrove, DeepSpeed through
# the training rank) and what a stage imports on first use. Not pipeline.__main__ itself: the child runs it as
# __main__, once, as the real command does.
PRELOAD = ("hydra", "omegaconf", "yaml", "pipeline.config", "pipeline.overrides", "pipeline.memory_fit",
           "pipeline.workflow", "pipeline.training.rank", "torch._dynamo", "datatrove.pipeline.dedup.minhash",
           "datatrove.pipeline.filters", "datatrove.executor")


def preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    from pipeline.config import STAGE_NAMES

    for stage in STAGE_NAMES:
        importlib.import_module(f"pipeline.stages.{stage}")


def run_command(request: dict) -> None:
    """In the forked child: become `python -m pipeline <argv>` in `cwd`; never returns."""
    os.setsid()  # its own process group, as the client may stop the command with everything it started
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, path, mode in ((0, os.devnull, os.O_RDONLY), (1, request["stdout"], os.O_WRONLY),
                           (2, request["stderr"], os.O_WRONLY)):
        opened = os.open(path, mode)
        os.dup2(opened, fd)
        os.close(opened)
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    sys.argv = ["pipeline", *request["argv"]]
    try:
        runpy.run_module("pipeline", run_name="__main__", alter_sys=True)
        code = 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            code = stop.code or 0
        else:
            print(stop.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
        code = 1
    # What the interpreter does on exit: wait for the threads that are not daemons, run the atexit handlers.
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def serve(path: str) -> None:
    preload()
    assert threading.active_count() == 1, "the preloaded modules started threads: forking would copy their locks"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    waiting: dict[int, socket.socket] = {}
    parent = os.getppid()
    while os.getppid() == parent:  # the pytest process that started it is gone: so is the suite
        for key, _ in selector.select(timeout=0.05):
            connection, _ = listener.accept()
            request = json.loads(connection.makefile("r", encoding="utf-8").readline())
            pid = os.fork()
            if pid == 0:
                for sock in (listener, connection, *waiting.values()):
                    sock.close()
                selector.close()
                run_command(request)
            connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            waiting[pid] = connection
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection = waiting.pop(pid)
            connection.sendall(json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            connection.close()


if __name__ == "__main__":
    serve(sys.argv[1])
