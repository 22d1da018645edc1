"""`python -m pipeline` for the tests, without paying its imports each time.

The suite runs the CLI about 170 times; each process spent 2-3 s importing Hydra and datatrove
before it did anything, a training stage 6-8 s (torch, DeepSpeed, torch._dynamo): minutes of the
2-core budget. This server imports the CLI's modules once, then runs each command in a child forked
from it (a fork server, as multiprocessing's): the child takes the command's working folder,
environment and argv and runs `pipeline/__main__.py` as `python -m pipeline` would, with stdin from
/dev/null and stdout/stderr to files.

What a fork shares that a fresh process would not, and why it does not matter here:
- import-time reads of the environment (torch.distributed reads TORCH_DISTRIBUTED_DEBUG, OpenMP its
  OMP_NUM_THREADS): the client forks only for a command whose environment is the one the server
  started with, and starts a real process otherwise (tests/conftest.py: run_cli);
- random state: the child reseeds Python's, NumPy's and torch's global generators, as a new process
  would;
- peak memory: the child's peak resident set is reset to what it holds when it starts
  (/proc/self/clear_refs), so that the peaks a stage reports are its own, not the server's;
- threads: the server starts none (torch's thread pools start on first use, in the child).

Ranks: a stage's training ranks (and the ranks some tests start) are `python -m <module>` or `python
-c <code>` processes of their own, which the launcher (pipeline/parallel/ranks.py) starts with
subprocess.Popen and watches, signals and kills. In a forked command, and in a test inside
`ranks_from_server()` (tests/conftest.py), Popen starts such a command as `<folder>/python` instead:
a small stand-in (SHIM) that asks this server to fork the rank, passing its own stdin, stdout and
stderr, the environment and the working folder, forwards SIGTERM, SIGUSR1 and SIGINT to it and exits
with its exit code; when the stand-in dies (SIGKILL), the server kills the rank's process group. The
server forks a rank only if its environment differs from the one the server started with in nothing
but torch.distributed's variables (RANK, MASTER_PORT ...), PYTHONPATH (put on sys.path) and what is
read at run time only; otherwise the stand-in runs the real interpreter with the same arguments.

Protocol, one JSON line each way over a Unix socket: {"argv", "cwd", "env", "stdout", "stderr"} (a
CLI command) or b"F" with three file descriptors, then {"python", "cwd", "env"} (a rank) -> {"pid"}
when the child starts (or {"refused"}), then {"code"} (its exit code) when it ends.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import random
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import threading
import traceback
import warnings

from pipeline.commit_steps import KILL_AT_STEP, STEPS_FILE

# What `python -m pipeline` imports for some command: the CLI, every stage (torch, datatrove,
# DeepSpeed through the training rank) and what a stage imports on first use. Not pipeline.__main__
# itself: the child runs it as __main__, once, as the real command does.
PRELOAD = (
    "hydra",
    "omegaconf",
    "yaml",
    "pipeline.config",
    "pipeline.overrides",
    "pipeline.memory_fit",
    "pipeline.workflow",
    "pipeline.training.rank",
    "torch._dynamo",
    "datatrove.pipeline.dedup.minhash",
    "datatrove.pipeline.filters",
    "datatrove.executor",
)


def preload() -> None:
    for name in PRELOAD:
        importlib.import_module(name)
    from pipeline.config import STAGE_NAMES

    for stage in STAGE_NAMES:
        importlib.import_module(f"pipeline.stages.{stage}")


# Read at run time only, so a command or a rank may have its own: set by torch._inductor in a
# process when it first compiles; the fault-injection harness's (pipeline/commit_steps.py).
RUN_TIME_VARIABLES = {"TORCHINDUCTOR_CACHE_DIR", KILL_AT_STEP, STEPS_FILE}
# Variables a forked rank may have of its own: the modules the server imported do not read them on
# import.
RANK_VARIABLES = {
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "PYTHONPATH",
    "HYDRA_FULL_ERROR",
    "PYTEST_CURRENT_TEST",
} | RUN_TIME_VARIABLES

SHIM = """#!{python} -S
# `python` for a rank, forked by the test server at {socket} (tests/cli_server.py).
import json, os, signal, socket, sys

args = sys.argv[1:]
try:
    connection = socket.socket(socket.AF_UNIX)
    connection.connect({socket!r})
    socket.send_fds(connection, [b"F"], [0, 1, 2])
    connection.sendall(json.dumps({{"python": args, "cwd": os.getcwd(), "env": dict(os.environ)}}).encode() + b"\\n")
    replies = connection.makefile("r", encoding="utf-8")
    reply = json.loads(replies.readline())
except OSError:
    reply = {{}}
if "pid" not in reply:
    os.execv({python!r}, [{python!r}, *args])
for number in (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT):
    signal.signal(number, lambda number, frame: os.kill(reply["pid"], number))
