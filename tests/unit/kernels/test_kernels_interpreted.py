"""Every Triton kernel against its plain PyTorch reference on CPU, under the Triton interpreter:
forward and gradients.

`TRITON_INTERPRET=1` must be set before Triton is first imported (its own library kernels are built
then), and other test files import Triton normally, so the checks run in a child pytest with the
variable set: the one test collected in the suite, `test_kernels_under_the_triton_interpreter`, runs
this file again in a child process that collects the `check_*` functions below (and prints their
failures if any). float32 and float16 only: the interpreter mishandles bfloat16
(tests/gpu/test_kernels_gpu.py checks bf16 on a GPU).

    TRITON_INTERPRET=1 python -m pytest -o python_functions='check_*' tests/unit/kernels/test_kernels_interpreted.py
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import pipeline.kernels as kernels
from pipeline.kernels import reference
from pipeline.kernels.backend import mend_triton_interpreter
from pipeline.kernels.launch_configs import ATTENTION

REPO = Path(__file__).resolve().parents[3]
TOLERANCE = {torch.float32: 1e-4, torch.float16: 5e-3}


def test_kernels_under_the_triton_interpreter():
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
    )
    assert result.returncode == 0 and " passed" in result.stdout, (
        "the interpreted kernel checks failed "
        f"({result.returncode}):\n{result.stdout[-8000:]}\n{result.stderr[-3000:]}"
    )


@pytest.fixture(scope="module")
def interpreted():
    """The Triton kernel modules, interpreted, with the `triton` backend forced for CPU tensors."""
    assert os.environ.get("TRITON_INTERPRET") == "1", (
        "run through test_kernels_under_the_triton_interpreter"
    )
    from pipeline.kernels import attention, cross_entropy, norms

    # Some checks launch the kernel modules' own functions, not through the dispatch that mends the
    # interpreter.
    mend_triton_interpreter()
    with kernels.kernel_backend("triton"):
        yield {"attention": attention, "norms": norms, "cross_entropy": cross_entropy}


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    assert torch.isfinite(actual).all(), "non-finite values in the kernel's result"
    return ((actual.double() - expected.double()).norm() / expected.double().norm()).item()


def assert_close(actual, expected, dtype, what):
    """Relative error below the dtype's tolerance; where the expected tensor is exactly zero (dQ and
    dK when every query sees itself only), the root mean square of the actual one instead."""
    assert actual.shape == expected.shape, (
        f"{what}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    )
    if expected.count_nonzero() == 0:
        error = actual.double().square().mean().sqrt().item()
    else:
        error = relative_error(actual, expected)
    assert error < TOLERANCE[dtype], f"{what}: relative error {error:.2e} >= {TOLERANCE[dtype]}"


def compare_with_reference(triton_fn, reference_fn, inputs, dtype, **kwargs):
    """Outputs (one tensor or a tuple) and every input gradient of the Triton path vs the reference
    on float64 copies of the inputs; every output gets a random gradient."""
    leaves = [x.detach().requires_grad_(x.is_floating_point()) for x in inputs]
    reference_leaves = [
        x.detach().double().requires_grad_() if x.is_floating_point() else x for x in inputs
    ]
    outs, expected = triton_fn(*leaves, **kwargs), reference_fn(*reference_leaves, **kwargs)
    outs, expected = (outs, expected) if isinstance(outs, tuple) else ((outs,), (expected,))
    for index, (out, wanted) in enumerate(zip(outs, expected, strict=True)):
        assert_close(out, wanted, dtype, f"output {index}")
    grad_outs = [torch.randn_like(wanted) for wanted in expected]
    differentiable = [i for i, x in enumerate(leaves) if x.requires_grad]
    grads = torch.autograd.grad(
        outs,
        [leaves[i] for i in differentiable],
        [grad.to(out.dtype) for grad, out in zip(grad_outs, outs)],
    )
    expected_grads = torch.autograd.grad(
        expected, [reference_leaves[i] for i in differentiable], grad_outs
    )
    for i, actual, wanted in zip(differentiable, grads, expected_grads):
        assert_close(actual, wanted, dtype, f"gradient of input {i}")


def packed_documents(batch: int, seq: int, lengths: list[int]) -> torch.Tensor:
    """Segment ids 0, 1, ... of documents with these lengths, repeated to fill each row, shifted per
    row."""
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    return torch.stack([ids.roll(row * 37)[:seq].sort().values for row in range(batch)])


@pytest.mark.parametrize(
    "batch, heads, kv_heads, seq, head_dim, causal, alibi, segments, dtype",
    [
        (
            1,
            2,
            2,
            150,
            32,
            True,
            True,
            None,
            torch.float32,
        ),  # several query and key blocks, causal split
        (
            2,
            4,
            2,
            97,
            80,
            True,
            True,
            "short",
            torch.float32,
        ),  # GQA, odd length, padded head dim, documents
        (1, 4, 1, 130, 64, False, True, "short", torch.float32),  # MQA, bidirectional
        (1, 2, 2, 77, 96, True, False, None, torch.float16),
        (1, 4, 2, 130, 32, True, True, "short", torch.float16),
        (
            2,
            2,
            1,
            260,
            32,
            True,
            True,
            "long",
            torch.float32,
        ),  # documents spanning whole blocks: unmasked runs
        (1, 1, 1, 260, 32, False, False, "long", torch.float16),
    ],
)
def check_attention_matches_reference(
    interpreted, batch, heads, kv_heads, seq, head_dim, causal, alibi, segments, dtype
):
    torch.manual_seed(seq + head_dim)
    q = torch.randn(batch, heads, seq, head_dim, dtype=dtype)
    k, v = (torch.randn(batch, kv_heads, seq, head_dim, dtype=dtype) for _ in range(2))
    kwargs = dict(causal=causal, softmax_scale=0.7 / head_dim**0.5 if segments else None)
    if alibi:
        kwargs["alibi_slopes"] = torch.rand(heads) * 0.5
    if segments == "short":  # documents of random lengths, plus one token that matches no neighbour
        ids = torch.randint(0, 4, (batch, seq)).sort(dim=1).values
        ids[:, seq // 2] = 99
        kwargs["segment_ids"] = ids
    elif segments == "long":
        kwargs["segment_ids"] = packed_documents(batch, seq, [40, 170, 60, 140])
    compare_with_reference(kernels.flash_attention, reference.attention, [q, k, v], dtype, **kwargs)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def check_stacked_attention_matches_reference(interpreted, dtype):
    """q, k, v side by side in one tensor (GQA: 4 query and 2 key/value heads), with ALiBi and
    documents: the output, and the one gradient that holds all three."""
    torch.manual_seed(2)
    qkv = torch.randn(2, 97, (4 + 2 * 2) * 32, dtype=dtype)
    kwargs = dict(
        alibi_slopes=torch.rand(4) * 0.5, segment_ids=packed_documents(2, 97, [30, 50, 17])
    )
    compare_with_reference(
        lambda qkv, **kw: kernels.stacked_flash_attention(qkv, 4, 32, **kw),
        lambda qkv, **kw: reference.attention(*reference.unstack_qkv(qkv, 4, 32), **kw),
        [qkv],
        dtype,
        **kwargs,
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads, kv_heads, head_dim", [(4, 2, 32), (12, 4, 80)])
def check_rope_on_stacked_qkv_matches_reference(interpreted, dtype, heads, kv_heads, head_dim):
    """RoPE on q and k where they lie side by side with v: the rotated stack and its gradient. The
    tables are random, so that each half of a head reads its own cos and sin; 20 heads of 80 fill
    the kernel's tiles of 8 heads and of 64 pairs only in part."""
    torch.manual_seed(4)
    seq = 37
    qkv = torch.randn(2, seq, (heads + 2 * kv_heads) * head_dim, dtype=dtype)
    cos, sin = torch.randn(2, seq, head_dim, dtype=dtype).unbind(0)
    compare_with_reference(
        lambda qkv: kernels.rotate_stacked_qkv(qkv, heads, head_dim, cos, sin),
        lambda qkv: reference.rotate_stacked_qkv(qkv, heads, head_dim, cos.double(), sin.double()),
        [qkv],
        dtype,
    )


