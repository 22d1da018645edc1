"""Shared helpers: run the real CLI, read the shards a stage wrote, build raw corpora."""

from __future__ import annotations

import atexit
import contextlib
import gzip
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Callable

import pytest
from filelock import FileLock

from tests.cli_server import RUN_TIME_VARIABLES, popen_through, shim_path

# The harness's comparisons show what differs, as a test's own asserts do.
pytest.register_assert_rewrite("tests.fault_injection")

REPO = Path(__file__).resolve().parent.parent

# Every multi-rank run a test starts (its own ranks, or a training stage's through the CLI) checks
# its collectives: a rank that runs another collective than the others fails at once, naming both
# (pipeline/parallel/ranks.py).
os.environ.setdefault("TORCH_DISTRIBUTED_DEBUG", "DETAIL")
DATA = REPO / "data"

# Text that a tokenizer mangles if it normalises, strips or drops anything: combining accents next
# to precomposed ones, emoji sequences, tabs, runs of spaces, CRLF, control characters, mixed
# scripts, CJK.
TRICKY_TEXTS = [
    "Blåbærsyltetøy på brødskiva, takk! «Sånn», sa hun – og gikk.",
    "e\u0301 (e + combining acute) is not \u00e9 (precomposed); n\u0303 is not \u00f1; A\u030a is "
    "not \u00c5",
    "👩\u200d👩\u200d👧\u200d👦 family (ZWJ), 🇳🇴 flag, 👍🏽 skin tone, 😀🎉",
    "tab\tseparated\t\tvalues\n\nafter a blank line\n",
    "a long run of spaces:" + " " * 40 + "end, and a tab run:\t\t\t\tend",
    "windows\r\nline\r\nendings\r\n",
    "  leading and trailing spaces  ",
    "control \x01\x02\x1b[0m\x7f characters\x0b\x0c",
    "mixed scripts: Москва, Αθήνα, القاهرة, दिल्ली, 東京, 서울",
    "漢字とひらがなとカタカナ、中文句子。",
    "    def indented(code):\n        return {'a': [1, 2, 3]}\n",
    "numbers 1234567890 3.14159 1,000,000 and 2025-11-20",
    "\u00a0non-breaking\u2009thin\u3000ideographic spaces and a zero\u200bwidth one",
    "the literal text <0x41> and <0xE2> looks like a byte token",
]


def repo_pythonpath() -> str:
    """PYTHONPATH for a process that imports this checkout: the repository first, then what was set
    (wheels installed with --target, as on the benchmark machines)."""
    return os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))


def cli_env() -> dict[str, str]:
    """The environment of a `python -m pipeline` process started by a test."""
    return {**os.environ, "PYTHONPATH": repo_pythonpath(), "HYDRA_FULL_ERROR": "1"}


# The environment the CLI server starts with (tests/cli_server.py): a command whose environment
# differs in more than pytest's per-test variable gets a process of its own (the server's modules
# read some of it on import). Both set by pytest_configure.
SERVER_ENV: dict[str, str] = {}
SESSION_ENV: dict[str, str] = {}
PER_TEST_VARIABLES = {"PYTEST_CURRENT_TEST"}


def pytest_configure(config):
    """Each test process's share of the cores (2 on CI: one each), for torch here and in every
    process a test starts (the stages' ranks split it further: pipeline/parallel/ranks.py). Set
    here, in pytest-xdist's controller too, whose environment its workers inherit (set on import,
    the controller's own count of one process won: every process ran two threads). With a thread per
    core in each of the two processes, the cores are oversubscribed and OpenMP's threads wait on
    each other: a small model's forward ran 6x slower with 2 threads than with 1 on a busy 2-core
    machine, a whole evaluate stage 10x."""
    global SERVER_ENV, SESSION_ENV
    processes = (
        os.environ.get("PYTEST_XDIST_WORKER_COUNT")
        or config.getoption("numprocesses", default=None)
        or 1
    )
    processes = int(processes) if str(processes).isdigit() and int(processes) > 0 else 1
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // processes)))
    SERVER_ENV, SESSION_ENV = cli_env(), dict(os.environ)


