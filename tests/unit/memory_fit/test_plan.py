"""stage=plan and pretrain's layout check (pipeline/memory_fit/): the step's arithmetic, the memory
terms against what autograd really saves, the devices, LUMI's rules of thumb, the refusal with the
smallest layout that fits, and pretrain refusing a layout before any rank starts."""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from pipeline import memory_fit as planning
from pipeline.config import CONF_DIR, PipelineConfig, validate
from pipeline.errors import ConfigError
from pipeline.memory_fit import LayoutError, devices, memory, plan_for_config, print_plan
from pipeline.memory_fit.check import render
from pipeline.memory_fit.layout import Layout, blocks_per_stage
from pipeline.memory_fit.memory import Numerics, block_activations, stage_parameters
from pipeline.memory_fit.plan import (
    expected_efficiency,
    smallest_fitting,
    tensor_parallel_choices,
    tensor_parallel_efficiency,
    with_layout,
)
from pipeline.model.model_config import ModelConfig, parameter_count
from tests.conftest import REPO, run_cli

GIB = 2**30
MISTRAL_ON_LUMI = (
    "model=mistral-7b",
    "cluster=lumi",
    "train.seq_len=4096",
    "parallel.tp=2",
    "parallel.pp=4",
    "parallel.dp=4",
    "train.micro_batch_size=1",
    "train.global_batch_size=64",
)
SMALL_ROPE = ModelConfig(
    hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, ffn_size=128, vocab_size=256
)
SMALL_ALIBI = ModelConfig(
    hidden_size=64,
    num_layers=2,
    num_heads=4,
    num_kv_heads=4,
    ffn_size=256,
    vocab_size=300,
    position="alibi",
    norm="layernorm",
    activation="gelu",
    embedding_norm=True,
    bias=True,
)


def pipeline_config(preset: str, *overrides: str) -> PipelineConfig:
    """The typed config of `stage=plan model=<preset> <overrides>`, as Hydra composes it (without a
    language), with a micro-batch of 4 where the overrides set none (the planner's tables need one;
    fitting_micro_batch has its own tests)."""
    model = OmegaConf.load(CONF_DIR / "model" / f"{preset}.yaml")
    merged = OmegaConf.merge(
        OmegaConf.structured(PipelineConfig),
        {"stage": "plan", "model": model},
        OmegaConf.from_dotlist(["train.micro_batch_size=4", *overrides]),
    )
    return OmegaConf.to_object(merged)


def lumi(preset: str, *overrides: str) -> PipelineConfig:
    return pipeline_config(preset, "cluster.name=lumi", "cluster.gpus_per_node=8", *overrides)


def test_mistral_7b_on_lumi_prints_a_table_per_gcd(tmp_path):
    out = run_cli("stage=plan", *MISTRAL_ON_LUMI, cwd=tmp_path).stdout
    rows = {
        int(line.split()[0]): line.split()
        for line in out.splitlines()
        if re.match(r"^\d+\s+\d+\s", line)
    }
    assert sorted(rows) == [0, 1, 2, 3] and [int(row[1]) for row in rows.values()] == [8, 8, 8, 8]
    # Stage 0's weights in bf16 at tp=2: half of the embedding and of 8 blocks (Mistral-7B's shape,
    # counted here).
    block = 4096 * 128 * (2 * 32 + 2 * 8) + 3 * 4096 * 14336 + 2 * 4096
    assert float(rows[0][2]) == pytest.approx(2 * (32000 * 4096 + 8 * block) / 2 / GIB, abs=0.005)
    # The head and the loss: on the last stage only.
    assert rows[3][7] != "-" and all(row[7] == "-" for stage, row in rows.items() if stage < 3)
    assert "MI250X GCD, 64.0 GiB per rank" in out
    assert "dp 4 x micro 1 x accumulation 16 = global batch 64 = 262,144 tokens" in out
    assert "(pp - 1) / (m + pp - 1) = 3 / 19 = 15.8%" in out
    assert "Fits:" in out and "!!" not in out


