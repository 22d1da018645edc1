"""Experiment: which warm start pays off soonest, on two languages (issues 11 and 21).

A Llama-style model (~40M parameters with untied 16k embeddings, sequences of 512) is pretrained
from scratch on all the English text at hand (public-domain novels and UD English; the base). Then,
for Norwegian Bokmål (nob) and Swahili (swa), every arm trains on the same number of tokens T, each
with seeds 1 and 2:

  scratch      the language's new tokenizer, `stage=pretrain init=scratch` for T;
  old          the English tokenizer kept (`tokenizer.keep_base=true`), `stage=pretrain init=hf` for T;
  warm-<init>  the new tokenizer, `stage=warmup warmup.init=<init>` (embeddings and head only) for W tokens,
               then `stage=pretrain init=warmup` for T - W; one arm per init: mean, random.

A study of the warmup's own settings (both languages, seed 1) varies one setting of the `warm-mean`
arm at a time: its learning rate, its length W, or freezing the LM head. Held-out bits per byte are
scored every T/40 tokens and right after initialisation (before any step). Three steps:

    python bench/warm_start.py prepare   # CPU, here: clean, mix, tokenizer, pack for the English base and both
                                         # languages -> work/warm_start/, and the part the GPU stages read ->
                                         # .warm_start/ (carry it to the GPU machine)
    python bench/warm_start.py run       # GPU: the base, then every arm, --jobs of them at once on the one GPU
                                         # -> bench/results/warm_start/
    python bench/warm_start.py report    # the tables (table.md) and the plot (warm_start.png) from the results

`run --setup smoke` trains a tiny model for a few steps, one seed (a CPU check of the whole chain);
give it a copy of the carried folder (`--root`) and another `--results`, so that neither is
overwritten.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Optional

REPO = Path(__file__).resolve().parent.parent
SHARED_DATA = REPO.parent / "shared" / "data"
CPU_ROOT = REPO / "work" / "warm_start"
DEVICE_ROOT = REPO / ".warm_start"
RESULTS = REPO / "bench" / "results" / "warm_start"
LANGS = ("nob", "swa")
INITS = ("mean", "random")
MAIN_ARMS = ("scratch", "old", *(f"warm-{init}" for init in INITS))
# The arm whose warmup settings the study varies.
STUDY_INIT = "mean"
VOCAB = 16384
# 5% of each language held out (nob: 85 documents, 0.26 MB), so that the score rests on more than a
# few documents.
HELDOUT = 0.05
# The mix plan's cap on epochs, above what any budget needs: the budget, not the cap, sets the
# epochs.
MAX_EPOCHS = 64


@dataclasses.dataclass(frozen=True)
class Setup:
    """Model and budgets; steps are global batches of `batch` sequences of `seq_len` tokens."""

    model: tuple[str, ...]
    seq_len: int
    batch: int
    micro: int
    base_batch: int
    base_steps: int
    steps: int  # T / (batch x seq_len): every arm's training steps, the warmup's included
    warmup_steps: int  # W: the warm arms' share of `steps` spent in stage=warmup
    lr: float
    warmup_lr: float
    base_lr: float
    evals: int  # held-out scores per T (and one before the first step)
    eval_tokens: int  # held-out tokens scored each time: all of a language's held-out split
    seeds: tuple[int, ...]
    study_langs: tuple[str, ...]  # the languages whose warmup settings are studied (seed 1)

    def tokens(self, steps: int) -> int:
        return steps * self.batch * self.seq_len

    @property
    def every(self) -> int:
        return self.steps // self.evals


MODEL = (
    "model.hidden_size=512",
    "model.num_layers=8",
    "model.num_heads=8",
    "model.num_kv_heads=4",
    "model.ffn_size=1408",
    "model.max_seq_len=512",
    "model.tie_embeddings=false",
)
GPU = Setup(
    model=MODEL,
    seq_len=512,
    batch=16,
    micro=16,
    base_batch=32,
    base_steps=800,
    steps=400,
    warmup_steps=40,
    lr=1e-3,
    warmup_lr=2e-3,
    base_lr=2e-3,
    evals=40,
    eval_tokens=400_000,
    seeds=(1, 2),
    study_langs=LANGS,
)
SETUPS = {
    "gpu": GPU,
    # A tiny model for a few steps, one seed, one language studied: the whole chain on a CPU.
    "smoke": Setup(
        model=(
            "model.hidden_size=64",
            "model.num_layers=2",
            "model.num_heads=2",
            "model.num_kv_heads=2",
            "model.ffn_size=128",
            "model.max_seq_len=64",
            "model.tie_embeddings=false",
        ),
        seq_len=64,
        batch=4,
        micro=4,
        base_batch=4,
        base_steps=4,
        steps=16,
        warmup_steps=4,
        lr=1e-3,
        warmup_lr=2e-3,
        base_lr=2e-3,
        evals=8,
        eval_tokens=2048,
        seeds=(1,),
        study_langs=("nob",),
    ),
}


@dataclasses.dataclass(frozen=True)
class Arm:
    """One training run of the experiment: a start, and for warm arms the warmup's settings."""

    name: str
    lang: str
    seed: int
    start: str = "warm"  # scratch, old or warm
    init: str = ""
    warmup_steps: int = 0
    warmup_lr: float = 0.0
    warmup_switches: tuple[str, ...] = ()

    @property
    def key(self) -> str:
        return f"{self.lang}-{self.name}-seed{self.seed}"