@pytest.mark.parametrize("arch", sorted(ATTENTION))
def check_attention_with_each_architecture_tiles(interpreted, arch):
    """The tile sizes of every table entry give the same result (the interpreter ignores warps and
    stages), dense and with documents: the document-mask entries of head dim 64 and those whose
    tiles differ from the dense ones (with 128-key dK/dV blocks the first key block spans two
    documents and the second lies inside one, so both of the kernel's masking paths run)."""
    torch.manual_seed(1)
    slopes = torch.tensor([0.25, 0.0625])
    tiles = lambda configs: [
        (c.block_m, c.block_n) for c in (configs.forward, configs.backward_kv, configs.backward_q)
    ]
    for head_dim, dense in ATTENTION[arch].items():
        documents = dense.specialised(True)
        cases = [(dense, None)] + (
            [(documents, packed_documents(1, 160, [50, 110]))]
            if head_dim == 64 or tiles(documents) != tiles(dense)
            else []
        )
        for configs, segment_ids in cases:
            q = torch.randn(1, 2, 160, head_dim)
            k, v = (torch.randn(1, 1, 160, head_dim) for _ in range(2))
            attend = lambda q, k, v, configs=configs, segment_ids=segment_ids: interpreted[
                "attention"
            ].flash_attention(
                q, k, v, alibi_slopes=slopes, segment_ids=segment_ids, configs=configs
            )
            reference_attend = lambda q, k, v, segment_ids=segment_ids: reference.attention(
                q, k, v, alibi_slopes=slopes.double(), segment_ids=segment_ids
            )
            compare_with_reference(attend, reference_attend, [q, k, v], torch.float32)


