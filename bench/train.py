"""Benchmark: training throughput and MFU of a ~1.3B BLOOM-style ALiBi model, our stack against Hugging Face.

Our stack is what the warmup and pretrain stages run: `pipeline.training.engine.build_engine` (DeepSpeed's
PipelineEngine, ZeRO-1, bf16 parameters with fp32 master weights, our Triton attention). The anchor is
`transformers`' BloomForCausalLM of the same shape (SDPA attention where the installed version offers it for
BLOOM, else its eager attention; fp32 weights under bf16 autocast, as the HF Trainer's `bf16=True` does,
torch.optim.AdamW with `fused=True`), on the same sequence length and global batch. Both read random token
ids (no packing, no segment ids). Each run warms up, then times a fixed number of optimizer steps between two
`torch.cuda.synchronize()`; MFU = model FLOPs per token (`pipeline.model.flops_per_token`, the same count for
both) x tokens/s / GPUs / the peak of `pipeline.training.throughput`.

Layouts of our stack are `tp x pp x dp`; each runs in its own `torchrun` (one process per GPU). The default is
1x1x1, plus DP on all GPUs when there are several, plus TP2 x PP2 x DP2 when there are 8. Weak scaling keeps the
per-GPU batch (micro-batch x accumulation) fixed: efficiency = tokens/s(N) / (N x tokens/s(1)). Loss agreement:
before timing, every layout trains `--agree-steps` steps on the same global batches (`--agree-batch` sequences,
the same rows whatever the layout) from the same initial weights; the table gives each layout's losses and the
largest relative difference from 1x1x1.

    python bench/train.py                                  # the 1.3B model, micro-batch 4, on every GPU there is
    python bench/train.py --micro-batches 4,8 --no-hf      # ours only, two micro-batch sizes
    python bench/train.py --layouts 1x1x1,1x1x2 --out train.md
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from pipeline.model.config import ModelConfig  # noqa: E402

LR = 1e-4


def model_config(args) -> ModelConfig:
    """BLOOM's shape family (ALiBi, LayerNorm, embedding LayerNorm, GELU, biases, tied head) at ~1.3B."""
    return ModelConfig(hidden_size=args.hidden, num_layers=args.layers, num_heads=args.heads,
                       num_kv_heads=args.heads, ffn_size=4 * args.hidden, vocab_size=args.vocab,
                       position="alibi", norm="layernorm", activation="gelu", embedding_norm=True, bias=True,
                       tie_embeddings=True, max_seq_len=args.seq_len)


def write_init(cfg: ModelConfig, folder: Path, seed: int) -> Path:
    """The initial weights every layout of our stack starts from (single-model names, tied head once)."""
    from safetensors.torch import save_file

    from pipeline.model.transformer import Transformer

    path = folder / "init.safetensors"
    torch.manual_seed(seed)
    model = Transformer(cfg)
    save_file({name: tensor.contiguous() for name, tensor in model.state_dict().items() if name != "head.weight"},
              str(path))
    return path


def random_rows(step: int, rows: int, seq_len: int, vocab: int) -> torch.Tensor:
    """The global batch of one step: `rows` sequences of seq_len + 1 token ids, the same in every layout."""
    generator = torch.Generator().manual_seed(1_000_003 * step + 17)
    return torch.randint(0, vocab, (rows, seq_len + 1), generator=generator)


def micro_batches(rows: torch.Tensor, micro: int, device):
    """(input ids, labels) per micro-batch, as DeepSpeed's pipeline engine reads them."""
    for start in range(0, len(rows), micro):
        window = rows[start:start + micro].to(device, non_blocking=True)
        yield window[:, :-1], window[:, 1:]


def timed(step, warmup: int, steps: int) -> tuple[float, list]:
    """Seconds for `steps` calls of step(i) after `warmup` untimed ones, and every call's loss."""
    losses = [step(i) for i in range(warmup)]
    torch.cuda.synchronize()
    start = time.perf_counter()
    losses += [step(warmup + i) for i in range(steps)]
    torch.cuda.synchronize()
    return time.perf_counter() - start, [float(loss) for loss in losses]