def main_arm(name: str, lang: str, seed: int, setup: Setup) -> Arm:
    if name in ("scratch", "old"):
        return Arm(name, lang, seed, start=name)
    return Arm(
        name,
        lang,
        seed,
        init=name.removeprefix("warm-"),
        warmup_steps=setup.warmup_steps,
        warmup_lr=setup.warmup_lr,
    )


def study_arms(lang: str, setup: Setup) -> list[Arm]:
    """One setting of the `warm-<STUDY_INIT>` arm (seed 1) changed at a time."""
    center = main_arm(f"warm-{STUDY_INIT}", lang, 1, setup)
    return [
        dataclasses.replace(center, name="study-lr-low", warmup_lr=setup.warmup_lr / 4),
        dataclasses.replace(center, name="study-lr-high", warmup_lr=setup.warmup_lr * 4),
        dataclasses.replace(center, name="study-short", warmup_steps=setup.warmup_steps // 2),
        dataclasses.replace(center, name="study-long", warmup_steps=setup.warmup_steps * 2),
        dataclasses.replace(
            center, name="study-frozen-head", warmup_switches=("warmup.train_head=false",)
        ),
    ]


def all_arms(setup: Setup, study: bool) -> list[Arm]:
    """The main arms seed after seed, then the study: a run cut short keeps the main comparison."""
    main = [
        main_arm(name, lang, seed, setup)
        for seed in setup.seeds
        for lang in LANGS
        for name in MAIN_ARMS
    ]
    return main + (
        [arm for lang in setup.study_langs for arm in study_arms(lang, setup)] if study else []
    )


def pipeline(*overrides: str, log: Path, threads: int = 0, env: Optional[dict] = None) -> float:
    """`python -m pipeline <overrides>` with its output in `log` (and `env` added to the
    environment); seconds taken. Raises with the log's end."""
    command = [sys.executable, "-m", "pipeline", *overrides]
    print("$ python -m pipeline " + " ".join(overrides), flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, "HYDRA_FULL_ERROR": "1", **(env or {})}
    if (
        threads
    ):  # processes sharing the machine: one CPU thread pool each would oversubscribe the cores
        env.update(OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
    started = time.perf_counter()
    with log.open("w", encoding="utf-8") as handle:
        result = subprocess.run(command, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT, env=env)
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-40:])
        raise RuntimeError(
            f"failed ({result.returncode}) after {seconds:.0f} s; the end of {log}:\n{tail}"
        )
    print(f"  done in {seconds:.0f} s ({log.name})", flush=True)
    return seconds


