"""One experiment's raw outputs -> one compact file under bench/results/, the form the repository
keeps.

A benchmark writes its raw outputs (per-step `metrics.jsonl`, logs, stage markers, tables) into a
folder of its own under bench/results/, which git ignores (.gitignore); what BENCHMARKS.md cites is
this script's summary of that folder, one file with the command, device and date of the run: JSON
(`<experiment>_<date>.json`) or, for tables and reports to be read as they are, Markdown
(`<experiment>_<date>.md`):

    python bench/compact_results.py bench/results/warm_start bench/results/warm_start_2026-11-23.json \\
        --command "python3 bench/warm_start.py run --jobs 8" --device "NVIDIA H200" --date 2026-11-23
    python bench/compact_results.py <raw> bench/results/parallel_gpu_2026-11-26.md --keep 'train_*.md' \\
        --command "python3 bench/train.py ..." --command "..." --device "2x NVIDIA H200" --date 2026-11-26

What it keeps, by file (paths relative to the raw folder; with `--keep`, only the files matching one
of its patterns, the others dropped):
- `*.md`, `*.txt`: the text (tables, test summaries), less any fenced ```json block
  (bench/train.py's per-run rows: every step's loss), whose figures the tables hold;
- `*.json` but a stage marker: the parsed JSON;
- a stage marker (`_SUCCESS.json`): its metrics, input hashes and finishing time (the resolved
  config is dropped; the command and the experiment's own setup say it), and the tokens a step
  trains on;
- `metrics.jsonl`: the held-out scores (`heldout_bpb` by step) and the last logged training row; the
  other per-step rows are dropped;
- `*.png`: copied next to the compact file as `<name>.png` (`<name>-<folder>.png` if there are
  several); in a Markdown file, an image that a kept report shows points at its copy, or says that
  it was not kept;
- anything else (`*.log`, tensorboard events, checkpoints, patches, scripts): dropped, and listed
  under `dropped`. A file whose summary equals an earlier one's (the same tokenizer report in every
  arm) is kept as `{"same_as": <the earlier file>}`.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import shutil
from pathlib import Path

JSON_BLOCK = re.compile(r"^```json\n.*?^```\n?", re.MULTILINE | re.DOTALL)
FENCE = re.compile(r"^```", re.MULTILINE)
IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)\s]+)\)")


def marker_summary(marker: dict) -> dict:
    summary = {
        key: marker[key]
        for key in ("stage", "lang", "config_hash", "inputs", "metrics", "finished_at")
        if key in marker
    }
    config = marker.get("config") or {}
    train = (
        (config.get("warmup") or {}).get("train")
        if marker.get("stage") == "warmup"
        else config.get("train")
    )
    if train and train.get("global_batch_size"):
        seq_len = train.get("seq_len") or (config.get("model") or {}).get("max_seq_len")
        if seq_len:
            summary["step_tokens"] = train["global_batch_size"] * seq_len
    return summary


def metrics_summary(path: Path) -> dict:
    rows = [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    training = [row for row in rows if "loss" in row]
    return {
        "heldout_bpb": [[row["step"], row["heldout_bpb"]] for row in rows if "heldout_bpb" in row],
        "last_training_row": training[-1] if training else None,
        "rows": len(rows),
    }


def text_summary(text: str) -> str:
    """The text less its fenced JSON blocks (per-run rows); a note says where one was."""
    return JSON_BLOCK.sub("(per-run JSON rows not kept)\n", text)


def kept(name: str, keep: list[str] | None) -> bool:
    return not keep or any(fnmatch.fnmatchcase(name, pattern) for pattern in keep)


def summarise(raw: Path, keep: list[str] | None = None) -> tuple[dict, list[str], list[Path]]:
    """The kept files' summaries by name, the dropped files' names, the kept images."""
    files, dropped, images = {}, [], []
    for path in sorted(p for p in raw.rglob("*") if p.is_file()):
        name = path.relative_to(raw).as_posix()
        if not kept(name, keep):
            dropped.append(name)
        elif path.suffix in (".md", ".txt"):
            files[name] = text_summary(path.read_text(encoding="utf-8"))
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
    return files, dropped, images


def _prose(part: str, folder: str, images: dict) -> str:
    """Markdown outside fenced blocks: headings two levels down; an image of the raw folder points
    at its copy, or says it was not kept (the compact file has no folder beside it)."""

    def image(match: re.Match) -> str:
        alt, target = match.group(1), match.group(2)
        if re.match(r"[a-z]+:", target):
            return match.group(0)
        copied = images.get((Path(folder) / target).as_posix())
        return f"![{alt}]({copied})" if copied else f"(plot `{target}`: not kept)"

    return IMAGE.sub(image, re.sub(r"^(#{1,4}) ", r"\1## ", part, flags=re.MULTILINE))


def markdown_section(name: str, value, images: dict | None = None) -> str:
    """One kept file as a section: Markdown with its headings two levels down, other text and JSON
    fenced."""
    if isinstance(value, dict) and set(value) == {"same_as"}:
        body = f"The same as `{value['same_as']}`."
    elif not isinstance(value, str):
        body = "```json\n" + json.dumps(value, indent=1, ensure_ascii=False) + "\n```"
    elif name.endswith(".md"):
        parts = FENCE.split(value)  # even parts are outside fenced blocks
        folder = Path(name).parent.as_posix()
        body = "```".join(
            _prose(part, folder, images or {}) if i % 2 == 0 else part
            for i, part in enumerate(parts)
        ).strip()
    else:
        body = "```text\n" + value.strip("\n") + "\n```"
    return f"## `{name}`\n\n{body}\n"


def write_markdown(out: Path, result: dict, files: dict) -> None:
    about = [f"# {result['experiment']}", ""]
    commands = result["command"] if isinstance(result["command"], list) else [result["command"]]
    about += [f"- command: `{command}`" for command in commands]
    about += [f"- device: {result['device']}", f"- date: {result['date']}"]
    if result.get("cited_in"):
        about.append(f"- cited in: {result['cited_in']}")
    dropped = result["dropped"]
    about.append(
        f"- written by `bench/compact_results.py` from the raw folder `{result['raw_folder']}` "
        "(not kept)"
        + (
            f"; its other files, not kept: {', '.join(dropped)}"
            if 0 < len(dropped) <= 12
            else f"; {len(dropped)} other files of it not kept"
            if dropped
            else ""
        )
    )
    if result["images"]:
        about.append(
            "- plots: "
            + ", ".join(f"{name} as `{target}`" for name, target in result["images"].items())
        )
    out.write_text(
        "\n".join(about)
        + "\n\n"
        + "\n".join(
            markdown_section(name, value, result["images"]) for name, value in files.items()
        ),
        encoding="utf-8",
    )


def write_json(out: Path, result: dict, files: dict) -> None:
    # one line per file: small diffs, readable without a viewer
    lines = [
        f"  {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}"
        for key, value in result.items()
        if key != "files"
    ]
    lines.append(
        '  "files": {\n'
        + ",\n".join(
            f"    {json.dumps(name)}: {json.dumps(value, ensure_ascii=False)}"
            for name, value in files.items()
        )
        + "\n  }"
    )
    out.write_text("{\n" + ",\n".join(lines) + "\n}\n", encoding="utf-8")


def compact(raw: Path, out: Path, about: dict, keep: list[str] | None = None) -> dict:
    files, dropped, images = summarise(raw, keep)
    copied = {}
    for image in images:
        suffix = (
            "" if len(images) == 1 else "-" + "-".join(image.relative_to(raw).with_suffix("").parts)
        )
        target = out.with_name(out.stem + suffix + ".png")
        shutil.copyfile(image, target)
        copied[image.relative_to(raw).as_posix()] = target.name
    result = {**about, "raw_folder": raw.name, "files": files, "images": copied, "dropped": dropped}
    (write_markdown if out.suffix == ".md" else write_json)(out, result, files)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("raw", type=Path, help="the experiment's raw output folder")
    parser.add_argument(
        "out", type=Path, help="the compact file to write: .json, or .md for tables and reports"
    )
    parser.add_argument(
        "--command",
        required=True,
        action="append",
        help="a command that produced the raw folder (repeat for several)",
    )
    parser.add_argument("--device", required=True, help="the machine it ran on")
    parser.add_argument("--date", required=True, help="when it ran (UTC)")
    parser.add_argument("--section", default="", help="the BENCHMARKS.md section that cites it")
    parser.add_argument(
        "--keep",
        action="append",
        help="keep only the files matching this pattern (repeat for several); the others are "
        "dropped",
    )
    args = parser.parse_args()
    about = {
        "experiment": args.out.stem,
        "command": args.command[0] if len(args.command) == 1 else args.command,
        "device": args.device,
        "date": args.date,
    }
    if args.section:
        about["cited_in"] = args.section
    result = compact(args.raw, args.out, about, args.keep)
    print(
        f"{args.out}: {len(result['files'])} files kept, {len(result['images'])} images, "
        f"{len(result['dropped'])} dropped, {args.out.stat().st_size:,} bytes"
    )


if __name__ == "__main__":
    main()