def run_ours(args) -> dict:
    """One rank of a layout (under torchrun): agreement steps, then the timed steps; rank 0 returns the result."""
    import torch.distributed as dist

    from pipeline.model.flops import flops_per_token
    from pipeline.training.config import ParallelConfig, TrainConfig
    from pipeline.training.engine import build_engine, init_distributed
    from pipeline.training.throughput import device_peak_tflops

    tp, pp, dp = (int(x) for x in args.layout.split("x"))
    init_distributed()
    cfg = model_config(args)
    train = TrainConfig(steps=10 ** 6, global_batch_size=args.agree_batch, micro_batch_size=args.micro,
                        seq_len=args.seq_len, lr=LR, schedule="constant", warmup_steps=0, precision="bf16",
                        seed=args.seed)
    built = build_engine(cfg, train, ParallelConfig(tp=tp, pp=pp, dp=dp), Path(args.init), lambda name: True)
    engine = built.engine

    def step(index: int, rows_per_step: int, offset: int) -> torch.Tensor:
        rows = random_rows(offset + index, rows_per_step, args.seq_len, cfg.vocab_size)
        share = rows_per_step // built.dp_world
        mine = rows[built.dp_rank * share:(built.dp_rank + 1) * share]
        return engine.train_batch(iter(micro_batches(mine, args.micro, engine.device)))

    agree = [float(step(i, args.agree_batch, 0)) for i in range(args.agree_steps)]
    global_batch = args.micro * args.accumulation * dp
    engine.set_train_batch_size(global_batch)
    torch.cuda.reset_peak_memory_stats()
    seconds, losses = timed(lambda i: step(i, global_batch, 10_000), args.warmup, args.steps)
    result = throughput("ours", f"{tp}x{pp}x{dp}", dist.get_world_size(), args, global_batch, seconds,
                        flops_per_token(cfg, args.seq_len), device_peak_tflops())
    result.update(agree_losses=agree, losses=losses, micro=args.micro, accumulation=args.accumulation,
                  memory_gib=torch.cuda.max_memory_allocated() / 2 ** 30)
    dist.barrier()
    dist.destroy_process_group()
    return result


def run_hf(args) -> dict:
    """BloomForCausalLM of the same shape on one GPU; on running out of memory, half the micro-batch, twice
    the accumulation (the same global batch)."""
    import torch.nn.functional as F
    from transformers import BloomConfig, BloomForCausalLM

    from pipeline.model.flops import flops_per_token
    from pipeline.training.throughput import device_peak_tflops

    cfg = model_config(args)
    config = BloomConfig(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size, n_layer=cfg.num_layers,
                         n_head=cfg.num_heads, layer_norm_epsilon=cfg.norm_eps, hidden_dropout=0.0,
                         attention_dropout=0.0, tie_word_embeddings=True, use_cache=False)
    torch.manual_seed(args.seed)
    try:
        model = BloomForCausalLM._from_config(config, attn_implementation="sdpa")
        attention = "sdpa"
    except ValueError:  # transformers has no SDPA path for BLOOM (its ALiBi is an additive bias of its own)
        model = BloomForCausalLM._from_config(config, attn_implementation="eager")
        attention = "eager"
    model = model.cuda().train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR, betas=(0.9, 0.95), weight_decay=0.1, fused=True)
    global_batch = args.micro * args.accumulation
    micro = args.micro
    while True:
        def step(index: int) -> torch.Tensor:
            rows = random_rows(10_000 + index, global_batch, args.seq_len, cfg.vocab_size).cuda()
            total = torch.zeros((), device="cuda")
            for start in range(0, global_batch, micro):
                ids = rows[start:start + micro]
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    logits = model(input_ids=ids[:, :-1]).logits
                # The same loss as ours: float32 cross-entropy of the next token at each of seq_len positions.
                loss = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
                (loss * micro / global_batch).backward()
                total += loss.detach() * micro / global_batch
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            return total

        try:
            torch.cuda.reset_peak_memory_stats()
            seconds, losses = timed(step, args.warmup, args.steps)
            break
        except torch.OutOfMemoryError:
            optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            if micro == 1:
                raise
            micro //= 2
            print(f"hf: out of memory at micro-batch {micro * 2}; trying {micro}", flush=True)
    result = throughput(f"transformers BloomForCausalLM ({attention})", "1 GPU", 1, args, global_batch, seconds,
                        flops_per_token(cfg, args.seq_len), device_peak_tflops())
    result.update(losses=losses, micro=micro, accumulation=global_batch // micro,
                  memory_gib=torch.cuda.max_memory_allocated() / 2 ** 30)
    return result


