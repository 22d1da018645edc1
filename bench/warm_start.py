"""Experiment: the warm start against training from scratch and against keeping the old tokenizer (issue 11).

A Llama-style model (~32M parameters, sequences of 512, 16k vocabularies) is pretrained from scratch on English
(the base). Then, for Norwegian Bokmål, three arms train on the same number of tokens T:

  (a) the recipe: a new nob tokenizer, `stage=warmup` (embeddings only) for 10% of T, then `stage=pretrain
      init=warmup` for the other 90%;
  (b) scratch: the same nob tokenizer and packed data, `stage=pretrain init=scratch` for T;
  (c) old tokenizer: nob packed with the English base's tokenizer (`tokenizer.keep_base=true`),
      `stage=pretrain init=hf model.base=<the English base>` for T.

Each arm runs through the pipeline's own CLI (`python -m pipeline ...`) in its own work_dir, once per seed
(the data order, and (b)'s initial weights), scores the held-out text every T/20 tokens while training and ends
with `stage=evaluate` (held-out bits per byte, comparable across tokenizers). Three steps:

    python bench/warm_start.py prepare   # CPU, here: clean, mix, tokenizer, pack -> work/warm_start/, and the
                                         # part the GPU stages read -> .warm_start/ (carry it to the GPU machine)
    python bench/warm_start.py run       # GPU: base, (a), (b), (c), evaluate -> bench/results/warm_start/
    python bench/warm_start.py report    # the table (table.md) and the plot (warm_start.png) from those results

`run --setup smoke` trains a tiny model for a few steps (a CPU check of the whole chain) and `--setup check` the
experiment's model for a tenth of its steps (a first GPU call); give them a copy of the carried folder (`--root`)
and another `--results`, so that neither is overwritten.
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
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RAW_DIR = REPO.parent / "shared" / "data" / "extra"  # eng/ (public-domain novels) and nob/ (Lovdata, CC0 sentences)
CPU_ROOT = REPO / "work" / "warm_start"
DEVICE_ROOT = REPO / ".warm_start"
RESULTS = REPO / "bench" / "results" / "warm_start"
ARMS = ("a", "b", "c")
ARM_NAMES = {"a": "(a) new tokenizer, warmup + pretrain", "b": "(b) new tokenizer, from scratch",
             "c": "(c) English tokenizer, continued"}


@dataclasses.dataclass(frozen=True)
class Setup:
    """Model and budgets; steps are global batches of `batch` sequences of `seq_len` tokens."""

    model: tuple[str, ...]
    seq_len: int
    batch: int
    micro: int
    base_steps: int
    steps: int          # T / (batch x seq_len): every arm's training steps, (a)'s warmup included
    warmup_steps: int   # (a)'s share of `steps` spent in stage=warmup
    lr: float
    warmup_lr: float
    base_lr: float
    eval_tokens: int    # held-out tokens scored during training: all of nob's held-out split, in every arm
    seeds: tuple[int, ...]  # each arm runs once per seed (data order; (b)'s initial weights)

    def tokens(self, steps: int) -> int:
        return steps * self.batch * self.seq_len


MODEL = ("model.hidden_size=512", "model.num_layers=8", "model.num_heads=8", "model.num_kv_heads=4",
         "model.ffn_size=1408", "model.max_seq_len=512")
GPU = Setup(model=MODEL, seq_len=512, batch=16, micro=16, base_steps=800, steps=400, warmup_steps=40, lr=1e-3,
            warmup_lr=2e-3, base_lr=2e-3, eval_tokens=400_000, seeds=(1, 2))
SETUPS = {
    "gpu": GPU,
    # The same model for a tenth of the steps: a first call on a GPU machine checks the chain and its speed.
    "check": dataclasses.replace(GPU, base_steps=GPU.base_steps // 10, steps=GPU.steps // 10,
                                 warmup_steps=GPU.warmup_steps // 10, seeds=(1,)),
    # A tiny model for a few steps: the whole chain on a CPU.
    "smoke": Setup(model=("model.hidden_size=64", "model.num_layers=2", "model.num_heads=2", "model.num_kv_heads=2",
                          "model.ffn_size=128", "model.max_seq_len=64"),
                   seq_len=64, batch=4, micro=4, base_steps=4, steps=20, warmup_steps=2, lr=1e-3, warmup_lr=2e-3,
                   base_lr=2e-3, eval_tokens=2048, seeds=(1, 2)),
}
VOCAB = 16384
# nob: 5% held out (85 documents, 0.26 MB of text), so that the BPB is measured on more than a few documents.
NOB_HELDOUT = 0.05
# The mix plan's cap on epochs, above what any arm's budget needs: the budget, not the cap, sets the epochs.
MAX_EPOCHS = 64


def pipeline(*overrides: str, log: Path) -> float:
    """`python -m pipeline <overrides>` with its output in `log`; seconds taken. Fails with the log's end."""
    command = [sys.executable, "-m", "pipeline", *overrides]
    print("$ python -m pipeline " + " ".join(overrides), flush=True)
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    with log.open("w", encoding="utf-8") as handle:
        result = subprocess.run(command, cwd=REPO, stdout=handle, stderr=subprocess.STDOUT,
                                env={**os.environ, "HYDRA_FULL_ERROR": "1"})
    seconds = time.perf_counter() - started
    if result.returncode != 0:
        tail = "\n".join(log.read_text(encoding="utf-8", errors="replace").splitlines()[-40:])
        sys.exit(f"failed ({result.returncode}) after {seconds:.0f} s; the end of {log}:\n{tail}")
    print(f"  done in {seconds:.0f} s", flush=True)
    return seconds