def restore_environment() -> None:
    """This process's environment as the session started, but for pytest's per-test variable: a
    training stage run in this process sets torch.distributed's variables (RANK, MASTER_PORT ...),
    as it does in the CLI's."""
    for key in set(os.environ) - set(SESSION_ENV) - PER_TEST_VARIABLES:
        del os.environ[key]
    for key, value in SESSION_ENV.items():
        if os.environ.get(key) != value and key not in PER_TEST_VARIABLES:
            os.environ[key] = value


_server_path: str | None = None  # this process's CLI server's socket, once started
_server_lock = threading.Lock()


def _server_socket() -> str:
    """The socket of this process's CLI server, started on first use (it imports for a few seconds)."""
    global _server_path
    with _server_lock:
        if _server_path is None:
            folder = tempfile.mkdtemp(prefix="pipeline-cli-")
            path = os.path.join(folder, "socket")
            process = subprocess.Popen(
                [sys.executable, "-m", "tests.cli_server", path], cwd=REPO, env=SERVER_ENV
            )
            atexit.register(
                lambda: (process.kill(), process.wait(), shutil.rmtree(folder, ignore_errors=True))
            )
            deadline = time.time() + 300
            while not os.path.exists(path):
                if process.poll() is not None or time.time() > deadline:
                    raise RuntimeError(
                        f"the CLI server (tests/cli_server.py) did not start: exit code "
                        f"{process.poll()}; run `python -m tests.cli_server /tmp/s` to see why, or "
                        f"set PIPELINE_TESTS_FORK=0 to start every command as a process"
                    )
                time.sleep(0.05)
            _server_path = path
        return _server_path


def _forking() -> bool:
    return os.environ.get("PIPELINE_TESTS_FORK", "1") != "0"


@contextlib.contextmanager
def ranks_from_server():
    """The `python -m ...` and `python -c ...` processes that a test starts inside this block
    (training ranks) are forked from this process's CLI server where their environment allows
    (tests/cli_server.py), as a forked command's ranks are."""
    if not _forking():
        yield
        return
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(subprocess, "Popen", popen_through(shim_path(_server_socket())))
        yield


def forkable(env: dict[str, str]) -> bool:
    if not _forking():
        return False
    keys = (set(env) | set(SERVER_ENV)) - PER_TEST_VARIABLES - RUN_TIME_VARIABLES
    return all(env.get(key) == SERVER_ENV.get(key) for key in keys)