# --- prepare (CPU)
# -------------------------------------------------------------------------------------------


def raw_folders(shared: Path, target: Path) -> Path:
    """One raw_dir for the three languages: links to the shared files; English gets UD English
    beside the novels."""
    shutil.rmtree(target, ignore_errors=True)
    sources = {
        "eng": [
            shared / "extra" / "eng" / "gutenberg_pd_books.jsonl.gz",
            shared / "ud" / "eng" / "dev.jsonl.gz",
            shared / "ud" / "eng" / "test.jsonl.gz",
        ],
        **{lang: sorted((shared / "extra" / lang).glob("*.jsonl.gz")) for lang in LANGS},
    }
    for lang, files in sources.items():
        (target / lang).mkdir(parents=True)
        for file in files:
            (target / lang / f"{file.parent.name}_{file.name}").symlink_to(file)
    return target


def prepare(args) -> None:
    """The CPU stages, with the budgets of the `gpu` setup (the smoke setup trains less on the same
    packs)."""
    setup, root = GPU, CPU_ROOT
    raw = raw_folders(args.shared, root / "raw")
    cpu = (
        f"raw_dir={raw}",
        f"workers={args.workers}",
        f"tokenizer.vocab_size={VOCAB}",
        "mix.sources=[]",
        f"mix.max_epochs={MAX_EPOCHS}",
    )
    logs, base = root / "logs", root / "base"
    for stage in ("clean", "mix", "tokenizer", "pack"):
        pipeline(
            f"stage={stage}",
            "lang=eng",
            f"work_dir={base}",
            *cpu,
            f"mix.tokens={setup.base_steps * setup.base_batch * setup.seq_len}",
            log=logs / f"base-{stage}.log",
        )
    english_tokenizer = f"tokenizer.base={base / 'eng' / 'tokenizer'}"
    for lang in LANGS:
        new, old = root / lang / "new", root / lang / "old"
        options = (
            *cpu,
            f"clean.heldout_fraction={HELDOUT}",
            f"mix.tokens={setup.tokens(setup.steps)}",
            english_tokenizer,
        )
        for stage in ("clean", "mix", "tokenizer", "pack"):
            pipeline(
                f"stage={stage}",
                f"lang={lang}",
                f"work_dir={new}",
                *options,
                log=logs / f"{lang}-new-{stage}.log",
            )
        # The old-tokenizer arm reads the same cleaned text and plan; only its tokenizer and its
        # pack differ. It keeps the English tokenizer stage's output, which the base's hf/ folder
        # will hold (init=hf checks that).
        for stage in ("clean", "mix"):
            shutil.rmtree(old / lang / stage, ignore_errors=True)
            shutil.copytree(new / lang / stage, old / lang / stage)
        for stage in ("tokenizer", "pack"):
            pipeline(
                f"stage={stage}",
                f"lang={lang}",
                f"work_dir={old}",
                *options,
                "tokenizer.keep_base=true",
                log=logs / f"{lang}-old-{stage}.log",
            )
    bundle(root, args.root)


def bundle(source: Path, target: Path) -> None:
    """Copy what the GPU stages read (markers, held-out split, tokenizer, pack) into the folder to
    carry; the training text, rejected documents and the rest stay here."""
    shutil.rmtree(target, ignore_errors=True)
    pack = {
        "pack": ("_SUCCESS.json", "packed.json", "shards"),
        "mix": ("_SUCCESS.json", "plan.json"),
        "tokenizer": None,
    }
    folders = [("base", "eng", {"clean": ("_SUCCESS.json", "heldout"), **pack})]
    for lang in LANGS:
        folders += [
            (f"{lang}/new", lang, {"clean": ("_SUCCESS.json", "heldout"), **pack}),
            (f"{lang}/old", lang, {"clean": ("_SUCCESS.json", "heldout"), **pack}),
        ]
    for prepared, lang, wanted in folders:
        for stage, names in wanted.items():
            folder, destination = source / prepared / lang / stage, target / prepared / lang / stage
            if names is None:
                shutil.copytree(folder, destination)
                continue
            destination.mkdir(parents=True)
            for name in names:
                copy = shutil.copytree if (folder / name).is_dir() else shutil.copyfile
                copy(folder / name, destination / name)
    size = sum(p.stat().st_size for p in target.rglob("*") if p.is_file())
    print(f"{target}: {size / 2**20:.1f} MiB to carry", flush=True)