# --- prepare (CPU) -------------------------------------------------------------------------------------------


def prepare(args) -> None:
    """The CPU stages, with the budgets of the `gpu` setup (the other setups train less on the same packs)."""
    setup, root, workers = GPU, CPU_ROOT, f"workers={args.workers}"
    base, a, c = root / "base", root / "a", root / "c"
    cpu = (f"raw_dir={args.raw_dir}", workers, f"tokenizer.vocab_size={VOCAB}", "mix.sources=[]",
           f"mix.max_epochs={MAX_EPOCHS}")
    logs = root / "logs"
    eng_tokens = setup.tokens(setup.base_steps)
    for stage in ("clean", "mix", "tokenizer", "pack"):
        pipeline(f"stage={stage}", "lang=eng", f"work_dir={base}", *cpu, f"mix.tokens={eng_tokens}",
                 log=logs / f"base-{stage}.log")
    nob = (*cpu, f"clean.heldout_fraction={NOB_HELDOUT}", f"mix.tokens={setup.tokens(setup.steps)}")
    english_tokenizer = f"tokenizer.base={base / 'eng' / 'tokenizer'}"
    for stage in ("clean", "mix", "tokenizer", "pack"):
        pipeline(f"stage={stage}", "lang=nob", f"work_dir={a}", *nob, english_tokenizer, log=logs / f"a-{stage}.log")
    # (c) reads the same cleaned text and plan; only its tokenizer and its pack differ. It keeps the English
    # tokenizer stage's output, which is what the base's hf/ folder will hold (pretrain init=hf checks that).
    for stage in ("clean", "mix"):
        shutil.rmtree(c / "nob" / stage, ignore_errors=True)
        shutil.copytree(a / "nob" / stage, c / "nob" / stage)
    for stage in ("tokenizer", "pack"):
        pipeline(f"stage={stage}", "lang=nob", f"work_dir={c}", *nob, english_tokenizer, "tokenizer.keep_base=true",
                 log=logs / f"c-{stage}.log")
    bundle(root, args.root)


def bundle(source: Path, target: Path) -> None:
    """Copy what the GPU stages read (markers, held-out split, tokenizer, pack) into the folder to carry; the
    training text and the rejected documents stay here."""
    shutil.rmtree(target, ignore_errors=True)
    wanted = {"clean": ("_SUCCESS.json", "heldout"), "mix": ("_SUCCESS.json", "plan.json"), "tokenizer": None,
              "pack": ("_SUCCESS.json", "packed.json", "shards")}
    for prepared, lang in (("base", "eng"), ("a", "nob"), ("c", "nob")):
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


# --- run (GPU) -----------------------------------------------------------------------------------------------