def test_a_34b_shape_at_1x1x1_is_refused_with_the_smallest_layout_that_fits(tmp_path):
    budget = ("train.micro_batch_size=4", "train.global_batch_size=32")
    result = run_cli(
        "stage=plan", "model=poro-34b", "cluster=lumi", *budget, cwd=tmp_path, check=False
    )
    assert result.returncode == 1
    assert "Does not fit" in result.stdout and "does not fit" in result.stderr
    tp, pp = map(int, re.search(r"parallel\.tp=(\d+) parallel\.pp=(\d+)", result.stderr).groups())

    plan = plan_for_config(lumi("poro-34b", *budget))
    assert not plan.fits
    suggested = with_layout(plan, tp=tp, pp=pp)
    assert suggested.fits and suggested.keeps_rules()
    for other_tp in tensor_parallel_choices(plan.model, plan.device):
        for other_pp in range(1, plan.model.num_layers + 1):
            other = with_layout(plan, tp=other_tp, pp=other_pp)
            if other_tp * other_pp < tp * pp and other.keeps_rules():
                assert not other.fits, f"tp={other_tp} pp={other_pp} fits and is smaller"


@pytest.mark.parametrize("global_batch, proposed", [(64, (1, 2)), (1, (2, 1))])
def test_of_as_many_ranks_the_proposal_is_the_layout_expected_to_train_fastest(
    global_batch, proposed
):
    # Phi-3-mini does not fit one H100 alone, but fits at tp=2 and at pp=2 alike. A pipeline
    # of 2 keeps 0.96 x (1 - bubble) of two GPUs, tensor parallelism of 2 kept 0.80 at its width
    # (hidden 3072): with 64 micro-batches a step the pipeline is faster, with one (half the step
    # idle) it is not.
    cfg = pipeline_config(
        "phi-3-mini",
        "plan.device=h100",
        "train.micro_batch_size=1",
        f"train.global_batch_size={global_batch}",
    )
    plan = plan_for_config(cfg)
    assert not plan.fits
    found = smallest_fitting(plan)
    assert (found.layout.tp, found.layout.pp) == proposed
    for tp, pp in ((2, 1), (1, 2)):
        other = with_layout(plan, tp=tp, pp=pp)
        assert other.fits
        hidden = plan.model.hidden_size
        assert expected_efficiency(other.layout, hidden) <= expected_efficiency(
            found.layout, hidden
        )
    assert "Speed per GPU: about" in render(found)


def test_tensor_parallel_efficiency_is_the_measured_one_at_the_models_width():
    # measured on H200s: 0.89 of two GPUs and 0.78 of four at hidden 4096, 0.80 of two at 2048
    assert tensor_parallel_efficiency(1, 4096) == 1.0
    assert tensor_parallel_efficiency(2, 4096) == 0.89
    assert tensor_parallel_efficiency(4, 8192) == 0.78
    assert tensor_parallel_efficiency(2, 3072) == 0.80
    # beyond what was measured, each doubling costs as much as the last one measured there
    assert tensor_parallel_efficiency(8, 4096) == pytest.approx(0.78 * 0.78 / 0.89)
    assert tensor_parallel_efficiency(4, 2048) == pytest.approx(0.80 * 0.80)
    assert tensor_parallel_efficiency(2, 1024) == 0.80  # narrower than any measured: the narrowest
    # tp=3 between tp=2 and tp=4, geometrically
    assert tensor_parallel_efficiency(3, 4096) == pytest.approx(
        0.89 * (0.78 / 0.89) ** (math.log2(3) - 1)
    )


def test_bubble_tokens_and_accumulation_arithmetic():
    plan = plan_for_config(lumi("mistral-7b", *MISTRAL_ON_LUMI[2:]))
    layout = plan.layout
    assert (layout.tp, layout.pp, layout.dp, layout.micro_batch, layout.accumulation) == (
        2,
        4,
        4,
        1,
        16,
    )
    assert layout.global_batch == 64 and layout.tokens_per_step == 64 * 4096 and layout.ranks == 32
    assert layout.bubble == pytest.approx(3 / 19)
    assert [layout.in_flight(stage) for stage in range(4)] == [4, 3, 2, 1]
    few = Layout(tp=1, pp=8, dp=2, micro_batch=2, accumulation=3, seq_len=2048)
    assert few.bubble == pytest.approx(7 / 10) and [few.in_flight(s) for s in (0, 5, 7)] == [
        3,
        3,
        1,
    ]
    # The first stage holds more micro-batches in flight than the last: its activations are the
    # largest.
    activations = [stage.activations for stage in plan.stages]
    assert activations == sorted(activations, reverse=True)