# --- run (GPU)
# -----------------------------------------------------------------------------------------------


def training(
    setup: Setup, prefix: str, steps: int, lr: float, schedule: str, seed: int, eval_every: int = 0
) -> tuple[str, ...]:
    """The overrides of one training stage (`train` or `warmup.train`)."""
    return (
        f"{prefix}.steps={steps}",
        f"{prefix}.global_batch_size={setup.batch}",
        f"{prefix}.micro_batch_size={setup.micro}",
        f"{prefix}.lr={lr}",
        f"{prefix}.schedule={schedule}",
        f"{prefix}.warmup_steps={max(1, steps // 20)}",
        f"{prefix}.eval_every={eval_every or setup.every}",
        f"{prefix}.eval_tokens={setup.eval_tokens}",
        f"{prefix}.log_every={max(1, steps // 50)}",
        f"{prefix}.checkpoint_every=0",
        f"{prefix}.seed={seed}",
    )


def arm_commands(
    arm: Arm, setup: Setup, work_dir: Path, base_hf: Path, evaluate: bool
) -> dict[str, tuple]:
    """The stages of one arm, in order, by name."""
    common = (f"work_dir={work_dir}", f"lang={arm.lang}", *setup.model)
    if arm.start == "scratch":
        stages = {
            "pretrain": (
                "stage=pretrain",
                *common,
                "init=scratch",
                *training(setup, "train", setup.steps, setup.lr, "cosine", arm.seed),
            )
        }
    elif arm.start == "old":
        stages = {
            "pretrain": (
                "stage=pretrain",
                *common,
                "init=hf",
                f"model.base={base_hf}",
                *training(setup, "train", setup.steps, setup.lr, "cosine", arm.seed),
            )
        }
    else:
        stages = {
            "warmup": (
                "stage=warmup",
                *common,
                f"model.base={base_hf}",
                f"warmup.init={arm.init}",
                *arm.warmup_switches,
                *training(
                    setup, "warmup.train", arm.warmup_steps, arm.warmup_lr, "constant", arm.seed
                ),
            ),
            "pretrain": (
                "stage=pretrain",
                *common,
                "init=warmup",
                *training(
                    setup, "train", setup.steps - arm.warmup_steps, setup.lr, "cosine", arm.seed
                ),
            ),
        }
    if evaluate:
        stages["evaluate"] = (
            "stage=evaluate",
            *common,
            *((f"model.base={base_hf}",) if arm.start == "old" else ()),
        )
    return stages


def run_arm(
    arm: Arm, setup: Setup, root: Path, results: Path, evaluate: bool, threads: int
) -> dict[str, float]:
    """One arm in a work_dir of its own (a copy of the prepared language folder); its small files to
    `results`."""
    work_dir = root / "runs" / arm.key
    shutil.rmtree(work_dir, ignore_errors=True)
    shutil.copytree(root / arm.lang / ("old" if arm.start == "old" else "new"), work_dir)
    seconds = {}
    base_hf = root / "base" / "eng" / "pretrain" / "hf"
    for stage, overrides in arm_commands(arm, setup, work_dir, base_hf, evaluate).items():
        seconds[stage] = round(
            pipeline(*overrides, log=root / "logs" / f"{arm.key}-{stage}.log", threads=threads), 1
        )
    for stage in ("tokenizer", "warmup", "pretrain", "evaluate"):
        for file in ("_SUCCESS.json", "metrics.jsonl", "report.json"):
            if (work_dir / arm.lang / stage / file).is_file():
                (results / arm.key / stage).mkdir(parents=True, exist_ok=True)
                shutil.copyfile(
                    work_dir / arm.lang / stage / file, results / arm.key / stage / file
                )
    (results / arm.key / "arm.json").write_text(
        json.dumps(dataclasses.asdict(arm), indent=2) + "\n", encoding="utf-8"
    )
    shutil.rmtree(work_dir)  # checkpoints and exports: nothing the report reads
    return seconds