def training(setup: Setup, prefix: str, steps: int, lr: float, schedule: str, eval_every: int,
             seed: int) -> tuple[str, ...]:
    """The overrides of one training stage (`train` or `warmup.train`)."""
    return (f"{prefix}.steps={steps}", f"{prefix}.global_batch_size={setup.batch}",
            f"{prefix}.micro_batch_size={setup.micro}", f"{prefix}.lr={lr}", f"{prefix}.schedule={schedule}",
            f"{prefix}.warmup_steps={max(1, steps // 20)}", f"{prefix}.eval_every={eval_every}",
            f"{prefix}.eval_tokens={setup.eval_tokens}", f"{prefix}.log_every={max(1, steps // 50)}",
            f"{prefix}.checkpoint_every=0", f"{prefix}.seed={seed}")


def run_name(arm: str, seed: int) -> str:
    return f"{arm}-seed{seed}"


def arm_work_dir(root: Path, arm: str, seed: int) -> Path:
    """A work_dir of its own for each arm and seed, holding a copy of the CPU stages' outputs: (a) and (b) read
    (a)'s nob tokenizer and pack, (c) the pack made with the English tokenizer."""
    work_dir = root / run_name(arm, seed)
    shutil.rmtree(work_dir, ignore_errors=True)
    shutil.copytree(root / ("c" if arm == "c" else "a"), work_dir)
    return work_dir


def run(args) -> None:
    setup, root = SETUPS[args.setup], args.root
    if setup.steps % 20 or setup.warmup_steps % (setup.steps // 20):
        sys.exit("steps must be a multiple of 20 and warmup_steps of steps/20, so that every arm is scored at the "
                 "same token counts")
    logs, every = root / "logs", setup.steps // 20
    base_hf = root / "base" / "eng" / "pretrain" / "hf"
    shutil.rmtree(args.results, ignore_errors=True)
    seconds = {"base pretrain": pipeline(
        "stage=pretrain", "lang=eng", f"work_dir={root / 'base'}", "init=scratch", *setup.model,
        *training(setup, "train", setup.base_steps, setup.base_lr, "cosine", setup.base_steps // 10, seed=1),
        log=logs / "base-pretrain.log")}
    for seed in setup.seeds:
        a, b, c = (f"work_dir={arm_work_dir(root, arm, seed)}" for arm in ARMS)
        common = ("lang=nob", *setup.model)
        continued = training(setup, "train", setup.steps - setup.warmup_steps, setup.lr, "cosine", every, seed)
        full = training(setup, "train", setup.steps, setup.lr, "cosine", every, seed)
        warmup = training(setup, "warmup.train", setup.warmup_steps, setup.warmup_lr, "constant", every, seed)
        commands = {
            "a warmup": ("stage=warmup", a, *common, f"model.base={base_hf}", *warmup),
            "a pretrain": ("stage=pretrain", a, *common, "init=warmup", *continued),
            "a evaluate": ("stage=evaluate", a, *common),
            "b pretrain": ("stage=pretrain", b, *common, "init=scratch", *full),
            "b evaluate": ("stage=evaluate", b, *common),
            "c pretrain": ("stage=pretrain", c, *common, "init=hf", f"model.base={base_hf}", *full),
            "c evaluate": ("stage=evaluate", c, *common, f"model.base={base_hf}"),
        }
        for name, overrides in commands.items():
            arm, stage = name.split()
            seconds[f"{run_name(arm, seed)} {stage}"] = pipeline(
                *overrides, log=logs / f"{run_name(arm, seed)}-{stage}.log")
        collect(root, args.results, setup, seconds)  # after each seed, so that a cut-off run keeps what it did


def collect(root: Path, results: Path, setup: Setup, seconds: dict) -> None:
    """The small files the report reads (curves, reports, markers), and what ran where."""
    import torch

    runs = [("base", "eng")] + [(run_name(arm, seed), "nob") for seed in setup.seeds for arm in ARMS]
    for name, lang in runs:
        for stage in ("tokenizer", "pack", "warmup", "pretrain", "evaluate"):
            folder = root / name / lang / stage
            for file in ("_SUCCESS.json", "metrics.jsonl", "report.json", "report.md", "packed.json"):
                if (folder / file).is_file():
                    (results / name / stage).mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(folder / file, results / name / stage / file)
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    about = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), "device": device,
             "torch": torch.__version__, "python": sys.version.split()[0], "setup": dataclasses.asdict(setup),
             "seconds": {key: round(value, 1) for key, value in seconds.items()}}
    (results / "run.json").write_text(json.dumps(about, indent=2) + "\n", encoding="utf-8")
    print(f"results in {results}", flush=True)