# Sliding windows (Mistral, Gemma 2/3) and Gemma 2's soft cap: (batch, heads, kv_heads, seq,
# head_dim) and the options, in the interpreter's default tiles (forward 64 x 64, dK/dV 64 keys x
# 32 queries, dQ 64 queries x 32 keys).
WINDOW_AND_SOFTCAP_CASES = {
    # windows narrower than a key block, over several blocks, one key short of the sequence
    "window 40": ((1, 2, 2, 150, 32), dict(sliding_window=40)),
    "window 5, padded head dim": ((2, 2, 2, 130, 48), dict(sliding_window=5)),
    "window 149 of 150": ((1, 2, 2, 150, 32), dict(sliding_window=149)),
    "window 1: each query sees itself": ((1, 2, 2, 100, 16), dict(sliding_window=1)),
    "window longer than the sequence": ((1, 2, 1, 70, 16), dict(sliding_window=500)),
    "window + documents": ((2, 2, 2, 200, 32), dict(sliding_window=50, segment_ids="long")),
    "window + GQA + ALiBi": ((1, 4, 2, 150, 32), dict(sliding_window=70, alibi_slopes=True)),
    "window + documents + GQA": ((2, 4, 2, 130, 32), dict(sliding_window=33, segment_ids="short")),
    "softcap, bidirectional": ((1, 2, 2, 97, 32), dict(softcap=2.0, causal=False)),
    "softcap, causal": ((2, 2, 1, 150, 64), dict(softcap=5.0, softmax_scale=0.3)),
    "softcap + window + documents + GQA": (
        (2, 4, 2, 170, 32),
        dict(softcap=3.0, sliding_window=45, segment_ids="long"),
    ),
}


# float16 on the cases that combine the options (the suite's time: each case costs seconds here).
HALF_PRECISION_CASES = (
    "window + documents + GQA",
    "softcap, causal",
    "softcap + window + documents + GQA",
)


@pytest.mark.parametrize(
    "case, dtype",
    [(case, torch.float32) for case in WINDOW_AND_SOFTCAP_CASES]
    + [(case, torch.float16) for case in HALF_PRECISION_CASES],
)
def check_attention_window_and_softcap(interpreted, case, dtype):
    """Sliding windows and the soft cap, alone and with documents, GQA and ALiBi: the output and
    dQ, dK, dV against the reference."""
    (batch, heads, kv_heads, seq, head_dim), options = WINDOW_AND_SOFTCAP_CASES[case]
    torch.manual_seed(seq + heads)
    q = torch.randn(batch, heads, seq, head_dim, dtype=dtype)
    k, v = (torch.randn(batch, kv_heads, seq, head_dim, dtype=dtype) for _ in range(2))
    kwargs = dict(options)
    if kwargs.get("alibi_slopes"):
        kwargs["alibi_slopes"] = torch.rand(heads) * 0.5
    if kwargs.get("segment_ids") == "long":
        kwargs["segment_ids"] = packed_documents(batch, seq, [40, 170, 60, 140])
    elif kwargs.get("segment_ids") == "short":
        kwargs["segment_ids"] = torch.randint(0, 5, (batch, seq)).sort(dim=1).values
    compare_with_reference(kernels.flash_attention, reference.attention, [q, k, v], dtype, **kwargs)