def run(args) -> None:
    setup, root = SETUPS[args.setup], args.root
    shutil.rmtree(args.results, ignore_errors=True)
    args.results.mkdir(parents=True)
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    seconds = {
        "base pretrain": pipeline(
            "stage=pretrain",
            "lang=eng",
            f"work_dir={root / 'base'}",
            "init=scratch",
            *setup.model,
            *training(
                dataclasses.replace(setup, batch=setup.base_batch, micro=setup.base_batch),
                "train",
                setup.base_steps,
                setup.base_lr,
                "cosine",
                seed=1,
                eval_every=max(1, setup.base_steps // 10),
            ),
            log=root / "logs" / "base-pretrain.log",
        )
    }
    for file in ("_SUCCESS.json", "metrics.jsonl", "report.json"):
        (args.results / "base" / "pretrain").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(
            root / "base" / "eng" / "pretrain" / file, args.results / "base" / "pretrain" / file
        )
    arms, failed, lock = all_arms(setup, not args.no_study), [], threading.Lock()
    started = time.perf_counter()
    with ThreadPoolExecutor(args.jobs) as pool:
        running = {
            pool.submit(run_arm, arm, setup, root, args.results, args.evaluate, threads): arm
            for arm in arms
        }
        for done in as_completed(running):
            arm = running[done]
            with lock:
                try:
                    seconds.update(
                        {f"{arm.key} {stage}": value for stage, value in done.result().items()}
                    )
                except RuntimeError as error:
                    failed.append(arm.key)
                    print(f"{arm.key}: {error}", flush=True)
                write_about(
                    args.results, setup, seconds, args.jobs, time.perf_counter() - started, failed
                )
    if failed:
        sys.exit(f"{len(failed)} arm(s) failed: {', '.join(failed)} (logs in {root / 'logs'})")


def write_about(
    results: Path, setup: Setup, seconds: dict, jobs: int, arms_seconds: float, failed: list
) -> None:
    """What ran where, and how long (rewritten after every arm, so that a cut-off run keeps it)."""
    import torch

    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    about = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "setup": dataclasses.asdict(setup),
        "jobs": jobs,
        "arms_wall_seconds": round(arms_seconds, 1),
        "failed": failed,
        "seconds": seconds,
    }
    (results / "run.json").write_text(json.dumps(about, indent=2) + "\n", encoding="utf-8")