def throughput(name: str, layout: str, gpus: int, args, global_batch: int, seconds: float, flops: int,
               peak) -> dict:
    tokens_per_s = args.steps * global_batch * args.seq_len / seconds
    tflops = flops * tokens_per_s / gpus / 1e12
    return {"name": name, "layout": layout, "gpus": gpus, "global_batch": global_batch,
            "step_s": seconds / args.steps, "tokens_per_s": tokens_per_s, "tflops_per_gpu": tflops,
            "mfu": None if peak is None else tflops / peak, "device": torch.cuda.get_device_name(),
            "torch": torch.__version__}


def launch(args, role: str, result: Path, extra: list[str], gpus: int = 1) -> tuple[dict | None, str]:
    """Run one measurement in fresh processes (torchrun for our layouts); its result, or the error's tail."""
    forwarded = [f"--{key.replace('_', '-')}={value}" for key, value in vars(args).items()
                 if key in SHAPE_ARGS]
    script = [str(Path(__file__).resolve()), f"--role={role}", f"--result={result}", *forwarded, *extra]
    if role == "ours":
        command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={gpus}",
                   *script]
    else:
        command = [sys.executable, *script]
    print("$", " ".join(command), flush=True)
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    log = done.stdout
    if args.log_dir:
        name = result.stem
        Path(args.log_dir, f"{name}.log").write_text(log, encoding="utf-8")
    if done.returncode != 0 or not result.exists():
        return None, log[-3000:]
    return json.loads(result.read_text(encoding="utf-8")), ""


SHAPE_ARGS = ("hidden", "layers", "heads", "vocab", "seq_len", "accumulation", "agree_batch", "agree_steps",
              "warmup", "steps", "seed")


def default_layouts(gpus: int) -> list[str]:
    layouts = ["1x1x1"]
    if gpus > 1:
        layouts.append(f"1x1x{gpus}")
    if gpus >= 8:
        layouts.append("2x2x2")
    return layouts