def check_stacked_attention_with_window_and_softcap(interpreted):
    torch.manual_seed(5)
    qkv = torch.randn(2, 97, (4 + 2 * 2) * 32, dtype=torch.float16)
    kwargs = dict(sliding_window=30, softcap=4.0, segment_ids=packed_documents(2, 97, [30, 50, 17]))
    compare_with_reference(
        lambda qkv, **kw: kernels.stacked_flash_attention(qkv, 4, 32, **kw),
        lambda qkv, **kw: reference.attention(*reference.unstack_qkv(qkv, 4, 32), **kw),
        [qkv],
        torch.float16,
        **kwargs,
    )


def check_window_skips_the_tiles_outside_it(interpreted):
    """Whole tiles outside the window are never read: with NaN in keys and values 0-63, the
    outputs and dQ of queries 128 on (window 32: they see keys 97 on) are finite and right, and
    with NaN in the queries and output gradients from 128 on, so are dK and dV of keys 0-63 (seen
    by queries up to 94). A masked tile that were read would spread the NaN (0 * NaN)."""
    seq, window = 256, 32
    configs = ATTENTION["default"][64]
    torch.manual_seed(8)
    q, k, v, grad = (torch.randn(1, 2, seq, 16) for _ in range(4))
    leaves = [x.double().requires_grad_() for x in (q, k, v)]
    expected = reference.attention(*leaves, sliding_window=window)
    expected_grads = torch.autograd.grad(expected, leaves, grad.double())

    def run(q, k, v, grad):
        leaves = [x.requires_grad_() for x in (q, k, v)]
        out = interpreted["attention"].flash_attention(
            *leaves, sliding_window=window, configs=configs
        )
        return out, *torch.autograd.grad(out, leaves, grad)

    poisoned_k, poisoned_v = k.clone(), v.clone()
    poisoned_k[:, :, :64] = poisoned_v[:, :, :64] = float("nan")
    out, dq, _, _ = run(q.clone(), poisoned_k, poisoned_v, grad)
    assert_close(out[:, :, 128:], expected[:, :, 128:], torch.float32, "output")
    assert_close(dq[:, :, 128:], expected_grads[0][:, :, 128:], torch.float32, "dq")

    poisoned_q, poisoned_grad = q.clone(), grad.clone()
    poisoned_q[:, :, 128:] = poisoned_grad[:, :, 128:] = float("nan")
    _, _, dk, dv = run(poisoned_q, k.clone(), v.clone(), poisoned_grad)
    assert_close(dk[:, :, :64], expected_grads[1][:, :, :64], torch.float32, "dk")
    assert_close(dv[:, :, :64], expected_grads[2][:, :, :64], torch.float32, "dv")


def check_refused_options(interpreted):
    """What no backend computes is refused by name, on the Triton backend as on the reference."""
    q = torch.randn(1, 2, 40, 16)
    cases = {
        "causal=True": dict(sliding_window=8, causal=False),
        "sliding_window must be >= 1": dict(sliding_window=0),
        "sliding_window must be an int": dict(sliding_window=8.0),
        "softcap must be a finite number > 0": dict(softcap=0.0),
        "softcap together with alibi_slopes": dict(softcap=5.0, alibi_slopes=torch.ones(2)),
    }
    for message, kwargs in cases.items():
        for backend in ("triton", "reference"):
            with kernels.kernel_backend(backend), pytest.raises((ValueError, TypeError)) as error:
                kernels.flash_attention(q, q, q, **kwargs)
            assert message in str(error.value), (backend, kwargs, str(error.value))