@pytest.mark.parametrize(
    "pp, micro_batches, advice",
    [
        (4, 16, "m >= 27 micro-batches per step keep it within 10%"),
        (2, 8, "m >= 9 micro-batches per step"),
        (2, 9, None),
        (1, 1, None),
    ],
)
def test_a_bubble_over_a_tenth_of_the_step_names_the_micro_batches_that_keep_it_within(
    pp, micro_batches, advice
):
    plan = plan_for_config(
        lumi(
            "mistral-7b",
            "train.seq_len=4096",
            "parallel.tp=2",
            f"parallel.pp={pp}",
            "train.micro_batch_size=1",
            f"train.global_batch_size={micro_batches}",
        )
    )
    line = next(line for line in render(plan).splitlines() if line.startswith("Pipeline bubble"))
    assert (advice in line) if advice else ("micro-batches" not in line), line


@pytest.mark.parametrize(
    "layers, pp", [(30, 8), (54, 8), (80, 8), (32, 3), (4, 2), (24, 5), (3, 2), (5, 4)]
)
def test_blocks_per_stage_are_deepspeeds_partition(layers, pp):
    from deepspeed.runtime.utils import partition_balanced

    weights = (
        [0] + [1] * layers + [0, 0]
    )  # embedding, blocks, final norm, head: the `type:BlockLayer` weights
    parts = partition_balanced(weights, pp)
    assert blocks_per_stage(layers, pp) == [
        sum(weights[parts[i] : parts[i + 1]]) for i in range(pp)
    ]


def test_lumi_rules_of_thumb(caplog):
    wide = plan_for_config(
        lumi(
            "mistral-7b",
            "train.seq_len=4096",
            "parallel.tp=4",
            "parallel.pp=2",
            "train.micro_batch_size=1",
            "train.global_batch_size=16",
        )
    )
    broken = [rule.text for rule in wide.rules() if not rule.kept]
    assert broken == [
        (
            "hidden / tp = 4096 / 4 = 1024 < 1280 on MI250X GCD: its matrix products are too small "
            "to "
            "keep the device busy; lower tp"
        )
    ]
    with caplog.at_level(logging.WARNING):
        planning.check_layout(
            lumi(
                "mistral-7b",
                "train.seq_len=4096",
                "parallel.tp=4",
                "parallel.pp=2",
                "train.micro_batch_size=1",
                "train.global_batch_size=16",
            )
        )
    assert "1024 < 1280" in caplog.text

    across = plan_for_config(
        lumi(
            "bloom-176b",
            "parallel.tp=16",
            "parallel.pp=8",
            "train.micro_batch_size=1",
            "train.global_batch_size=8",
        )
    )
    assert any(
        "tp=16 spans nodes (8 MI250X GCDs per node)" in rule.text and not rule.kept
        for rule in across.rules()
    )
    # The hidden-size rule is LUMI's, for MI250X: an H100 plan has none.
    h100 = plan_for_config(
        pipeline_config(
            "mistral-7b",
            "plan.device=h100",
            "train.seq_len=4096",
            "parallel.tp=4",
            "train.micro_batch_size=1",
            "train.global_batch_size=16",
        )
    )
    assert h100.keeps_rules() and not any("hidden" in rule.text for rule in h100.rules())


