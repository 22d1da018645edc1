"""One experiment's raw outputs -> one compact JSON file under bench/results/, the form the repository keeps.

A benchmark writes its raw outputs (per-step `metrics.jsonl`, logs, stage markers, tables) into a folder of its
own under bench/results/, which git ignores (.gitignore); what BENCHMARKS.md cites is this script's summary of
that folder, with the command, device and date of the run:

    python bench/compact_results.py bench/results/warm_start bench/results/warm_start_2026-11-23.json \\
        --command "python3 bench/warm_start.py run --jobs 8" --device "NVIDIA H200" --date 2026-11-23

What it keeps, by file (paths relative to the raw folder):
- `*.md`, `*.txt`: the text (tables, test summaries);
- `*.json` but a stage marker: the parsed JSON;
- a stage marker (`_SUCCESS.json`): its metrics, input hashes and finishing time (the resolved config is dropped;
  the command and the experiment's own setup say it), and the tokens a step trains on;
- `metrics.jsonl`: the held-out scores (`heldout_bpb` by step) and the last logged training row; the other
  per-step rows are dropped;
- `*.png`: copied next to the JSON file as `<name>.png` (`<name>-<folder>.png` if there are several);
- anything else (`*.log`, tensorboard events, checkpoints): dropped, and listed under `dropped`.
A file whose summary equals an earlier one's (the same tokenizer report in every arm) is kept as
`{"same_as": <the earlier file>}`.
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path


def marker_summary(marker: dict) -> dict:
    summary = {key: marker[key] for key in ("stage", "lang", "config_hash", "inputs", "metrics", "finished_at")
               if key in marker}
    config = marker.get("config") or {}
    train = (config.get("warmup") or {}).get("train") if marker.get("stage") == "warmup" else config.get("train")
    if train and train.get("global_batch_size"):
        seq_len = train.get("seq_len") or (config.get("model") or {}).get("max_seq_len")
        if seq_len:
            summary["step_tokens"] = train["global_batch_size"] * seq_len
    return summary


def metrics_summary(path: Path) -> dict:
    rows = [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    training = [row for row in rows if "loss" in row]
    return {"heldout_bpb": [[row["step"], row["heldout_bpb"]] for row in rows if "heldout_bpb" in row],
            "last_training_row": training[-1] if training else None,
            "rows": len(rows)}


def compact(raw: Path, out: Path, about: dict) -> dict:
    files, dropped, images = {}, [], []
    for path in sorted(p for p in raw.rglob("*") if p.is_file()):
        name = path.relative_to(raw).as_posix()
        if path.suffix in (".md", ".txt"):
            files[name] = path.read_text(encoding="utf-8")
        elif path.name == "_SUCCESS.json":
            files[name] = marker_summary(json.loads(path.read_text(encoding="utf-8")))
        elif path.suffix == ".json":
            files[name] = json.loads(path.read_text(encoding="utf-8"))
        elif path.name == "metrics.jsonl":
            files[name] = metrics_summary(path)
        elif path.suffix == ".png":
            images.append(path)
        else:
            dropped.append(name)
    first = {}
    for name, value in files.items():
        key = json.dumps(value, sort_keys=True)
        if key in first and len(key) > 64:
            files[name] = {"same_as": first[key]}
        else:
            first.setdefault(key, name)
    copied = {}
    for image in images:
        suffix = "" if len(images) == 1 else "-" + "-".join(image.relative_to(raw).with_suffix("").parts)
        target = out.with_name(out.stem + suffix + ".png")
        shutil.copyfile(image, target)
        copied[image.relative_to(raw).as_posix()] = target.name
    result = {**about, "raw_folder": raw.name, "files": files, "images": copied, "dropped": dropped}
    # one line per file: small diffs, readable without a viewer
    lines = [f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}" for key, value in result.items()
             if key != "files"]
    lines.append('  "files": {\n' + ",\n".join(f"    {json.dumps(name)}: {json.dumps(value, ensure_ascii=False)}"
                                               for name, value in files.items()) + "\n  }")
    out.write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", type=Path, help="the experiment's raw output folder")
    parser.add_argument("out", type=Path, help="the compact JSON file to write")
    parser.add_argument("--command", required=True, help="the command that produced the raw folder")
    parser.add_argument("--device", required=True, help="the machine it ran on")
    parser.add_argument("--date", required=True, help="when it ran (UTC)")
    parser.add_argument("--section", default="", help="the BENCHMARKS.md section that cites it")
    args = parser.parse_args()
    about = {"experiment": args.out.stem, "command": args.command, "device": args.device, "date": args.date}
    if args.section:
        about["cited_in"] = args.section
    result = compact(args.raw, args.out, about)
    print(f"{args.out}: {len(result['files'])} files kept, {len(result['images'])} images, "
          f"{len(result['dropped'])} dropped, {args.out.stat().st_size:,} bytes")


if __name__ == "__main__":
    main()