@pytest.mark.parametrize("arch", ["sm90", "gfx90a"])
def check_window_and_softcap_with_each_architecture_tiles(interpreted, arch):
    """A sliding window with the soft cap in the GPU tables' tiles (their own where the variant has
    some, as Gemma 2's local layers run them), dense and on packed rows: the window's edges fall
    elsewhere in each tiling."""
    torch.manual_seed(2)
    for head_dim, table in ATTENTION[arch].items():
        for segment_ids in (None, packed_documents(1, 160, [50, 110])):
            configs = table.specialised(segment_ids is not None, window=True, softcap=True)
            q = torch.randn(1, 2, 160, head_dim)
            k, v = (torch.randn(1, 1, 160, head_dim) for _ in range(2))
            options = dict(sliding_window=45, softcap=10.0, segment_ids=segment_ids)
            compare_with_reference(
                lambda q, k, v, configs=configs: interpreted["attention"].flash_attention(
                    q, k, v, configs=configs, **options
                ),
                lambda q, k, v: reference.attention(q, k, v, **options),
                [q, k, v],
                torch.float32,
            )


def document_ids(seq: int, boundaries: list[int]) -> torch.Tensor:
    """Segment ids 0, 1, ... of one row whose documents start at these positions (and at 0)."""
    return (torch.arange(seq)[:, None] >= torch.tensor(boundaries)[None, :]).sum(1)


# One row of many documents (the interpreter's tiles are 64 and 32 wide): one-token documents at the
# row's start and end and on each side of 32- and 64-token block edges, the others starting inside
# blocks.
MANY_DOCUMENTS = [1, 3, 31, 32, 33, 63, 64, 65, 96, 127, 128, 149]
LAYOUTS = {
    # a row that is one document beside a row of many: every block full in the first, few in the
    # second
    "one and many": lambda seq: torch.stack(
        [torch.zeros(seq, dtype=torch.long), document_ids(seq, MANY_DOCUMENTS)]
    ),
    # every document starts and ends inside a block, none a multiple of a tile
    "inside blocks": lambda seq: torch.stack(
        [document_ids(seq, [45, 115, 135]), document_ids(seq, [20, 90])]
    ),
    # every token its own document: each query sees itself only
    "one-token documents": lambda seq: torch.arange(seq).repeat(2, 1),
}


@pytest.mark.parametrize(
    "layout, causal, kv_heads, dtype",
    [
        ("one and many", True, 2, torch.float32),
        ("one and many", False, 1, torch.float16),
        ("inside blocks", True, 1, torch.float16),
        ("inside blocks", False, 2, torch.float32),
        ("one-token documents", True, 2, torch.float32),
    ],
)
def check_attention_document_layouts(interpreted, layout, causal, kv_heads, dtype):
    """Outputs and dQ, dK, dV against the reference for rows of one document and of many, one-token
    documents and documents that start inside a block, with ALiBi, causal and bidirectional."""
    seq, heads, head_dim = 150, 2, 32
    torch.manual_seed(seq)
    q = torch.randn(2, heads, seq, head_dim, dtype=dtype)
    k, v = (torch.randn(2, kv_heads, seq, head_dim, dtype=dtype) for _ in range(2))
    compare_with_reference(
        kernels.flash_attention,
        reference.attention,
        [q, k, v],
        dtype,
        causal=causal,
        alibi_slopes=torch.tensor([0.3, 0.05]),
        segment_ids=LAYOUTS[layout](seq),
    )


def check_attention_keeps_the_projection_layout(interpreted):
    """q, k, v as a model makes them, (batch, seq, heads, head_dim) projections viewed as (batch,
    heads, seq, head_dim): the output and dQ, dK, dV come back in that layout, so that reading them
    as (batch, seq, hidden) copies nothing, and with the reference's values."""
    batch, seq, heads, kv_heads, head_dim = 2, 70, 4, 2, 32
    torch.manual_seed(7)
    projections = [torch.randn(batch, seq, n * head_dim) for n in (heads, kv_heads, kv_heads)]
    q, k, v = (
        p.view(batch, seq, -1, head_dim).transpose(1, 2).requires_grad_() for p in projections
    )
    slopes, segment_ids = torch.tensor([0.3, 0.1, 0.05, 0.01]), LAYOUTS["inside blocks"](seq)
    out = kernels.flash_attention(q, k, v, alibi_slopes=slopes, segment_ids=segment_ids)
    assert out.transpose(1, 2).is_contiguous(), f"output strides {out.stride()}"
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    for name, grad in zip("qkv", grads):
        assert grad.transpose(1, 2).is_contiguous(), f"d{name} strides {grad.stride()}"
    compare_with_reference(
        kernels.flash_attention,
        reference.attention,
        [q, k, v],
        torch.float32,
        alibi_slopes=slopes,
        segment_ids=segment_ids,
    )