def test_devices_by_name_and_auto(monkeypatch, tmp_path):
    def device(*overrides):
        return plan_for_config(pipeline_config("tiny", *overrides)).device

    assert device("plan.device=mi250x").memory_gib == 64.0
    assert device("plan.device=h100").memory_gib == pytest.approx(79.65, abs=0.01)
    assert device("plan.device=h200").memory_gib == pytest.approx(140.4, abs=0.05)
    assert device("plan.device=h100", "plan.memory_gib=40").memory_gib == 40
    assert device("cluster.name=lumi").name == "mi250x"
    monkeypatch.setattr(devices, "_NVIDIA_INFO", str(tmp_path / "gpus" / "*" / "information"))
    host = device()  # no GPU listed: CPU ranks share the host's memory
    assert host.name == "cpu" and not host.accelerator
    assert host.memory_per_rank(4) == pytest.approx(host.memory_gib * GIB / 4)
    (tmp_path / "gpus" / "0000:01:00.0").mkdir(parents=True)
    info = tmp_path / "gpus" / "0000:01:00.0" / "information"
    info.write_text("Model: \t\t NVIDIA H100 80GB HBM3\nIRQ: 0\n")
    assert device().name == "h100"
    info.write_text("Model: \t\t NVIDIA L40S\n")
    assert device().memory_gib is None
    with pytest.raises(LayoutError, match="plan.memory_gib"):
        print_plan(pipeline_config("tiny"))
    with pytest.raises(ConfigError, match="plan.device"):
        validate(pipeline_config("tiny", "plan.device=a100"))