# --- report --------------------------------------------------------------------------------------------------


def curve(folder: Path, stage: str, offset: int = 0) -> list[tuple[int, float]]:
    """(training tokens, held-out bits per byte) of one stage's scores, `offset` tokens after the arm's start."""
    marker = json.loads((folder / stage / "_SUCCESS.json").read_text(encoding="utf-8"))
    train = marker["config"]["warmup"]["train"] if stage == "warmup" else marker["config"]["train"]
    step_tokens = train["global_batch_size"] * (train["seq_len"] or marker["config"]["model"]["max_seq_len"])
    lines = (folder / stage / "metrics.jsonl").read_text(encoding="utf-8").splitlines()
    return [(offset + entry["step"] * step_tokens, entry["heldout_bpb"])
            for entry in map(json.loads, lines) if "heldout_bpb" in entry]


def arm_curves(folder: Path, arm: str) -> tuple[list[tuple[int, float]], list[tuple[int, float]]]:
    """An arm's whole curve, and the part of it spent in warmup ((a) only)."""
    if arm != "a":
        return curve(folder, "pretrain"), []
    warmup = curve(folder, "warmup")
    return warmup + curve(folder, "pretrain", warmup[-1][0])[1:], warmup


def read_json(path: Path) -> dict:
    return json.loads(path.read_text(encoding="utf-8"))


def cell(values: list[float]) -> str:
    """The mean over seeds, and each seed's value when there are several."""
    mean = sum(values) / len(values)
    return f"{mean:.4f}" + (f" ({', '.join(f'{v:.4f}' for v in values)})" if len(values) > 1 else "")


