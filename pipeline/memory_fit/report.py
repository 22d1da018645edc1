"""The plan as text: one row per pipeline stage (every rank of a stage holds the same), the step's arithmetic, the
verdict and the rules of thumb."""

from __future__ import annotations

from pipeline.model.config import ModelConfig
from pipeline.model.flops import parameter_count
from pipeline.memory_fit.devices import GIB
from pipeline.memory_fit.plan import Plan

_COLUMNS = ("stage", "blocks", "weights", "grads", "optimizer", "activations", "{other}", "head+loss", "buffers",
            "peak", "at", "of usable")


def _unit(largest: float) -> tuple[str, float]:
    return ("GiB", GIB) if largest >= GIB else ("MiB", 2**20)


def _checkpointing(interval: int) -> str:
    return "no activation checkpointing" if interval == 0 else f"activation checkpointing every {interval} block(s)"


def describe_model(model: ModelConfig) -> str:
    heads = f"{model.num_heads} heads" + (f" / {model.num_kv_heads} key-value" if model.num_kv_heads != model.num_heads
                                          else "")
    count = parameter_count(model)
    size = f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.1f}M"
    return (f"{size} parameters (hidden {model.hidden_size}, {model.num_layers} layers, {heads}, FFN {model.ffn_size} "
            f"{model.activation}, vocabulary {model.vocab_size}, {model.position})")


def describe_layout(plan: Plan) -> str:
    layout, device = plan.layout, plan.device
    where = device.label + ("" if device.accelerator else f" memory shared by {layout.ranks} rank(s)")
    return f"{layout.describe()} = {layout.ranks} rank(s) on {where}"


def render(plan: Plan) -> str:
    layout, device, nx = plan.layout, plan.device, plan.numerics
    unit, scale = _unit(max(stage.peak for stage in plan.stages))

    def size(value: float) -> str:
        return f"{value / scale:.2f}"

    capacity = plan.capacity
    memory = device.memory_per_rank(layout.ranks)
    lines = [f"Plan: {describe_layout(plan)}",
             f"Model: {describe_model(plan.model)}"]
    if memory is None:
        lines.append(f"Device: {device.label}, memory unknown: give plan.device (mi250x, h100, h200, cpu) or "
                     f"plan.memory_gib")
    else:
        lines.append(f"Device: {device.label}, {memory / GIB:.1f} GiB per rank; the plan may fill "
                     f"{plan.usable_fraction:.0%} = {capacity / GIB:.1f} GiB (plan.usable_fraction)")
    precision = "bf16" if nx.value_bytes == 2 else "fp32"
    attention = "FlashAttention (Triton)" if nx.flash else "reference attention (s x s softmax)"
    lines += [
        (f"Step: micro-batch {layout.micro_batch} x seq {layout.seq_len}; dp {layout.dp} x micro {layout.micro_batch} "
         f"x accumulation {layout.accumulation} = global batch {layout.global_batch} = {layout.tokens_per_step:,} "
         f"tokens"),
        (f"Pipeline bubble: (pp - 1) / (m + pp - 1) = {layout.pp - 1} / {layout.accumulation + layout.pp - 1} = "
         f"{layout.bubble:.1%}"),
        (f"Numerics: {precision} weights and gradients, fp32 master weights and Adam moments in ZeRO-1 partitions "
         f"over dp={layout.dp}, {attention}, {_checkpointing(layout.checkpoint_interval)}"),
        "",
    ]
    other = f"ckpt={plan.alternative_interval}" if plan.alternative_interval else "no ckpt"
    header = [column.format(other=f"act. {other}") for column in _COLUMNS]
    rows = []
    for stage, alternative in zip(plan.stages, plan.alternative):
        share = f"{stage.peak / capacity:.0%}" if capacity else "?"
        rows.append([str(stage.stage), str(stage.blocks), size(stage.weights), size(stage.gradients),
                     size(stage.optimizer), size(stage.activations), size(alternative.activations),
                     size(stage.loss) if stage.loss else "-", size(stage.buffers), size(stage.peak), stage.phase,
                     share])
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    lines.append(f"{unit} per rank")
    for row in [header, *rows]:
        lines.append("  ".join(cell.ljust(width) if i in (0, 10) else cell.rjust(width)
                               for i, (cell, width) in enumerate(zip(row, widths))).rstrip())
    largest = plan.largest
    lines.append("")
    if capacity is None:
        lines.append(f"Unknown whether it fits: the largest peak is {size(largest.peak)} {unit} (stage "
                     f"{largest.stage}, {largest.phase}).")
    elif plan.fits:
        lines.append(f"Fits: the largest peak, {size(largest.peak)} {unit} on stage {largest.stage} ({largest.phase}), "
                     f"is {largest.peak / capacity:.0%} of the {capacity / GIB:.1f} GiB usable.")
    else:
        lines.append(f"Does not fit: stage {largest.stage} peaks at {size(largest.peak)} {unit} ({largest.phase}), "
                     f"more than the {capacity / GIB:.1f} GiB usable.")
    lines.append("Rules of thumb:")
    lines += [f"  {'ok' if rule.kept else '!!'}  {rule.text}" for rule in plan.rules()]
    return "\n".join(lines)