def check_document_blocks_are_resolved_once_per_batch(interpreted, monkeypatch):
    """Layers that get the same segment_ids tensor share its int32 copy and block ranges: one range
    launch per tiling for a forward and backward through two layers, with the same outputs and
    gradients as layers that each get a copy of the ids (resolved per call); ids changed in place
    are resolved again; an entry leaves with its tensor."""
    attention = interpreted["attention"]
    launches = []
    resolve = attention._segment_ranges
    monkeypatch.setattr(
        attention, "_segment_ranges", lambda *args: launches.append(args[1:]) or resolve(*args)
    )
    seq = 100
    torch.manual_seed(4)
    q, k, v = (torch.randn(2, 1, seq, 16, requires_grad=True) for _ in range(3))
    slopes = torch.tensor([0.3])

    def two_layers(ids_of_layer):
        x = q
        for layer in range(2):
            x = kernels.flash_attention(
                x, k, v, alibi_slopes=slopes, segment_ids=ids_of_layer(layer)
            )
        return [x, *torch.autograd.grad(x.square().sum(), (q, k, v))]

    segment_ids = LAYOUTS["inside blocks"](seq).to(
        torch.int32
    )  # int32: what the kernels read, yet a copy is kept
    shared = two_layers(lambda layer, ids=segment_ids: ids)
    configs = ATTENTION["default"][64]
    tilings = {
        (configs.forward.block_m, configs.forward.block_n),
        (configs.backward_q.block_m, configs.backward_q.block_n),
        (configs.backward_kv.block_n, configs.backward_kv.block_m),
    }
    assert sorted(launches) == sorted(tilings), launches
    launches.clear()
    separate = two_layers(lambda layer, ids=segment_ids: ids.clone())
    assert len(launches) == 2 * len(tilings)
    for name, a, b in zip(("output", "dq", "dk", "dv"), shared, separate):
        assert torch.equal(a, b), name

    segment_ids.copy_(LAYOUTS["one and many"](seq))  # in place: the version counter moves
    out = kernels.flash_attention(q, k, v, alibi_slopes=slopes, segment_ids=segment_ids)
    expected = reference.attention(
        q.double(), k.double(), v.double(), alibi_slopes=slopes.double(), segment_ids=segment_ids
    )
    assert_close(out, expected, torch.float32, "output after the ids changed in place")
    entries = len(attention._DOCUMENT_BLOCKS)
    del segment_ids
    assert len(attention._DOCUMENT_BLOCKS) == entries - 1


@pytest.mark.parametrize("outer, inner", [(64, 32), (32, 64)])
def check_document_block_ranges_are_exact(interpreted, outer, inner):
    """For ascending segment ids, the range of blocks each block visits is exactly the blocks
    sharing a segment with it, and its unmasked run exactly those where every pair does (brute force
    over positions)."""
    seq = 300
    segment_ids = packed_documents(2, seq, [40, 170, 60, 3, 1, 90]).to(torch.int32)
    ranges = interpreted["attention"]._segment_ranges(segment_ids, outer, inner)
    for row in range(2):
        ids = segment_ids[row]
        for block in range(ranges.shape[1]):
            mine = ids[block * outer : (block + 1) * outer]
            visible, full = [], []
            for start in range(0, seq, inner):
                theirs = ids[start : start + inner]
                shared = mine[:, None] == theirs[None, :]
                if shared.any():
                    visible.append(start)
                if shared.all() and len(theirs) == inner:
                    full.append(start)
            lo, full_lo, full_hi, hi = ranges[row, block].tolist()
            assert (lo, hi) == (visible[0], visible[-1] + inner), (
                row,
                block,
                ranges[row, block],
                visible,
            )
            assert list(range(full_lo, full_hi, inner)) == full, (
                row,
                block,
                ranges[row, block],
                full,
            )


@pytest.mark.parametrize(
    "shape, dtype", [((37, 300), torch.float32), ((2, 5, 1000), torch.float16)]
)
def check_rms_norm_matches_reference(interpreted, shape, dtype):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype) * 3 + 1
    weight = torch.randn(shape[-1], dtype=dtype)
    compare_with_reference(kernels.rms_norm, reference.rms_norm, [x, weight], dtype, eps=1e-5)


