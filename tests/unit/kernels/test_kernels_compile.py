"""Ahead-of-time compile of every launch configuration for MI250X (gfx90a) and H100 (sm90), on the
CPU machine.

Triton's own compiler builds each kernel of the tables in pipeline/kernels/launch_configs.py for
`GPUTarget("hip", "gfx90a", 64)` and `GPUTarget("cuda", 90, 32)` with bf16 tensors, and the test
reads what came out: the attention kernels must use the matrix units (`v_mfma` in the AMDGCN
assembly; `wgmma` in the PTX), no kernel may spill registers (AMDGCN metadata
`.vgpr_spill_count`/`.sgpr_spill_count`; for sm90 the ptxas that ships in the Triton wheel, run with
-v on the PTX), and on gfx90a a kernel's LDS must fit in 64 KiB. Pointers and strides are declared
16-aligned, as the launches with contiguous tensors specialise them.
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from pipeline.kernels import attention, cross_entropy, norms, rope
from pipeline.kernels.launch_configs import (
    ATTENTION,
    NORM_BACKWARD,
    ROPE_BLOCK_HEADS,
    ROPE_WARPS,
    ROWWISE,
)

TARGETS = {"sm90": GPUTarget("cuda", 90, 32), "gfx90a": GPUTarget("hip", "gfx90a", 64)}
GFX90A_LDS_BYTES = 64 * 1024
FLOAT32_POINTERS = {
    "lse_ptr",
    "delta_ptr",
    "slopes_ptr",
    "mean_ptr",
    "rstd_ptr",
    "dweight_ptr",
    "dbias_ptr",
    "target_logit_ptr",
    "grad_lse_ptr",
    "grad_target_ptr",
}
INT_POINTERS = {"seg_ptr": "*i32", "ranges_ptr": "*i32", "targets_ptr": "*i64"}
FLOAT_SCALARS = {"qk_scale", "sm_scale", "softcap2", "eps"}
PTXAS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "ptxas"


def signature(kernel, constexprs: dict, divisible: frozenset = frozenset()) -> tuple[dict, dict]:
    """Triton types of the kernel's arguments by naming convention, and the 16-alignment hints
    (pointers, strides and the integer arguments named in `divisible`)."""
    types, hints = {}, {}
    for index, param in enumerate(kernel.params):
        name = param.name
        if name in constexprs:
            types[name] = "constexpr"
        elif name.endswith("_ptr"):
            types[name] = "*fp32" if name in FLOAT32_POINTERS else INT_POINTERS.get(name, "*bf16")
            hints[(index,)] = [["tt.divisibility", 16]]
        elif name in FLOAT_SCALARS:
            types[name] = "fp32"
        else:
            types[name] = "i32"
            if name.startswith("stride") or name in divisible:
                hints[(index,)] = [["tt.divisibility", 16]]
    return types, hints


@dataclass
class Build:
    matrix_instructions: int
    spilled: int
    lds_bytes: int


def build(
    kernel,
    constexprs: dict,
    arch: str,
    options: dict,
    tmp_path: Path,
    divisible: frozenset = frozenset(),
) -> Build:
    types, hints = signature(kernel, constexprs, divisible)
    compiled = triton.compile(
        ASTSource(kernel, types, constexprs, hints), target=TARGETS[arch], options=options
    )
    if arch == "gfx90a":
        asm = compiled.asm["amdgcn"]
        spills = [int(n) for n in re.findall(r"\.(?:vgpr|sgpr)_spill_count:\s*(\d+)", asm)]
        assert spills, "no spill counts in the AMDGCN metadata"
        return Build(asm.count("v_mfma"), sum(spills), compiled.metadata.shared)
    ptx = compiled.asm["ptx"]
    ptx_file = tmp_path / f"{kernel.__name__}.ptx"
    ptx_file.write_text(ptx)
    report = subprocess.run(
        [str(PTXAS), "-arch=sm_90a", "-v", str(ptx_file), "-o", os.devnull],
        capture_output=True,
        text=True,
        check=True,
    ).stderr
    spills = [int(n) for n in re.findall(r"(\d+) bytes spill (?:stores|loads)", report)]
    assert spills, f"no spill report from ptxas -v:\n{report}"
    return Build(
        ptx.count("wgmma.mma_async") + ptx.count("mma.sync"), sum(spills), compiled.metadata.shared
    )


def check(result: Build, arch: str, uses_matrix_units: bool, what: str) -> None:
    assert result.spilled == 0, f"{what} on {arch}: {result.spilled} spilled (registers or bytes)"
    if uses_matrix_units:
        unit = "v_mfma" if arch == "gfx90a" else "wgmma/mma"
        assert result.matrix_instructions > 0, f"{what} on {arch}: no {unit} instruction"
    if arch == "gfx90a":
        assert result.lds_bytes <= GFX90A_LDS_BYTES, (
            f"{what} on gfx90a: {result.lds_bytes} bytes of LDS > 64 KiB"
        )


# The causal specialisations that models run: ALiBi (BLOOM; what the benchmarks run), a sliding
# window (Mistral, Gemma 3's local layers), the soft cap (Gemma 2's global layers) and both (its
# local ones). RoPE models run the kernels without ALiBi, which needs fewer registers than any of
# these.
VARIANTS = {
    "alibi": dict(HAS_ALIBI=True, WINDOW=False, SOFTCAP=False),
    "window": dict(HAS_ALIBI=False, WINDOW=True, SOFTCAP=False),
    "softcap": dict(HAS_ALIBI=False, WINDOW=False, SOFTCAP=True),
    "window+softcap": dict(HAS_ALIBI=False, WINDOW=True, SOFTCAP=True),
}
# ALiBi at every head dim, dense and packed; the newer variants where registers are scarcest, at the
# largest head dim, each with and without documents (the suite's time: a case compiles in seconds).
ATTENTION_CASES = [
    (arch, head_dim, documents, variant)
    for arch in TARGETS
    for head_dim in ATTENTION[arch]
    for documents in (False, True)
    for variant in VARIANTS
    if variant == "alibi" or head_dim == max(ATTENTION[arch])
]


@pytest.mark.parametrize("arch, head_dim, documents, variant", ATTENTION_CASES)
def test_attention_configs_compile_to_matrix_instructions_without_spills(
    arch, head_dim, documents, variant, tmp_path
):
    """Causal attention in each variant, dense and with document masks (segment ids)."""
    flags = dict(
        BLOCK_D=head_dim,
        CAUSAL=True,
        HAS_SEGMENTS=documents,
        CHECK_SEQ=False,
        CHECK_D=False,
        **VARIANTS[variant],
    )
    configs = ATTENTION[arch][head_dim].specialised(documents, flags["WINDOW"], flags["SOFTCAP"])
    kernels = {
        "forward": attention._attention_forward,
        "backward_kv": attention._attention_backward_kv,
        "backward_q": attention._attention_backward_q,
    }
    for name, kernel in kernels.items():
        config = getattr(configs, name)
        queries_outer = name != "backward_kv"
        outer, inner = (
            (config.block_m, config.block_n) if queries_outer else (config.block_n, config.block_m)
        )
        assert outer % inner == 0, (
            f"{arch} D={head_dim} {name}: causal blocks need {outer} divisible by {inner}"
        )
        # dK/dV loops over the query heads of its key head: built for several (GQA) and for one,
        # which Triton compiles apart (an integer argument equal to 1 is specialised at launch).
        for group in ({}, {"group": 1}) if name == "backward_kv" else ({},):
            result = build(
                kernel,
                {**flags, **group, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n},
                arch,
                config.launch_options(arch),
                tmp_path,
            )
            heads = "one query head per key head" if group else "grouped query heads"
            what = (
                f"attention {name} ({variant}) D={head_dim}"
                f"{' with documents' if documents else ''}, {heads}, {config}"
            )
            check(result, arch, True, what)


@pytest.mark.parametrize("arch", TARGETS)
def test_rowwise_kernels_compile_without_spills(arch, tmp_path):
    config = ROWWISE[arch]
    options = config.launch_options(arch)
    norm_backward = NORM_BACKWARD[arch]
    # The norms' hidden size is a multiple of 16 in real models, and Triton specialises such an
    # argument at launch (16-byte vector loads); other sizes run with element-wise masks.
    hidden = frozenset({"n_cols"})
    builds = {
        "segment block ranges": (
            attention._segment_block_ranges,
            dict(OUTER=128, INNER=64, CHUNK=1024),
            dict(options, num_warps=4),
            frozenset(),
        ),
        "norm forward": (
            norms._norm_forward,
            dict(BLOCK=8192, RMS=False, HAS_BIAS=True, HAS_ADDEND=False),
            options,
            hidden,
        ),
        "residual addition and norm forward": (
            norms._norm_forward,
            dict(BLOCK=8192, RMS=False, HAS_BIAS=True, HAS_ADDEND=True),
            options,
            hidden,
        ),
        "cross-entropy statistics": (
            cross_entropy._row_statistics,
            dict(BLOCK=config.block_n),
            options,
            frozenset(),
        ),
        "cross-entropy gradient": (
            cross_entropy._softmax_gradient,
            dict(BLOCK=config.block_n),
            options,
            frozenset(),
        ),
    }
    for head_dim in (64, 128):
        for transpose in (False, True):
            builds[
                f"RoPE on stacked q, k, v, head_dim {head_dim}{', backward' if transpose else ''}"
            ] = (
                rope._rotate_stacked,
                dict(
                    HALF=head_dim // 2,
                    BLOCK_HALF=head_dim // 2,
                    BLOCK_HEADS=ROPE_BLOCK_HEADS,
                    TRANSPOSE=transpose,
                ),
                dict(options, num_warps=ROPE_WARPS),
                frozenset(),
            )
    for block in (4096, 8192):
        for addend in (False, True):
            builds[f"norm backward {block}{' with an addend' if addend else ''}"] = (
                norms._norm_backward,
                dict(BLOCK=block, RMS=False, HAS_BIAS=True, HAS_ADDEND=addend),
                dict(options, num_warps=norm_backward.num_warps(block)),
                hidden,
            )
    for name, (kernel, constexprs, kernel_options, divisible) in builds.items():
        check(
            build(kernel, constexprs, arch, kernel_options, tmp_path, divisible), arch, False, name
        )