def report(args) -> None:
    results = args.results
    about = read_json(results / "run.json")
    seeds = about["setup"]["seeds"]
    found = {arm: [arm_curves(results / run_name(arm, seed), arm) for seed in seeds] for arm in ARMS}
    scores = {arm: [read_json(results / run_name(arm, seed) / "evaluate" / "report.json")["scores"] for seed in seeds]
              for arm in ARMS}
    bytes_per_token = {arm: read_json(results / run_name(arm, seeds[0]) / "tokenizer" / "report.json")
                       ["new"]["scores"]["bytes_per_token"] for arm in ARMS}
    total = found["b"][0][0][-1][0]
    marks = [total * k // 4 for k in (1, 2, 3, 4)]
    at = {arm: [[dict(points)[m] for points, _ in found[arm]] for m in marks] for arm in ARMS}
    base = scores["a"][0]["base"]["bits_per_byte"]
    english = curve(results / "base", "pretrain")[-1][1]
    warmup_tokens = found["a"][0][1][-1][0]
    lines = [f"Held-out bits per byte on nob (lower is better); every arm trains on T = {total:,} tokens; "
             + (f"mean over seeds {', '.join(map(str, seeds))} (each seed's value in brackets)." if len(seeds) > 1
                else f"seed {seeds[0]}."), "",
             "| arm | start | tokenizer (nob bytes/token) | warmup + pretrain tokens | "
             + " | ".join(f"BPB at {m / 1e6:.2f}M" for m in marks) + " | final BPB (evaluate) |",
             "|---|---|---|---:|" + "---:|" * len(marks) + "---:|"]
    starts = {"a": "English base, new embeddings (mean)", "b": "random", "c": "English base"}
    tokenizers = {"a": "nob 16k", "b": "nob 16k", "c": "English 16k, kept"}
    for arm in ARMS:
        warmup = warmup_tokens if arm == "a" else 0
        finals = [s["pretrain"]["bits_per_byte"] for s in scores[arm]]
        lines.append(f"| {ARM_NAMES[arm]} | {starts[arm]} | {tokenizers[arm]} ({bytes_per_token[arm]:.2f}) | "
                     f"{warmup:,} + {total - warmup:,} | " + " | ".join(cell(values) for values in at[arm])
                     + f" | {cell(finals)} |")
    gaps = [[b - a for a, b in zip(at["a"][i], at["b"][i])] for i in range(len(marks))]
    final_gap = [b["pretrain"]["bits_per_byte"] - a["pretrain"]["bits_per_byte"]
                 for a, b in zip(scores["a"], scores["b"])]
    lines += ["", "(b) - (a), same seed (positive: the warm start is ahead): "
              + ", ".join(f"{m / 1e6:.2f}M {cell(gap)}" for m, gap in zip(marks, gaps)) + f", final {cell(final_gap)}.",
              "", f"The English base (English tokenizer) scores {base:.4f} on this text, {english:.4f} on English "
              f"held-out text; (a) after its warmup alone ({warmup_tokens:,} tokens): "
              f"{cell([s['warmup']['bits_per_byte'] for s in scores['a']])} (evaluate).",
              "", f"Run: {about['date']} on {about['device']} (torch {about['torch']}); seconds per stage: "
              + ", ".join(f"{key} {value:.0f}" for key, value in about["seconds"].items()) + "."]
    table = "\n".join(lines) + "\n"
    (results / "table.md").write_text(table, encoding="utf-8")
    plot(found, base, results / "warm_start.png")
    print(table)
    print(f"table and plot in {results}")


def plot(found: dict, base: float, path: Path) -> None:
    """Each arm's mean over seeds, the seeds' range shaded, (a)'s warmup underlined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=110)
    shown = [base]
    for arm, colour in zip(ARMS, ("C0", "C1", "C2")):
        tokens = [t / 1e6 for t, _ in found[arm][0][0]]
        seeds = [[bpb for _, bpb in points] for points, _ in found[arm]]
        mean = [sum(values) / len(values) for values in zip(*seeds)]
        axes.plot(tokens, mean, color=colour, marker=".", label=ARM_NAMES[arm])
        axes.fill_between(tokens, [min(v) for v in zip(*seeds)], [max(v) for v in zip(*seeds)], color=colour,
                          alpha=0.2, linewidth=0)
        # (b)'s first score, of random weights, would squeeze the rest of the plot: it stays off the axes.
        shown += mean[1:] if arm == "b" else mean
    warmup = found["a"][0][1]
    axes.plot([t / 1e6 for t, _ in warmup], [bpb for _, bpb in warmup], color="C0", linewidth=5, alpha=0.3,
              label="(a)'s warmup (embeddings only)")
    axes.axhline(base, color="grey", linestyle=":", label="English base, English tokenizer")
    axes.set_ylim(min(shown) - 0.05, max(shown) + 0.05)
    axes.set_xlabel("training tokens (millions)")
    axes.set_ylabel("held-out bits per byte (nob)")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=8)
    axes.set_title("Norwegian Bokmål, same token budget: warm start vs scratch vs old tokenizer", fontsize=9)
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    step = commands.add_parser("prepare", help="CPU stages (here), then the folder to carry")
    step.add_argument("--raw-dir", type=Path, default=RAW_DIR, help="folder with eng/ and nob/ raw JSONL")
    step.add_argument("--workers", type=int, default=2)
    step.add_argument("--root", type=Path, default=DEVICE_ROOT, help="the folder to carry")
    step.set_defaults(action=prepare)
    step = commands.add_parser("run", help="the training stages and evaluate (GPU)")
    step.add_argument("--root", type=Path, default=DEVICE_ROOT)
    step.add_argument("--results", type=Path, default=RESULTS)
    step.add_argument("--setup", choices=SETUPS, default="gpu",
                      help="gpu: the experiment; check: a tenth of its steps; smoke: a tiny model (CPU)")
    step.set_defaults(action=run)
    step = commands.add_parser("report", help="table and plot from the results")
    step.add_argument("--results", type=Path, default=RESULTS)
    step.set_defaults(action=report)
    args = parser.parse_args()
    for key in ("root", "results", "raw_dir"):
        if getattr(args, key, None) is not None:
            setattr(args, key, getattr(args, key).absolute())
    args.action(args)


if __name__ == "__main__":
    main()