@pytest.mark.parametrize(
    "shape, dtype, bias",
    [
        ((37, 300), torch.float32, True),
        ((2, 5, 1000), torch.float16, True),
        ((19, 64), torch.float32, False),
    ],
)
def check_layer_norm_matches_reference(interpreted, shape, dtype, bias):
    torch.manual_seed(0)
    x = torch.randn(shape, dtype=dtype) * 3 + 1
    weight = torch.randn(shape[-1], dtype=dtype)
    inputs = [x, weight, torch.randn(shape[-1], dtype=dtype) if bias else None]
    triton_fn = lambda x, w, *b: kernels.layer_norm(x, w, b[0] if b else None, eps=1e-5)
    reference_fn = lambda x, w, *b: reference.layer_norm(x, w, b[0] if b else None, eps=1e-5)
    compare_with_reference(triton_fn, reference_fn, [t for t in inputs if t is not None], dtype)


@pytest.mark.parametrize(
    "shape, dtype, norm",
    [
        ((37, 300), torch.float32, "layer"),
        ((2, 5, 1000), torch.float16, "rms"),
        ((19, 64), torch.float32, "layer without bias"),
        ((3, 7, 96), torch.float32, "rms"),
    ],
)
def check_add_norm_matches_reference(interpreted, shape, dtype, norm):
    """x + addend and its norm from one kernel, and both summands' gradients: the norm's plus the
    sum's own."""
    torch.manual_seed(1)
    x, addend = torch.randn(shape, dtype=dtype) * 3 + 1, torch.randn(shape, dtype=dtype)
    weight = torch.randn(shape[-1], dtype=dtype)
    if norm == "rms":
        compare_with_reference(
            kernels.add_rms_norm,
            lambda x, a, w, eps: (x + a, reference.rms_norm(x + a, w, eps)),
            [x, addend, weight],
            dtype,
            eps=1e-5,
        )
        return
    bias = [torch.randn(shape[-1], dtype=dtype)] if norm == "layer" else []
    compare_with_reference(
        lambda x, a, w, *b: kernels.add_layer_norm(x, a, w, b[0] if b else None, eps=1e-5),
        lambda x, a, w, *b: (x + a, reference.layer_norm(x + a, w, b[0] if b else None, eps=1e-5)),
        [x, addend, weight, *bias],
        dtype,
    )


@pytest.mark.parametrize("position", ["alibi", "rope", "rope-local"])
def check_block_matches_its_reference(interpreted, position):
    """A transformer block on the kernels (stacked projections, RoPE and attention, the fused
    residual addition and norm) against the same block on the references: output and the gradients
    of its input and every parameter. `rope-local`: a sliding-window layer with its own RoPE base
    and capped scores (Gemma 2 and 3's local layers)."""
    from pipeline.model.model_config import ModelConfig
    from pipeline.model.transformer import Block

    alibi = position == "alibi"
    local = (
        dict(sliding_window=24, rope_local_theta=1000.0, attention_softcap=30.0)
        if position == "rope-local"
        else {}
    )
    cfg = ModelConfig(
        hidden_size=64,
        num_layers=1,
        num_heads=4,
        num_kv_heads=4 if alibi else 2,
        ffn_size=128,
        vocab_size=256,
        position="alibi" if alibi else "rope",
        norm="layernorm" if alibi else "rmsnorm",
        activation="gelu" if alibi else "swiglu",
        bias=alibi,
        **local,
    )
    torch.manual_seed(3)
    block = Block(cfg)
    assert block.attn.window == local.get("sliding_window")
    x = torch.randn(2, 70, 64, requires_grad=True)
    segment_ids = packed_documents(2, 70, [25, 45])
    grad = torch.randn(2, 70, 64)
    results = []
    for backend in ("triton", "reference"):
        with kernels.kernel_backend(backend):
            out = block(x, segment_ids)
        results.append([out, *torch.autograd.grad(out, [x, *block.parameters()], grad)])
    names = ["output", "input gradient"] + [
        f"gradient of {name}" for name, _ in block.named_parameters()
    ]
    for name, actual, expected in zip(names, *results, strict=True):
        if name == "gradient of attn.k.bias":
            # Zero but for rounding: the key bias adds q . b to every score of a query's row, which
            # softmax ignores.
            assert actual.abs().max() < 1e-5 * results[0][1].abs().max(), f"{name}: {actual}"
        else:
            assert_close(actual, expected, torch.float32, name)


