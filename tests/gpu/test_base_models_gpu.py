"""A Gemma-3-shaped and a Qwen3-shaped random base on one GPU (issue 54): `stage=warmup` and a short
`stage=pretrain` through the command line with the Triton kernels in bf16 (Gemma 3's windowed layer
shorter than the training sequences, its local RoPE base, q/k norms), then the exported `hf/`
folder's logits on the GPU, ours (Triton) against transformers' (eager), in bf16. Skipped without
CUDA; tests/e2e/test_base_models.py runs the same stages on CPU for every architecture.

    python -m pytest -q -n 0 tests/gpu/test_base_models_gpu.py
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from pipeline.model.hf_import import from_hf
from tests.conftest import CHAIN_OPTIONS, marker, run_cli
from tests.e2e.test_base_models import SPECIAL_IDS, english_tokenizer  # noqa: F401 (a fixture)

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

SEQ = 256
WINDOW = 64  # Gemma 3's windowed layers see a quarter of each training sequence
SIZES = {
    "hidden_size": 256,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "head_dim": 64,
    "intermediate_size": 512,
    "vocab_size": 512,
    **SPECIAL_IDS,
}
BASES = {
    "gemma3": lambda: transformers.Gemma3TextConfig(
        **SIZES,
        num_key_value_heads=2,
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "sliding_attention", "full_attention"],
        rope_theta=1e6,
        rope_local_base_freq=1e4,
    ),
    "qwen3": lambda: transformers.Qwen3Config(**SIZES, num_key_value_heads=2),
}
# bf16 logits of two implementations: the relative error of the whole tensor
TOLERANCE = 2e-2


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    """The embedded Norwegian sample cleaned, mixed, tokenized and packed on the GPU machine's CPU,
    deduplication left out (the CPU suite covers it; datatrove's MinHash fails on the lent GPU
    machines' hashing library)."""
    cwd = tmp_path_factory.mktemp("nob")
    for stage in ("clean", "mix", "tokenizer", "pack"):
        run_cli(f"stage={stage}", *CHAIN_OPTIONS, "clean.dedup.enabled=false", cwd=cwd)
    assert marker(cwd / "work", "nob", "pack")
    return cwd


@pytest.mark.parametrize("family", sorted(BASES))
def test_a_random_base_warms_up_and_pretrains_on_a_gpu(
    family,
    packed,
    english_tokenizer,  # noqa: F811 (the fixture imported above)
    tmp_path,
):
    torch.manual_seed(0)
    base = tmp_path / family
    transformers.AutoModelForCausalLM.from_config(BASES[family]()).save_pretrained(base)
    for file in english_tokenizer.iterdir():
        shutil.copy(file, base / file.name)
    work = tmp_path / "work"
    for stage in ("clean", "mix", "tokenizer", "pack"):
        shutil.copytree(packed / "work" / "nob" / stage, work / "nob" / stage)
    common = (
        *CHAIN_OPTIONS,
        "clean.dedup.enabled=false",
        f"work_dir={work}",
        f"model.base={base}",
        "warmup.train.steps=2",
        f"warmup.train.seq_len={SEQ}",
        "warmup.train.global_batch_size=8",
        "warmup.train.eval_tokens=4096",
        "train.steps=8",
        "train.log_every=1",
        f"train.seq_len={SEQ}",
        "train.global_batch_size=8",
        "train.eval_tokens=4096",
    )
    run_cli("stage=warmup", *common, cwd=tmp_path)
    run_cli("stage=pretrain", *common, cwd=tmp_path)

    metrics = (work / "nob" / "pretrain" / "metrics.jsonl").read_text().splitlines()
    losses = torch.tensor([entry["loss"] for entry in map(json.loads, metrics) if "loss" in entry])
    assert len(losses) >= 8 and torch.isfinite(losses).all() and losses.std() > 0, losses

    exported = work / "nob" / "pretrain" / "hf"
    ids = torch.randint(0, 512, (2, SEQ), generator=torch.Generator().manual_seed(1)).cuda()
    ours, cfg = from_hf(exported, torch.bfloat16)
    if family == "gemma3":
        assert [cfg.layer_window(layer) for layer in range(3)] == [WINDOW, WINDOW, None]
    reference = transformers.AutoModelForCausalLM.from_pretrained(
        exported, dtype=torch.bfloat16, attn_implementation="eager"
    )
    with torch.no_grad():
        got = ours.cuda().eval()(ids).float()
        expected = reference.cuda().eval()(ids).logits.float()
    error = ((got - expected).norm() / expected.norm()).item()
    assert error < TOLERANCE, error