# --- report
# --------------------------------------------------------------------------------------------------


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def curve(folder: Path, stage: str, offset: int = 0) -> list[tuple[int, float]]:
    """(training tokens, held-out bits per byte) of one stage's scores, `offset` tokens after the
    arm's start."""
    marker = read_json(folder / stage / "_SUCCESS.json")
    train = marker["config"]["warmup"]["train"] if stage == "warmup" else marker["config"]["train"]
    step_tokens = train["global_batch_size"] * (
        train["seq_len"] or marker["config"]["model"]["max_seq_len"]
    )
    lines = (folder / stage / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [
        (offset + entry["step"] * step_tokens, entry["heldout_bpb"])
        for entry in map(json.loads, lines)
        if "heldout_bpb" in entry
    ]


@dataclasses.dataclass
class Result:
    """One finished arm's held-out curve and what the report reads off it."""

    arm: dict
    points: list[tuple[int, float]]
    warmup_end: Optional[tuple[int, float]]
    transfer: dict

    def at(self, tokens: int) -> float:
        return dict(self.points)[tokens]

    def parity(self, target: float, total: int) -> Optional[float]:
        """The fraction of T at which the arm first scores `target` or better; None if it never
        does."""
        return next((tokens / total for tokens, bpb in self.points if bpb <= target), None)


def load_result(folder: Path) -> Optional[Result]:
    if not (folder / "pretrain" / "metrics.jsonl").is_file():
        return None
    arm = read_json(folder / "arm.json")
    if arm["start"] != "warm":
        return Result(arm, curve(folder, "pretrain"), None, {})
    warmup = curve(folder, "warmup")
    return Result(
        arm,
        warmup + curve(folder, "pretrain", warmup[-1][0])[1:],
        warmup[-1],
        read_json(folder / "warmup" / "report.json")["rows"],
    )


def cell(values: list[Optional[float]], digits: int = 3, percent: bool = False) -> str:
    """The mean over seeds and each seed's value; `>T` where an arm never reached the target."""

    def one(value):
        return ">T" if value is None else (f"{value:.0%}" if percent else f"{value:.{digits}f}")

    known = [v for v in values if v is not None]
    mean = (
        one(sum(known) / len(known)) if len(known) == len(values) else (">T" if not known else "-")
    )
    return mean + (f" ({', '.join(one(v) for v in values)})" if len(values) > 1 else "")


def report(args) -> None:
    results = args.results
    about = read_json(results / "run.json")
    lists = {key: tuple(about["setup"][key]) for key in ("model", "seeds", "study_langs")}
    # Runs before the removal of warmup.init=focus and align also recorded their text budget
    # (transfer_bytes).
    fields = {field.name for field in dataclasses.fields(Setup)}
    setup = Setup(
        **{key: value for key, value in {**about["setup"], **lists}.items() if key in fields}
    )
    total = setup.tokens(setup.steps)
    marks = [total // 4, total // 2, total]
    found = {arm.key: load_result(results / arm.key) for arm in all_arms(setup, study=True)}
    lines = [
        f"Held-out bits per byte (lower is better); every arm trains on T = {total:,} tokens "
        "(warmup included); "
        f"seeds {', '.join(map(str, setup.seeds))} (mean, then each seed). Parity: the share of T "
        "after which "
        "an arm first scores at least as well as scratch's final score of the same seed (scored "
        "every "
        f"{1 / setup.evals:.1%} of T; >T: never).",
        "",
    ]
    curves = {}
    for lang in LANGS:
        scratch = {
            seed: found.get(main_arm("scratch", lang, seed, setup).key) for seed in setup.seeds
        }
        targets = {seed: result.points[-1][1] for seed, result in scratch.items() if result}
        lines += [
            f"### {lang}",
            "",
            "| arm | after init | after warmup | at T/4 | at T/2 | at T | parity |",
            "|---|---:|---:|---:|---:|---:|---:|",
        ]
        studied = (
            tuple(arm.name for arm in study_arms(lang, setup)) if lang in setup.study_langs else ()
        )
        for name in MAIN_ARMS + studied:
            seeds = setup.seeds if name in MAIN_ARMS else (1,)
            runs = [found.get(Arm(name, lang, seed).key) for seed in seeds]
            if not all(runs):
                lines.append(f"| {name} | missing | | | | | |")
                continue
            curves[(lang, name)] = runs
            parity = [
                run.parity(targets[seed], total) if seed in targets else None
                for run, seed in zip(runs, seeds)
            ]
            lines.append(
                f"| {name} | {cell([r.points[0][1] for r in runs])} | "
                f"{cell([r.warmup_end[1] for r in runs]) if runs[0].warmup_end else ''} | "
                + " | ".join(cell([r.at(m) for r in runs]) for m in marks)
                + f" | {cell(parity, percent=True)} |"
            )
        lines += [
            "",
            "Transfer cost of each init (seed 1):",
            "",
            "| init | seconds | peak added memory (MiB) |",
            "|---|---:|---:|",
        ]
        for init in INITS:
            run = found.get(main_arm(f"warm-{init}", lang, setup.seeds[0], setup).key)
            if run:
                cost = run.transfer["cost"]
                lines.append(f"| {init} | {cost['seconds']:.1f} | {cost['peak_added_mib']} |")
        lines.append("")
    base = curve(results / "base", "pretrain")
    lines += [
        f"English base: held-out bits per byte on English text {base[0][1]:.3f} at random "
        "initialisation, "
        f"{base[-1][1]:.3f} after {about['setup']['base_steps']} steps of "
        f"{about['setup']['base_batch']} "
        f"sequences.",
        "",
        f"Run: {about['date']} on {about['device']} (torch {about['torch']}), {about['jobs']} arms "
        "at a time, "
        f"{about['arms_wall_seconds']:.0f} s for the arms after the base's "
        f"{about['seconds']['base pretrain']:.0f} s"
        + (f"; failed: {', '.join(about['failed'])}" if about["failed"] else "")
        + ".",
    ]
    table = "\n".join(lines) + "\n"
    (results / "table.md").write_text(table, encoding="utf-8")
    plot(curves, setup, results / "warm_start.png")
    print(table)
    print(f"table and plot in {results}")


def plot(curves: dict, setup: Setup, path: Path) -> None:
    """Each main arm's mean over seeds against tokens, one panel per language; warmups drawn thick."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, panels = plt.subplots(1, len(LANGS), figsize=(12, 4.5), dpi=110)
    for axes, lang in zip(panels, LANGS):
        shown = []
        for index, name in enumerate(MAIN_ARMS):
            if (lang, name) not in curves:
                continue
            runs = curves[(lang, name)]
            tokens = [t / 1e6 for t, _ in runs[0].points]
            mean = [
                sum(values) / len(values)
                for values in zip(*[[bpb for _, bpb in r.points] for r in runs])
            ]
            colour = f"C{index}"
            axes.plot(tokens, mean, color=colour, marker=".", markersize=3, label=name)
            if runs[0].warmup_end:
                end = tokens.index(runs[0].warmup_end[0] / 1e6) + 1
                axes.plot(tokens[:end], mean[:end], color=colour, linewidth=5, alpha=0.3)
            shown += mean[
                1:
            ]  # the first score of random weights would squeeze the rest of the plot
        axes.set_ylim(min(shown) - 0.05, min(max(shown), min(shown) + 2.5) + 0.05)
        axes.set_xlabel("training tokens (millions); thick: embeddings-only warmup")
        axes.set_ylabel(f"held-out bits per byte ({lang})")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=7)
        axes.set_title(
            f"{lang}: same token budget, mean of seeds {', '.join(map(str, setup.seeds))}",
            fontsize=9,
        )
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    step = commands.add_parser("prepare", help="CPU stages (here), then the folder to carry")
    step.add_argument(
        "--shared", type=Path, default=SHARED_DATA, help="the shared data folder (extra/, ud/)"
    )
    step.add_argument("--workers", type=int, default=2)
    step.add_argument("--root", type=Path, default=DEVICE_ROOT, help="the folder to carry")
    step.set_defaults(action=prepare)
    step = commands.add_parser("run", help="the training stages (GPU)")
    step.add_argument("--root", type=Path, default=DEVICE_ROOT)
    step.add_argument("--results", type=Path, default=RESULTS)
    step.add_argument(
        "--setup",
        choices=SETUPS,
        default="gpu",
        help="gpu: the experiment; smoke: a tiny model (CPU)",
    )
    step.add_argument(
        "--jobs", type=int, default=8, help="arms trained at once (processes sharing the GPU)"
    )
    step.add_argument(
        "--no-study", action="store_true", help="leave out the study of the warmup's settings"
    )
    step.add_argument(
        "--evaluate", action="store_true", help="also run stage=evaluate after each arm"
    )
    step.set_defaults(action=run)
    step = commands.add_parser("report", help="tables and plot from the results")
    step.add_argument("--results", type=Path, default=RESULTS)
    step.set_defaults(action=report)
    args = parser.parse_args()
    for key in ("root", "results", "shared"):
        if getattr(args, key, None) is not None:
            setattr(args, key, getattr(args, key).absolute())
    args.action(args)


if __name__ == "__main__":
    main()