def check_kernel_outputs_free_their_graph_without_the_garbage_collector(interpreted):
    """An autograd Function that keeps its own output on `ctx` (rather than through
    save_for_backward) makes a reference cycle: the output, its graph and every saved activation
    then live until the garbage collector runs, which in training means out of memory. Each kernel's
    output must go as soon as its last reference does."""
    import gc
    import weakref

    torch.manual_seed(6)
    qkv = torch.randn(1, 40, 4 * 16, requires_grad=True)
    q, k, v = (torch.randn(1, 2, 40, 16, requires_grad=True) for _ in range(3))
    x, addend, weight = (
        torch.randn(5, 32, requires_grad=True),
        torch.randn(5, 32),
        torch.randn(32, requires_grad=True),
    )
    calls = {
        "flash_attention": lambda: kernels.flash_attention(q, k, v, alibi_slopes=torch.rand(2)),
        "stacked_flash_attention": lambda: kernels.stacked_flash_attention(qkv, 2, 16),
        "layer_norm": lambda: kernels.layer_norm(x, weight, None, 1e-5),
        "add_rms_norm": lambda: kernels.add_rms_norm(x, addend, weight, 1e-5)[1],
    }
    gc.disable()
    try:
        for name, call in calls.items():
            out = call()
            alive = weakref.ref(out)
            del out
            assert alive() is None, (
                f"{name}: its output outlives its last reference (a reference cycle)"
            )
    finally:
        gc.enable()


def check_linear_cross_entropy_matches_reference(interpreted):
    """Vocab wider than one block (1024 in the interpreter) with a ragged tail; chunks of 8 rows;
    ignored targets."""
    torch.manual_seed(0)
    hidden = torch.randn(3, 11, 48)
    weight = torch.randn(2500, 48) / 4
    targets = torch.randint(0, 2500, (3, 11))
    targets[0, :4] = -100
    targets[2, 7] = -100
    compare_with_reference(
        lambda h, w: kernels.linear_cross_entropy(h, w, targets, chunk_size=8),
        lambda h, w: reference.linear_cross_entropy(h, w, targets),
        [hidden, weight],
        torch.float32,
    )


def check_vocab_shards_compose_to_the_full_cross_entropy(interpreted):
    """Per-shard log-sum-exp and target logits, combined as a vocab-parallel all-reduce would, give
    the loss of the whole vocabulary and its gradient."""
    torch.manual_seed(0)
    logits = (torch.randn(21, 2500) * 3).requires_grad_()
    targets = torch.randint(0, 2500, (21,))
    targets[3] = -100
    bounds = [0, 700, 1800, 2500]  # unequal shards, each target in exactly one of them
    shard_lse, shard_target = zip(
        *(
            kernels.vocab_shard_statistics(logits[:, lo:hi], targets, lo)
            for lo, hi in zip(bounds, bounds[1:])
        )
    )
    lse = torch.stack(shard_lse).logsumexp(0)
    target_logit = torch.stack(shard_target).sum(0)
    valid = targets != -100
    loss = (lse - target_logit)[valid].mean()
    expected_logits = logits.detach().double().requires_grad_()
    expected = F.cross_entropy(expected_logits, targets, ignore_index=-100)
    assert_close(loss, expected, torch.float32, "loss")
    assert_close(
        torch.autograd.grad(loss, logits)[0],
        torch.autograd.grad(expected, expected_logits)[0],
        torch.float32,
        "gradient of the logits",
    )


def check_shard_statistics_in_half_precision(interpreted):
    torch.manual_seed(0)
    logits = torch.randn(9, 1500, dtype=torch.float16) * 4
    targets = torch.randint(0, 3000, (9,))  # about half of them outside this shard
    lse, target_logit = kernels.vocab_shard_statistics(logits, targets, 1000)
    expected_lse, expected_target = reference.vocab_shard_statistics(logits.double(), targets, 1000)
    assert_close(lse, expected_lse, torch.float16, "log-sum-exp")
    assert_close(target_logit, expected_target, torch.float16, "target logits")
    assert (target_logit[(targets < 1000) | (targets >= 2500)] == 0).all()