def _run_forked(
    command: list[str], cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess:
    with tempfile.TemporaryDirectory() as folder:
        stdout, stderr = Path(folder, "stdout"), Path(folder, "stderr")
        stdout.touch()
        stderr.touch()
        request = {
            "argv": command[3:],
            "cwd": str(cwd),
            "env": env,
            "stdout": str(stdout),
            "stderr": str(stderr),
        }
        with socket.socket(socket.AF_UNIX) as connection:
            connection.connect(_server_socket())
            connection.sendall(json.dumps(request).encode() + b"\n")
            replies = connection.makefile("r", encoding="utf-8")
            pid = json.loads(replies.readline())["pid"]
            connection.settimeout(timeout)
            try:
                code = json.loads(replies.readline())["code"]
            except TimeoutError:
                os.killpg(pid, signal.SIGKILL)
                raise subprocess.TimeoutExpired(command, timeout) from None
        return subprocess.CompletedProcess(
            command, code, stdout.read_text(encoding="utf-8"), stderr.read_text(encoding="utf-8")
        )


def run_cli(
    *overrides: str, cwd: Path, check: bool = True, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """`python -m pipeline <overrides>` in `cwd`, as a user would type it, with `env` added to the
    environment: forked from the CLI server (tests/cli_server.py) where the environment allows, else
    as a process of its own."""
    command, env = [sys.executable, "-m", "pipeline", *overrides], {**cli_env(), **(env or {})}
    if forkable(env):
        result = _run_forked(command, cwd, env, timeout=900)
    else:
        result = subprocess.run(
            command, cwd=cwd, env=env, capture_output=True, text=True, timeout=900
        )
    if check and result.returncode != 0:
        raise AssertionError(
            f"pipeline {' '.join(overrides)} failed ({result.returncode}):\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-6000:]}"
        )
    return result


# The Norwegian chain up to `pack` for the training stages' tests: a small vocabulary (clean as
# nob_eng_cleaned).
CHAIN_OPTIONS = ("lang=nob", "tokenizer.vocab_size=2048", "workers=2")


# Markers by folder (registered in pyproject.toml; tests/README.md): stages/, e2e/ and slurm/ run
# pipeline stages through the CLI, and the multi-rank unit modules start training ranks: `slow`;
# slurm/ needs a Slurm, gpu/ CUDA.
SLOW_FOLDERS = ("stages", "e2e", "slurm")
SLOW_MODULES = (
    "test_tensor_parallel",
    "test_train_tensor_parallel",
    "test_collectives",
    "test_kernels_interpreted",
    "test_kernels_compile",
)
TESTS = Path(__file__).resolve().parent

# The suite runs in two processes (pytest-xdist, `addopts` in pyproject.toml), a whole module in
# one, so that module fixtures are built once. The longest modules go first (on 2 cores, minutes
# each; `--durations` of a whole run), so that the last minutes are not one process running a long
# module alone: the first two build the shared fixtures side by side (test_pretrain: nob_packed;
# test_evaluate_tasks: english_base); the Slurm modules are spread out (they take turns:
# slurm_cluster). xdist keeps this order only with --no-loadscope-reorder (pyproject.toml).
LONGEST_FIRST = (
    "test_pretrain",
    "test_evaluate_tasks",
    "test_kernels_compile",
    "test_kernels_interpreted",
    "test_interrupted_commits",
    "test_tokenizer_stage",
    "test_warmup",
    "test_rank_memory",
    "test_workflow_slurm",
    "test_pack_stage",
    "test_demo",
    "test_train_tensor_parallel",
    "test_tensor_parallel",
    "test_base_models",
    "test_clean_languages",
    "test_pretrain_slurm",
    "test_training_budget",
    "test_named_runs",
    "test_clean_nob",
    "test_workflow",
    "test_mix_stage",
    "test_clean_slurm",
    "test_evaluate",
    "test_safety",
    "test_clean_bad_input",
    "test_small_languages",
    "test_collectives",
    "test_forked_commands",
)


def _clear_datatrove_caches() -> None:
    checks = sys.modules.get("datatrove.utils._import_utils")
    words = sys.modules.get("datatrove.utils.word_tokenizers")
    for cached in (
        getattr(checks, "_is_package_available", None),
        getattr(checks, "_is_distribution_available", None),
        getattr(words, "load_word_tokenizer", None),
    ):
        if cached is not None and hasattr(cached, "cache_clear"):
            cached.cache_clear()


@pytest.fixture(autouse=True)
def _session_environment():
    """Each test starts in the session's environment (after the fixtures of wider scope, which may
    have trained in this process) and leaves it so."""
    restore_environment()
    yield
    restore_environment()


@pytest.fixture(autouse=True)
def _fresh_datatrove_caches():
    """datatrove caches whether a package is importable and the word tokenizers it built
    (lru_cache): a test that hides a package (spaCy, by monkeypatching sys.modules) must neither
    find a tokenizer built before it nor leave its 'no spaCy' to the tests after it in the same
    process."""
    _clear_datatrove_caches()
    yield
    _clear_datatrove_caches()


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(items):
    for item in items:
        path = Path(str(item.fspath)).resolve()
        folder = path.relative_to(TESTS).parts[0] if path.is_relative_to(TESTS) else ""
        if folder in SLOW_FOLDERS or path.stem in SLOW_MODULES:
            item.add_marker(pytest.mark.slow)
        if folder in ("slurm", "gpu"):
            item.add_marker(getattr(pytest.mark, folder))
    rank = {module: place for place, module in enumerate(LONGEST_FIRST)}
    # stable: each module keeps its order
    items.sort(key=lambda item: rank.get(item.module.__name__.rsplit(".", 1)[-1], len(rank)))


def built_once(tmp_path_factory, name: str, build: Callable[[Path], object]) -> Path:
    """A folder filled by `build` once per test session: with several pytest-xdist processes the
    first builds it under a lock and the others wait for it. Users must copy it before writing into
    it."""
    if os.environ.get("PYTEST_XDIST_WORKER") is None:
        folder = tmp_path_factory.mktemp(name)
        build(folder)
        return folder
    shared = (
        tmp_path_factory.getbasetemp().parent
    )  # one folder per session, above each process's own
    folder, done = shared / name, shared / f"{name}.done"
    with FileLock(str(shared / f"{name}.lock")):
        if not done.exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir()
            build(folder)
            done.touch()
    return folder


@pytest.fixture(scope="session")
def english_base(tmp_path_factory):
    """A small English base model as a Hugging Face folder (tests/english_base_model.py); read-only."""
    from tests.english_base_model import build_english_base

    return (
        built_once(tmp_path_factory, "base", lambda folder: build_english_base(folder / "english"))
        / "english"
    )


def _clean_nob_and_eng(cwd: Path) -> None:
    with ThreadPoolExecutor(2) as pool:
        list(pool.map(lambda lang: run_cli("stage=clean", f"lang={lang}", cwd=cwd), ("nob", "eng")))


@pytest.fixture(scope="session")
def nob_eng_cleaned(tmp_path_factory) -> Path:
    """A folder whose `work/` holds the embedded Norwegian and English samples cleaned with the
    defaults (the slowest stage on a CPU, deduplication included); read-only: modules take copies of
    it (`copy_of`)."""
    return built_once(tmp_path_factory, "nob-eng-cleaned", _clean_nob_and_eng)


def copy_of(
    cleaned: Path, tmp_path_factory, name: str, langs: tuple[str, ...] = ("nob", "eng")
) -> Path:
    """A folder of one's own holding a copy of `langs`' folders of `cleaned`'s work folder (markers
    record work-relative paths, so the copy is current)."""
    cwd = tmp_path_factory.mktemp(name)
    for lang in langs:
        shutil.copytree(cleaned / "work" / lang, cwd / "work" / lang)
    return cwd


def packed_copy(packed: Path, cwd: Path) -> Path:
    """`cwd` with a copy of `packed`'s work folder without the training stages' outputs, to train
    in."""
    shutil.copytree(
        packed / "work", cwd / "work", ignore=shutil.ignore_patterns("*warmup*", "*pretrain*")
    )
    return cwd


def _pack_nob(cleaned: Path, cwd: Path) -> None:
    shutil.copytree(cleaned / "work" / "nob", cwd / "work" / "nob")  # no English filler
    for stage in ("clean", "mix", "tokenizer", "pack"):
        run_cli(f"stage={stage}", *CHAIN_OPTIONS, cwd=cwd)
    assert marker(cwd / "work", "nob", "pack")


@pytest.fixture(scope="session")
def nob_packed(tmp_path_factory, nob_eng_cleaned):
    """A work folder with the embedded Norwegian sample cleaned, mixed, tokenized and packed: this
    process's own copy, which the training stages' tests write their runs into."""
    packed = built_once(tmp_path_factory, "nob-packed", lambda cwd: _pack_nob(nob_eng_cleaned, cwd))
    return copy_of(packed, tmp_path_factory, "nob-packed-own", langs=("nob",))


def read_jsonl_gz(folder: Path) -> list[dict]:
    """Every record of every `*.jsonl.gz` below `folder`."""
    records = []
    for path in sorted(Path(folder).rglob("*.jsonl.gz")):
        with gzip.open(path, "rt", encoding="utf-8") as f:
            records.extend(json.loads(line) for line in f if line.strip())
    return records


def write_jsonl_gz(path: Path, records: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wt", encoding="utf-8") as f:
        for record in records:
            f.write(json.dumps(record, ensure_ascii=False) + "\n")


def marker(work: Path, lang: str, stage: str) -> dict:
    return json.loads((work / lang / stage / "_SUCCESS.json").read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def embedded_records() -> dict[str, list[dict]]:
    """The embedded sample of each language, as records."""
    return {
        folder.name: read_jsonl_gz(folder) for folder in sorted(DATA.iterdir()) if folder.is_dir()
    }


@pytest.fixture(scope="module")
def slurm_cluster(tmp_path_factory):
    """A real one-node Slurm on localhost, started (and installed if needed) by the repo's script;
    one module at a time uses it (the other test process waits), so that no test's jobs queue behind
    another's."""
    if os.geteuid() != 0 and shutil.which("sbatch") is None:
        pytest.skip(
            "starting a local Slurm needs root (CI runs as root); run "
            "tests/slurm/start_local_slurm.sh"
        )
    shared = (
        tmp_path_factory.getbasetemp().parent
        if os.environ.get("PYTEST_XDIST_WORKER")
        else tmp_path_factory.getbasetemp()
    )
    with FileLock(str(shared / "slurm.lock")):
        subprocess.run(
            ["bash", str(REPO / "tests" / "slurm" / "start_local_slurm.sh")],
            check=True,
            timeout=600,
        )
        yield "debug"