def _saved_bytes(module: torch.nn.Module, x: torch.Tensor, segment_ids: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves for the backward of module(x), parameters left
    out."""
    parameters = {p.untyped_storage().data_ptr() for p in module.parameters()}
    saved = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in parameters:
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        module(x, segment_ids)
    return sum(saved.values())


def _block_activation_check(cfg: ModelConfig, dtype: torch.dtype, numerics: Numerics) -> None:
    from pipeline.model.transformer import Block

    torch.manual_seed(0)
    batch, seq = 2, 32
    block = Block(cfg).to(dtype)
    x = torch.randn(batch, seq, cfg.hidden_size, dtype=dtype, requires_grad=True)
    segments = torch.zeros(batch, seq, dtype=torch.long)
    segments[:, 20:] = 1  # two packed documents, as training passes them
    saved = _saved_bytes(block, x, segments)
    if (
        numerics.flash
    ):  # exact but for the kernel's few bytes of index tensors (ALiBi slopes, document ranges)
        assert block_activations(cfg, batch, seq, 1, numerics) == pytest.approx(saved, rel=1e-3)
    else:
        assert block_activations(cfg, batch, seq, 1, numerics) == saved


@pytest.mark.parametrize(
    "cfg", [SMALL_ROPE, SMALL_ALIBI], ids=["rope-gqa-swiglu", "alibi-gelu-bias"]
)
def test_block_activations_are_what_autograd_saves_with_the_reference_kernels(cfg):
    from pipeline.kernels import kernel_backend

    with kernel_backend("reference"):
        _block_activation_check(cfg, torch.float32, Numerics(value_bytes=4, flash=False, host=True))


def check_block_activations_of_the_triton_kernels(interpreted):
    """Run under the Triton interpreter by the test below (float16 stands for bf16: the interpreter
    mishandles it)."""
    for cfg in (SMALL_ROPE, SMALL_ALIBI):
        _block_activation_check(cfg, torch.float16, Numerics(value_bytes=2, flash=True, host=False))


@pytest.fixture(scope="module")
def interpreted():
    assert os.environ.get("TRITON_INTERPRET") == "1", "run through the test below"
    from pipeline.kernels import kernel_backend

    with kernel_backend("triton"):
        yield


def test_block_activations_of_the_triton_kernels_under_the_interpreter():
    # The child collects only `check_*` functions: nothing imported here may have such a name.
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-n",
            "0",
            "-o",
            "python_functions=check_*",
            __file__,
        ],
        cwd=REPO,
        env={**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0 and "1 passed" in result.stdout, (
        result.stdout[-6000:] + result.stderr[-2000:]
    )


@pytest.mark.parametrize(
    "cfg",
    [SMALL_ROPE, SMALL_ALIBI, ModelConfig(vocab_size=200, tie_embeddings=False)],
    ids=["rope-tied", "alibi-tied", "rope-untied"],
)
def test_stage_parameters_are_the_models(cfg):
    from pipeline.model.transformer import Transformer

    whole = sum(
        p.numel() for p in Transformer(cfg).parameters()
    )  # the padded vocabulary, a tied head once
    assert stage_parameters(cfg, tp=1, pp=1, stage=0) == (whole, whole)
    first, last = (stage_parameters(cfg, tp=1, pp=2, stage=stage) for stage in (0, 1))
    copy = cfg.padded_vocab_size * cfg.hidden_size if cfg.tie_embeddings else 0
    embedding_norm = cfg.hidden_size * 2 if cfg.embedding_norm else 0
    assert first[0] + last[0] == whole + copy + embedding_norm
    assert (
        first[1] + last[1] == whole + copy
    )  # the last stage's copy of the embedding norm is frozen
    if cfg.vocab_size % cfg.pad_vocab_multiple == 0:
        assert stage_parameters(cfg, 1, 1, 0)[0] == parameter_count(cfg)


def test_pretrain_refuses_a_layout_that_cannot_fit_before_any_rank_starts(monkeypatch):
    from types import SimpleNamespace

    from pipeline.stages import pretrain, training_inputs
    from pipeline.training import run as training_run

    started = []
    monkeypatch.setattr(training_run, "launch", lambda *args: started.append(args))
    monkeypatch.setattr(pretrain, "pretrain_start", lambda *args: started.append(args))
    cfg = pipeline_config("llama-3.1-70b", "plan.device=mi250x", "train.seq_len=4096")
    # no pack to read the vocabulary of
    monkeypatch.setattr(
        training_inputs,
        "read_pack",
        lambda run: {"tokenizer": {"vocab_size": run.cfg.model.vocab_size}},
    )
    with pytest.raises(LayoutError) as refused:
        pretrain.STAGE.run(SimpleNamespace(cfg=cfg, input_dirs={}, work_dir=Path("/nonexistent")))
    message = str(refused.value)
    assert "tp=1 x pp=1 x dp=1" in message and "does not fit" in message
    tp, pp = map(int, re.search(r"parallel\.tp=(\d+) parallel\.pp=(\d+)", message).groups())
    assert with_layout(plan_for_config(cfg), tp=tp, pp=pp).fits
    assert not started


@pytest.mark.parametrize(
    "preset, overrides, message",
    [
        (
            "llama-2-13b",
            ["parallel.tp=3"],
            "parallel.tp=3 does not divide the model's num_heads, num_kv_heads (40, 40)",
        ),
        (
            "tiny",
            ["parallel.pp=5"],
            "parallel.pp=5 is more pipeline stages than the model has blocks (4)",
        ),
    ],
    ids=["tp", "pp"],
)
def test_a_layout_the_model_cannot_run_is_refused_before_planning(preset, overrides, message):
    with pytest.raises(LayoutError, match=re.escape(message)):
        plan_for_config(pipeline_config(preset, "plan.device=h100", *overrides))


# docs/plan.md's table: one node of 8 devices, 4,096 tokens a sequence, 64 sequences a step; Gemma 3's
# 256-wide heads on the PyTorch attention, with activation checkpointing.
GEMMA = ("kernels=reference", "train.activation_checkpoint_interval=1")
NODE_LAYOUTS = [
    ("qwen2.5-7b", "mi250x", 1, 2, 4, ()),
    ("qwen3-8b", "mi250x", 1, 2, 4, ()),
    ("olmo-2-7b", "mi250x", 1, 2, 4, ()),
    ("phi-3-mini", "mi250x", 1, 1, 8, ()),
    ("gemma-3-12b", "mi250x", 1, 2, 4, GEMMA),
    ("qwen2.5-7b", "h100", 1, 1, 8, ()),
    ("qwen3-8b", "h100", 1, 1, 8, ()),
    ("olmo-2-7b", "h100", 1, 1, 8, ()),
    ("phi-3-mini", "h100", 1, 1, 8, ()),
    ("gemma-3-12b", "h100", 1, 1, 8, GEMMA),
]


@pytest.mark.parametrize("preset, device, tp, pp, dp, extra", NODE_LAYOUTS)
def test_the_documented_node_layouts_of_the_new_bases_fit(preset, device, tp, pp, dp, extra):
    options = ("train.seq_len=4096", "train.micro_batch_size=1", "train.global_batch_size=64")
    cfg = pipeline_config(preset, f"plan.device={device}", *options, *extra)
    # the layout stage=workflow fills a node with: on an MI250X GCD, a pipeline of 2 before tensor
    # parallelism of 2 at 16 micro-batches a step (expected 0.90 of two GPUs against 0.89)
    chosen = planning.node_filling_layout(cfg, 8, (cfg.train,))
    assert (chosen.tp, chosen.pp, chosen.dp) == (tp, pp, dp)
    plan = plan_for_config(dataclasses.replace(cfg, parallel=chosen))
    assert plan.fits and plan.keeps_rules(), render(plan)
    row = next(
        line
        for line in (REPO / "docs" / "plan.md").read_text(encoding="utf-8").splitlines()
        if line.startswith(f"| `{preset}` ")
    )
    assert f"| {tp} x {pp} x {dp} | {plan.largest.peak / GIB:.1f} |" in row, row


def test_heads_wider_than_the_triton_kernels_take_are_refused_at_start_naming_the_fix():
    with pytest.raises(LayoutError, match=r"heads are 256 wide .* set kernels=reference"):
        plan_for_config(pipeline_config("gemma-3-12b", "plan.device=h100"))
    assert plan_for_config(pipeline_config("gemma-3-12b", "plan.device=cpu")).layout


def test_every_preset_plans_with_its_own_defaults():
    # train.seq_len null: the context, at most 2,048 (Mistral: 32,768)
    for preset in sorted(path.stem for path in (CONF_DIR / "model").glob("*.yaml")):
        # Gemma 3's 256-wide heads run on the PyTorch attention (refused on Triton's: below)
        kernels = "kernels=reference" if preset.startswith("gemma") else "kernels=auto"
        plan = plan_for_config(pipeline_config(preset, "plan.device=h100", kernels))
        assert plan.layout.seq_len <= 2048, preset


@pytest.mark.parametrize(
    "hf",
    [
        {
            "model_type": "bloom",
            "architectures": ["BloomForCausalLM"],
            "hidden_size": 256,
            "n_layer": 3,
            "n_head": 8,
            "vocab_size": 1000,
            "seq_length": 1024,
        },
        {
            "model_type": "llama",
            "architectures": ["LlamaForCausalLM"],
            "hidden_size": 256,
            "num_hidden_layers": 3,
            "num_attention_heads": 8,
            "num_key_value_heads": 2,
            "intermediate_size": 640,
            "vocab_size": 1000,
            "max_position_embeddings": 4096,
            "tie_word_embeddings": True,
        },
        {
            "model_type": "mistral",
            "architectures": ["MistralForCausalLM"],
            "hidden_size": 256,
            "num_hidden_layers": 3,
            "num_attention_heads": 8,
            "num_key_value_heads": 4,
            "intermediate_size": 640,
            "vocab_size": 1000,
        },
    ],
    ids=["bloom", "llama", "mistral"],
)
def test_a_model_folder_is_planned_from_its_config_json(tmp_path, hf):
    """model.base's config.json gives the shape (pipeline/model/base_shape.py) before the planner
    sees the config."""
    (tmp_path / "config.json").write_text(json.dumps(hf))
    result = run_cli(
        "stage=plan",
        f"model.base={tmp_path}",
        "plan.device=h100",
        "train.seq_len=1024",
        cwd=tmp_path,
    )
    assert f"hidden {hf['hidden_size']}, 3 layers" in result.stdout


def test_the_planner_knows_whether_the_engine_fuses_the_head_with_the_loss():
    from pipeline.parallel.pipeline_model import HeadLayer

    output = HeadLayer(SMALL_ROPE)(torch.zeros(1, 2, SMALL_ROPE.hidden_size))
    # A fused loss gets the hidden states and the head's weight; otherwise the head's output is the
    # logits.
    assert memory.HEAD_FUSED_WITH_LOSS == isinstance(output, tuple)
    from pipeline.kernels.fused_head import CHUNK_LOGIT_ELEMENTS

    assert memory.FUSED_LOSS_CHUNK_LOGITS == CHUNK_LOGIT_ELEMENTS


def test_the_planner_imports_no_torch():
    code = (
        "import sys, pipeline.memory_fit; assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        check=True,
    )


def test_a_null_micro_batch_is_the_largest_that_fits(caplog):
    """Of the divisors of global batch / dp, the largest whose layout fits; the next larger one does
    not."""
    cfg = pipeline_config(
        "mistral-7b",
        "plan.device=h100",
        "train.seq_len=4096",
        "parallel.tp=4",
        "train.global_batch_size=64",
        "train.micro_batch_size=null",
    )
    with caplog.at_level(logging.INFO, logger="pipeline.memory_fit.check"):
        train = planning.fitting_micro_batch(cfg, cfg.train)
    micro = train.micro_batch_size
    assert 1 < micro < 64 and 64 % micro == 0
    assert plan_for_config(cfg, train=train).fits
    larger = min(m for m in (2, 4, 8, 16, 32, 64) if m > micro)
    train.micro_batch_size = larger
    assert not plan_for_config(cfg, train=train).fits
    assert f"train.micro_batch_size=null: {micro} sequences per micro-batch" in caplog.text
    kept = pipeline_config(
        "mistral-7b", "plan.device=h100", "train.seq_len=4096", "train.micro_batch_size=2"
    )
    assert planning.fitting_micro_batch(kept, kept.train) is kept.train


def test_a_null_micro_batch_counts_the_vocabulary_the_model_trains_with():
    """The training stages plan with the pack tokenizer's vocabulary (an extended base tokenizer
    adds rows to the base's): a larger vocabulary means larger logits and embeddings, so a
    micro-batch that fits no more."""
    cfg = pipeline_config(
        "mistral-7b",
        "plan.device=h100",
        "train.seq_len=4096",
        "parallel.tp=4",
        "train.global_batch_size=64",
        "train.micro_batch_size=null",
    )
    base = planning.fitting_micro_batch(cfg, cfg.train).micro_batch_size
    larger = dataclasses.replace(cfg.model, vocab_size=16 * cfg.model.vocab_size)
    trained = planning.fitting_micro_batch(cfg, cfg.train, model=larger)
    assert trained.micro_batch_size < base
    assert plan_for_config(cfg, larger, train=trained).fits
    assert not plan_for_config(
        cfg, larger, train=dataclasses.replace(trained, micro_batch_size=base)
    ).fits


def test_a_null_micro_batch_keeps_the_pipeline_four_micro_batches_deep_per_stage():
    cfg = pipeline_config(
        "tiny",
        "plan.device=h100",
        "parallel.pp=2",
        "train.global_batch_size=64",
        "train.micro_batch_size=null",
    )
    assert planning.fitting_micro_batch(cfg, cfg.train).micro_batch_size == 8  # 64 / 8 = 8 = 4 x pp
    shallow = pipeline_config(
        "tiny",
        "plan.device=h100",
        "parallel.pp=4",
        "train.global_batch_size=8",
        "train.micro_batch_size=null",
    )
    assert planning.fitting_micro_batch(shallow, shallow.train).micro_batch_size == 1


def test_a_null_micro_batch_on_a_device_of_unknown_memory_is_eight_with_a_warning(caplog):
    cfg = pipeline_config(
        "tiny", "plan.device=a100", "train.global_batch_size=64", "train.micro_batch_size=null"
    )
    with caplog.at_level(logging.WARNING, logger="pipeline.memory_fit.check"):
        assert planning.fitting_micro_batch(cfg, cfg.train).micro_batch_size == 8
    assert "memory of a100 is unknown" in caplog.text


@pytest.mark.parametrize(
    "overrides, key",
    [
        (
            ["train.micro_batch_size=null", "train.global_batch_size=6", "parallel.dp=4"],
            "train.global_batch_size",
        ),
        (["train.micro_batch_size=0"], "train.micro_batch_size"),
    ],
)
def test_micro_batch_mistakes_are_refused(overrides, key):
    with pytest.raises(ConfigError, match=re.escape(key)):
        validate(pipeline_config("tiny", *overrides))


@pytest.mark.parametrize("stage_name", ["pretrain", "warmup"])
def test_the_training_stages_train_with_the_planned_micro_batch(monkeypatch, stage_name):
    from types import SimpleNamespace

    from pipeline.stages import pretrain, training_inputs, warmup

    module = {"pretrain": pretrain, "warmup": warmup}[stage_name]
    seen = []

    def stop(*args, **kwargs):
        seen.append(planning.fitting_micro_batch(*args, **kwargs).micro_batch_size)
        raise RuntimeError("stop before reading the pack")

    monkeypatch.setattr(training_inputs, "fitting_micro_batch", stop)
    section = "train" if stage_name == "pretrain" else "warmup.train"
    cfg = pipeline_config(
        "llama-3.2-1b",
        "plan.device=h100",
        "model.base=/nonexistent",
        f"{section}.micro_batch_size=null",
        f"{section}.global_batch_size=64",
        f"{section}.seq_len=4096",
    )
    # The model as it trains has the pack tokenizer's vocabulary (here 4x the base's): the plan
    # counts it.
    trained = dataclasses.replace(cfg.model, vocab_size=4 * cfg.model.vocab_size)
    monkeypatch.setattr(
        training_inputs, "read_pack", lambda run: {"tokenizer": {"vocab_size": trained.vocab_size}}
    )
    with pytest.raises(RuntimeError, match="stop before"):
        module.STAGE.run(SimpleNamespace(cfg=cfg, input_dirs={}, work_dir=Path("/nonexistent")))
    train = cfg.train if stage_name == "pretrain" else cfg.warmup.train
    expected = planning.fitting_micro_batch(cfg, train, model=trained)
    assert seen == [expected.micro_batch_size] and seen[0] > 1
    assert seen[0] < planning.fitting_micro_batch(cfg, train).micro_batch_size


@pytest.mark.parametrize("preset", ["tiny", "mistral-7b", "llama-3.1-70b"])
def test_the_layout_that_fills_whole_nodes_has_the_fewest_model_parallel_ranks_that_fit(preset):
    """stage=workflow on LUMI's whole nodes without a layout of the user's
    (memory_fit.node_filling_layout)."""
    cfg = lumi(preset, "train.global_batch_size=64", "warmup.train.global_batch_size=64")
    layout = planning.node_filling_layout(cfg, 8, (cfg.train, cfg.warmup.train))
    mp = layout.tp * layout.pp
    assert layout.dp == max(1, 8 // mp) and (mp * layout.dp) % 8 == 0  # whole nodes, nothing idle

    def fits(tp: int, pp: int, dp: int) -> bool:
        trial = dataclasses.replace(
            cfg, parallel=dataclasses.replace(cfg.parallel, tp=tp, pp=pp, dp=dp)
        )
        return plan_for_config(trial, train=dataclasses.replace(cfg.train, micro_batch_size=1)).fits

    assert fits(layout.tp, layout.pp, layout.dp)
    # Every layout of fewer model-parallel ranks, at the data-parallel degree it would leave, does
    # not fit.
    assert not any(
        fits(tp, pp, max(1, 8 // (tp * pp)))
        for tp in tensor_parallel_choices(cfg.model, devices.DEVICES["mi250x"])
        for pp in range(1, cfg.model.num_layers + 1)
        if tp * pp < mp
    )
    if preset == "tiny":
        assert (layout.tp, layout.pp, layout.dp) == (1, 1, 8)
        # The data-parallel ranks divide every global batch (by the micro-batch where it is set): 6
        # of 12.
        odd = lumi(
            "tiny",
            *(
                f"{section}.{key}={value}"
                for section in ("train", "warmup.train")
                for key, value in (("global_batch_size", 12), ("micro_batch_size", "null"))
            ),
        )
        assert planning.node_filling_layout(odd, 8, (odd.train, odd.warmup.train)).dp == 6