line = replies.readline()
sys.exit(json.loads(line)["code"] if line else 1)
"""


def shim_path(socket_path: str) -> str:
    return os.path.join(os.path.dirname(socket_path), "python")


def popen_through(shim: str) -> type:
    """subprocess.Popen, but `python -m ...` and `python -c ...` start through the server's stand-in
    (above)."""

    class PopenThroughServer(subprocess.Popen):
        def __init__(self, args, *rest, **kwargs):
            if (
                isinstance(args, (list, tuple))
                and len(args) > 2
                and args[0] == sys.executable
                and args[1] in ("-m", "-c")
            ):
                args = [shim, *args[1:]]
            super().__init__(args, *rest, **kwargs)

    return PopenThroughServer


def _become(request: dict, fds: tuple[int, int, int]) -> None:
    """The forked child takes the request's process group, folder, environment and standard streams."""
    # its own process group, as the client may stop the command with everything it started
    os.setsid()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    for fd, opened in enumerate(fds):
        os.dup2(opened, fd)
        os.close(opened)
    # A new interpreter seeds Python's, NumPy's and torch's generators from the system's randomness.
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    if "torch" in sys.modules:
        sys.modules["torch"].seed()
    # Its peak resident set (VmHWM, what the stages report) starts from what it holds now, not the
    # server's peak.
    with (
        contextlib.suppress(OSError),
        open("/proc/self/clear_refs", "w", encoding="ascii") as handle,
    ):
        handle.write("5")


def _run(main) -> None:
    """Run `main` as a process's main program would run; exit with its code. Never returns."""
    try:
        main()
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
    # What the interpreter does on exit: wait for the threads that are not daemons, run the atexit
    # handlers.
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(code)


def run_command(request: dict, shim: str) -> None:
    """In the forked child: become `python -m pipeline <argv>` in `cwd`; never returns."""
    fds = (
        os.open(os.devnull, os.O_RDONLY),
        os.open(request["stdout"], os.O_WRONLY),
        os.open(request["stderr"], os.O_WRONLY),
    )
    _become(request, fds)
    subprocess.Popen = popen_through(shim)  # the stage's ranks: forked too (above)
    sys.argv = ["pipeline", *request["argv"]]
    _run(lambda: runpy.run_module("pipeline", run_name="__main__", alter_sys=True))


def run_python(request: dict, fds: tuple[int, int, int]) -> None:
    """In the forked child: become `python -m <module> ...` or `python -c <code> ...`; never
    returns."""
    _become(request, fds)
    paths = [path for path in request["env"].get("PYTHONPATH", "").split(os.pathsep) if path]
    sys.path[:0] = [path for path in paths if path not in sys.path]
    option, target, *rest = request["python"]
    if option == "-m":
        sys.argv = [target, *rest]
        # the module may be among those preloaded: runpy warns that it runs it again, as __main__
        warnings.filterwarnings("ignore", category=RuntimeWarning, module="runpy")
        _run(lambda: runpy.run_module(target, run_name="__main__", alter_sys=True))
    sys.argv = ["-c", *rest]
    _run(lambda: exec(compile(target, "<string>", "exec"), {"__name__": "__main__"}))


def _forkable_rank(request: dict, started: dict[str, str]) -> bool:
    """Whether a rank's environment is the one the server started with (before its imports set
    variables of their own), but for RANK_VARIABLES."""
    args, env = request["python"], request["env"]
    keys = (set(env) | set(started)) - RANK_VARIABLES
    return (
        len(args) >= 2
        and args[0] in ("-m", "-c")
        and all(env.get(key) == started.get(key) for key in keys)
    )


def _receive(connection: socket.socket) -> tuple[dict, tuple]:
    """A request and, for a rank, the stand-in's standard streams."""
    first, fds, _, _ = socket.recv_fds(connection, 1, 3)
    line = connection.makefile("rb").readline()
    return json.loads(line if first == b"F" else first + line), tuple(fds)


def serve(path: str) -> None:
    started = dict(os.environ)
    preload()
    assert threading.active_count() == 1, (
        "the preloaded modules started threads: forking would copy their locks"
    )
    shim = shim_path(path)
    with open(shim, "w", encoding="utf-8") as handle:
        handle.write(SHIM.format(python=sys.executable, socket=path))
    os.chmod(shim, 0o755)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(path)
    listener.listen()
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    waiting: dict[int, socket.socket] = {}  # child pid -> its client's connection
    parent = os.getppid()
    while os.getppid() == parent:  # the pytest process that started it is gone: so is the suite
        for key, _ in selector.select(timeout=0.05):
            if (
                key.fileobj is not listener
            ):  # a client gone before its child ended (a killed stand-in)
                selector.unregister(key.fileobj)
                if not key.fileobj.recv(1):
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(key.data, signal.SIGKILL)
                continue
            connection, _ = listener.accept()
            request, fds = _receive(connection)
            if "python" in request and not _forkable_rank(request, started):
                connection.sendall(json.dumps({"refused": "environment"}).encode() + b"\n")
                connection.close()
                for fd in fds:
                    os.close(fd)
                continue
            pid = os.fork()
            if pid == 0:
                for sock in (listener, connection, *waiting.values()):
                    sock.close()
                selector.close()
                run_python(request, fds) if "python" in request else run_command(request, shim)
            for fd in fds:
                os.close(fd)
            connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            waiting[pid] = connection
            selector.register(connection, selectors.EVENT_READ, pid)
        while waiting:
            pid, status = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            connection = waiting.pop(pid)
            with contextlib.suppress(KeyError):  # unless its client has gone already
                selector.unregister(connection)
            with contextlib.suppress(OSError):
                connection.sendall(
                    json.dumps({"code": os.waitstatus_to_exitcode(status)}).encode() + b"\n"
                )
            connection.close()


if __name__ == "__main__":
    serve(sys.argv[1])