def table(results: list[dict], failures: list[str]) -> str:
    lines = ["| run | layout (tp x pp x dp) | GPUs | micro x accum | global batch | tokens/s | tokens/s per GPU | "
             "TFLOP/s per GPU | MFU | peak memory (GiB) |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        mfu = "" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
        lines.append(f"| {r['name']} | {r['layout']} | {r['gpus']} | {r['micro']} x {r['accumulation']} | "
                     f"{r['global_batch']} | {r['tokens_per_s']:,.0f} | {r['tokens_per_s'] / r['gpus']:,.0f} | "
                     f"{r['tflops_per_gpu']:.1f} | {mfu} | {r['memory_gib']:.1f} |")
    ours_single = [r for r in results if r["name"] == "ours" and r["layout"] == "1x1x1"]
    hf = [r for r in results if r["name"].startswith("transformers")]
    for r in ours_single if hf else []:
        lines.append(f"| ratio ours (1x1x1, micro {r['micro']}, global batch {r['global_batch']}) / transformers "
                     f"(global batch {hf[0]['global_batch']}) | | | | | {r['tokens_per_s'] / hf[0]['tokens_per_s']:.2f} "
                     f"| | | | |")
    for r in results:
        if r["name"] == "ours" and r["layout"].startswith("1x1x") and r["gpus"] > 1:
            base = [s for s in ours_single if s["micro"] == r["micro"]]
            if base:
                efficiency = r["tokens_per_s"] / (r["gpus"] * base[0]["tokens_per_s"])
                lines.append(f"| weak-scaling efficiency {r['layout']} (micro {r['micro']}) | | | | | "
                             f"{efficiency:.3f} | | | | |")
    agreeing = [r for r in results if r.get("agree_losses")]
    if agreeing:
        reference = agreeing[0]["agree_losses"]
        lines += ["", f"Loss agreement ({len(reference)} steps on the same global batches, from the same weights):",
                  "", "| layout | micro | losses | max relative difference from the first |", "|---|---:|---|---:|"]
        for r in agreeing:
            diff = max(abs(a - b) / abs(b) for a, b in zip(r["agree_losses"], reference))
            losses = ", ".join(f"{loss:.5f}" for loss in r["agree_losses"])
            lines.append(f"| {r['layout']} | {r['micro']} | {losses} | {diff:.2e} |")
    for failure in failures:
        lines += ["", failure]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=24)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=50304)
    parser.add_argument("--seq-len", type=int, default=2048)
    parser.add_argument("--micro-batches", default="4", help="our stack's micro-batch sizes to time, e.g. 4,8")
    parser.add_argument("--accumulation", type=int, default=8,
                        help="micro-batches per optimizer step and GPU (global batch = micro x this x dp)")
    parser.add_argument("--layouts", default=None, help="tp x pp x dp of our runs, e.g. 1x1x1,1x1x4 "
                        "(default: 1x1x1, DP over all GPUs, and 2x2x2 on 8 GPUs)")
    parser.add_argument("--agree-steps", type=int, default=3)
    parser.add_argument("--agree-batch", type=int, default=16, help="sequences per agreement step (a multiple "
                        "of micro x dp of every layout)")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-hf", action="store_true", help="leave out the transformers anchor")
    parser.add_argument("--hf-micro-batch", type=int, default=None, help="default: the first of --micro-batches")
    parser.add_argument("--log-dir", default=None, help="write each run's full output here")
    parser.add_argument("--out", default=None, help="also write the table and results (JSON) here")
    # Internal: one measurement, in the process that runs it.
    parser.add_argument("--role", choices=("ours", "hf"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--layout", default="1x1x1", help=argparse.SUPPRESS)
    parser.add_argument("--micro", type=int, default=4, help=argparse.SUPPRESS)
    parser.add_argument("--init", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()

    if args.role is not None:
        result = run_ours(args) if args.role == "ours" else run_hf(args)
        if args.role == "hf" or int(os.environ.get("RANK", "0")) == 0:
            Path(args.result).write_text(json.dumps(result), encoding="utf-8")
        return

    gpus = torch.cuda.device_count()
    if gpus == 0:
        sys.exit("bench/train.py needs a CUDA GPU (it measures bf16 training throughput); none is visible.")
    layouts = args.layouts.split(",") if args.layouts else default_layouts(gpus)
    micros = [int(m) for m in args.micro_batches.split(",")]
    if args.log_dir:
        Path(args.log_dir).mkdir(parents=True, exist_ok=True)
    results, failures = [], []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        started = time.perf_counter()
        init = write_init(model_config(args), folder, args.seed)
        print(f"initial weights written in {time.perf_counter() - started:.0f} s", flush=True)
        runs = [("ours", layout, micro) for layout in layouts for micro in micros]
        if not args.no_hf:
            runs.append(("hf", "1x1x1", args.hf_micro_batch or micros[0]))
        for role, layout, micro in runs:
            world = 1
            for size in layout.split("x"):
                world *= int(size)
            if world > gpus:
                failures.append(f"{role} {layout}: needs {world} GPUs, this machine has {gpus}; not run.")
                continue
            result_file = folder / f"{role}-{layout}-micro{micro}.json"
            extra = [f"--layout={layout}", f"--micro={micro}", f"--init={init}"]
            started = time.perf_counter()
            result, error = launch(args, role, result_file, extra, gpus=world)
            print(f"{role} {layout} micro {micro}: {time.perf_counter() - started:.0f} s", flush=True)
            if result is None:
                failures.append(f"{role} {layout} micro {micro} FAILED:\n```\n{error}\n```")
                print(failures[-1], flush=True)
            else:
                results.append(result)
                print(json.dumps(result), flush=True)
    report = table(results, failures)
    devices = sorted({r["device"] for r in results})
    header = (f"device: {', '.join(devices) or '?'} x{gpus}; model: hidden {args.hidden}, {args.layers} layers, "
              f"{args.heads} heads, vocab {args.vocab}, seq {args.seq_len}; {args.steps} timed steps after "
              f"{args.warmup} warm-up steps")
    print("\n" + header + "\n\n" + report)
    if args.out:
        Path(args.out).write_text(header + "\n\n" + report + "\n\n```json\n" + json.dumps(results, indent=1)
                                  + "\n```\n", encoding="utf-8")


if __name__ == "__main__":
    main()
