"""Launch configurations of every Triton kernel, one explicit table per GPU architecture.

No autotuning: the configurations are fixed, so that the ahead-of-time compile test
(tests/unit/kernels/test_kernels_compile.py) can build every one of them for gfx90a and sm90 on a
CPU machine and check that it uses the matrix units and does not spill, and so that a run's speed
does not depend on a tuning pass. Architectures:

- `sm90` (H100/H200): 228 KiB of shared memory per SM, wgmma on 4-warp warpgroups. Triton 3.6
  software pipelines the K/V loads `num_stages` deep (cp.async/TMA), so large tiles with 3-4 stages
  pay off.
- `gfx90a` (MI250X GCD): wavefront 64 (a "warp" is 64 lanes, so 4 warps = 256 threads), 64 KiB LDS
  per CU, MFMA 32x32x8 / 16x16x16 for bf16. Triton's AMD stream pipeliner double-buffers in LDS with
  num_stages=2, so tiles must fit twice in 64 KiB; `waves_per_eu` caps registers per wave so that
  that many waves share a SIMD and hide memory latency (512 VGPRs per SIMD lane / waves);
  `matrix_instr_nonkdim` picks the MFMA shape (16: 16x16 tiles, fewer registers for the accumulators
  than 32x32). `kpack` only matters on gfx942 (it is ignored and deprecated elsewhere), so it stays
  at 1.
- `default`: any other GPU (A100, MI300 until tuned) and the CPU interpreter: moderate tiles that
  fit everywhere.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field, replace
from typing import Optional

import torch


@dataclass(frozen=True)
class KernelConfig:
    """Tile sizes and launch options of one kernel. For attention, block_m tiles queries and block_n
    keys; for row-wise kernels (norms, cross-entropy) block_n is the column chunk and block_m is
    unused (1)."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int
    waves_per_eu: int = 0  # AMD only: 0 lets the compiler choose
    matrix_instr_nonkdim: int = 0  # AMD only: MFMA tile (16 or 32); 0 lets the compiler choose

    def launch_options(self, arch: str) -> dict:
        """Keyword arguments of a Triton launch (or of triton.compile's options) for `arch`."""
        options = {"num_warps": self.num_warps, "num_stages": self.num_stages}
        if arch.startswith("gfx"):
            options.update(
                waves_per_eu=self.waves_per_eu, matrix_instr_nonkdim=self.matrix_instr_nonkdim
            )
        return options


@dataclass(frozen=True)
class AttentionConfigs:
    forward: KernelConfig
    backward_kv: (
        KernelConfig  # one program per key block: block_n keys, loops over block_m-query blocks
    )
    backward_q: (
        KernelConfig  # one program per query block: block_m queries, loops over block_n-key blocks
    )
    # With document masks (segment ids) the kernels are another specialisation with more live
    # registers; where the dense tiles would spill there, `documents` holds the ones to use instead.
    documents: Optional[AttentionConfigs] = None
    # A sliding window and the soft cap (Gemma 2's tanh) are specialisations too, with more masks,
    # scalars or arithmetic; where a kernel's tiles would spill there, `variants` holds the ones to
    # use instead: variant ("window", "softcap" or "window+softcap") -> kernel -> configuration.
    variants: dict[str, dict[str, KernelConfig]] = field(default_factory=dict)

    def specialised(
        self, has_segments: bool, window: bool = False, softcap: bool = False
    ) -> AttentionConfigs:
        """The configurations of the dense or the document-mask specialisation, with or without a
        sliding window and the soft cap."""
        configs = self.documents if has_segments and self.documents is not None else self
        variant = "+".join(name for name, on in (("window", window), ("softcap", softcap)) if on)
        overrides = configs.variants.get(variant)
        return replace(configs, **overrides, variants={}) if overrides else configs


# gfx90a's forward where the soft cap or a sliding window would spill with 128 x 64 tiles (see the
# table), by number of stages.
_GFX90A_NARROW_FORWARD = {
    stages: KernelConfig(128, 32, 8, stages, waves_per_eu=2, matrix_instr_nonkdim=16)
    for stages in (1, 2)
}

# Keyed by architecture, then by the padded head dim (64: head dims up to 64; 128: 65..128, so 80
# and 96 run in 128-wide tiles with the extra columns masked).
ATTENTION: dict[str, dict[int, AttentionConfigs]] = {
    "sm90": {
        # Forward: 128 queries x 64 keys with 8 warps (two warpgroups, wgmma on 64 rows each), K/V
        # loads pipelined 4 deep (160 KiB of shared memory): the fastest dense candidate that
        # bench/attention_configs.py timed on an H100; 128x128 tiles spill at D=128. On packed rows
        # (document masks) a program's key range is short, and 64 x 64 tiles with one warpgroup and
        # 2 stages (two programs per SM) ran 1.32x the 128 x 64 ones; the same holds for dQ there
        # (+8%). Backward dK/dV: the program keeps its keys' K and V tiles in shared memory (wgmma
        # operands) and the dK/dV accumulators (fp32) in registers while query blocks stream by: 64
        # keys x 32-query steps with one warpgroup and 3 stages, which replaced 128 keys x 16
        # queries with 8 warps (2026-11-26, H100; figures in docs/benchmark-log.md); the same on
        # packed rows, where its one masked loop leaves the registers for the third stage (1.06x
        # forward+backward against 2 stages, 2026-11-27). dQ: 128 queries, 64-key blocks. Every
        # entry compiles without spills, with one query head per key head and with several
        # (tests/unit/kernels/test_kernels_compile.py). A sliding window with the soft cap on
        # packed rows (Gemma 2's local layers) leaves dK/dV the registers for 2 stages only (3
        # spilled 8 bytes at D=128, 24 at D=64; not timed against them).
        128: AttentionConfigs(
            forward=KernelConfig(128, 64, 8, 4),
            backward_kv=KernelConfig(32, 64, 4, 3),
            backward_q=KernelConfig(128, 64, 8, 3),
            documents=AttentionConfigs(
                forward=KernelConfig(64, 64, 4, 2),
                backward_kv=KernelConfig(32, 64, 4, 3),
                backward_q=KernelConfig(64, 64, 4, 2),
                variants={"window+softcap": {"backward_kv": KernelConfig(32, 64, 4, 2)}},
            ),
        ),
        # D=64 halves every tile: 4 warps suffice for the forward's 128x64 tiles (3 stages; on
        # packed rows 64 x 32 with 2 stages, +19%), dK/dV 64 keys x 64 queries with one warpgroup
        # and 3 stages (packed rows too), dQ 64 queries x 32 keys with 4 stages.
        64: AttentionConfigs(
            forward=KernelConfig(128, 64, 4, 3),
            backward_kv=KernelConfig(64, 64, 4, 3),
            backward_q=KernelConfig(64, 32, 4, 4),
            documents=AttentionConfigs(
                forward=KernelConfig(64, 32, 4, 2),
                backward_kv=KernelConfig(64, 64, 4, 3),
                backward_q=KernelConfig(64, 32, 4, 4),
                variants={"window+softcap": {"backward_kv": KernelConfig(64, 64, 4, 2)}},
            ),
        ),
    },
    "gfx90a": {
        # Forward: 128x64 tiles with 4 wavefronts (256 lanes) and waves_per_eu=2 (at most 256 VGPRs
        # per lane, two waves per SIMD to hide memory latency): 252 VGPRs, no spills, 32 KiB of LDS.
        # MFMA 16x16 (nonkdim 16) needs fewer accumulator registers than 32x32. One stage: the K/V
        # tiles are read straight into registers; a second LDS stage spills at D=128. Backward: the
        # dK/dV program holds K, V, dK, dV of 64 keys (wider spills); waves_per_eu=1 lets it use the
        # accumulation registers (AGPRs) too. dQ: 64 queries x 32 keys. With document masks the
        # forward's 128x64 tiles spill a few VGPRs with 4 wavefronts (the element-wise segment
        # compare); 8 wavefronts halve each lane's share and compile clean. The soft cap's tanh
        # spills the dense forward's VGPRs (17 at D=128), and a sliding window on packed rows its
        # scalar registers (7-8 SGPRs with 64-key tiles; 32-key ones need 75 of the 102): there
        # the forward takes 128 x 32 tiles with 8 wavefronts, clean in every variant (chosen by
        # the compiler's report; not timed).
        128: AttentionConfigs(
            forward=KernelConfig(128, 64, 4, 1, waves_per_eu=2, matrix_instr_nonkdim=16),
            backward_kv=KernelConfig(32, 64, 4, 1, waves_per_eu=1, matrix_instr_nonkdim=16),
            backward_q=KernelConfig(64, 32, 4, 1, waves_per_eu=1, matrix_instr_nonkdim=16),
            documents=AttentionConfigs(
                forward=KernelConfig(128, 64, 8, 1, waves_per_eu=2, matrix_instr_nonkdim=16),
                backward_kv=KernelConfig(32, 64, 4, 1, waves_per_eu=1, matrix_instr_nonkdim=16),
                backward_q=KernelConfig(64, 32, 4, 1, waves_per_eu=1, matrix_instr_nonkdim=16),
                variants={
                    variant: {"forward": _GFX90A_NARROW_FORWARD[1]}
                    for variant in ("window", "window+softcap")
                },
            ),
            variants={
                variant: {"forward": _GFX90A_NARROW_FORWARD[1]}
                for variant in ("softcap", "window+softcap")
            },
        ),
        # D=64: tiles are half as large, so the forward double-buffers K/V in LDS (num_stages=2, 16
        # KiB) and every kernel keeps two waves per SIMD. dK/dV takes 32-query steps (64 spilled 15
        # registers once its loop over a group's heads was flattened); with document masks the
        # forward is as at D=128, and so is its sliding window on packed rows (2 stages).
        # Not timed on an MI250X: chosen by the compiler's report alone.
        64: AttentionConfigs(
            forward=KernelConfig(128, 64, 4, 2, waves_per_eu=2, matrix_instr_nonkdim=16),
            backward_kv=KernelConfig(32, 64, 4, 1, waves_per_eu=2, matrix_instr_nonkdim=16),
            backward_q=KernelConfig(64, 64, 4, 1, waves_per_eu=2, matrix_instr_nonkdim=16),
            documents=AttentionConfigs(
                forward=KernelConfig(128, 64, 8, 2, waves_per_eu=2, matrix_instr_nonkdim=16),
                backward_kv=KernelConfig(32, 64, 4, 1, waves_per_eu=2, matrix_instr_nonkdim=16),
                backward_q=KernelConfig(64, 64, 4, 1, waves_per_eu=2, matrix_instr_nonkdim=16),
                variants={
                    variant: {"forward": _GFX90A_NARROW_FORWARD[2]}
                    for variant in ("window", "window+softcap")
                },
            ),
        ),
    },
    "default": {
        128: AttentionConfigs(
            forward=KernelConfig(64, 64, 4, 2),
            backward_kv=KernelConfig(32, 64, 4, 2),
            backward_q=KernelConfig(64, 32, 4, 2),
        ),
        64: AttentionConfigs(
            forward=KernelConfig(64, 64, 4, 2),
            backward_kv=KernelConfig(32, 64, 4, 2),
            backward_q=KernelConfig(64, 32, 4, 2),
        ),
    },
}

# Row-wise kernels (norms, cross-entropy): one program per row, block_n columns per step. 8 warps
# (sm90: 256 threads; gfx90a: 512 lanes) stream a 4096-8192 wide row in one or two passes.
ROWWISE: dict[str, KernelConfig] = {
    "sm90": KernelConfig(1, 4096, 8, 1),
    "gfx90a": KernelConfig(1, 4096, 8, 1, waves_per_eu=0),
    "default": KernelConfig(1, 1024, 4, 1),
}


# RoPE on stacked q, k, v (rope.py): one program per token and ROPE_BLOCK_HEADS heads, a (heads,
# head_dim / 2) tile of pairs, the same on every architecture: an element-wise pass whose 8 x 64
# tile gives each of 4 warps' lanes 4 pairs on sm90 and 2 on gfx90a.
ROPE_BLOCK_HEADS = 8
ROPE_WARPS = 4


@dataclass(frozen=True)
class NormBackwardConfig:
    """The norm backward holds its row in registers, `lane_elements` per lane, so its warps grow
    with the hidden size; `programs_per_sm` programs per multiprocessor each sum the weight gradient
    of a chunk of rows."""

    lane_elements: int
    programs_per_sm: int
    warp_size: int  # lanes per warp: 32 on NVIDIA, 64 on AMD (a wavefront)
    max_warps: int  # 1024 lanes per program

    def num_warps(self, block: int) -> int:
        return max(4, min(self.max_warps, block // (self.warp_size * self.lane_elements)))


# 16 elements per lane: sm90 gives the LayerNorm backward 128 registers at hidden 4096 (8 warps, two
# programs per SM) and 8192 (16 warps), none spilled; 8 per lane would need 32 warps at 8192, capped
# at 64 registers, and spill.
NORM_BACKWARD: dict[str, NormBackwardConfig] = {
    "sm90": NormBackwardConfig(lane_elements=16, programs_per_sm=2, warp_size=32, max_warps=32),
    "gfx90a": NormBackwardConfig(lane_elements=16, programs_per_sm=2, warp_size=64, max_warps=16),
    "default": NormBackwardConfig(lane_elements=16, programs_per_sm=2, warp_size=32, max_warps=32),
}


def current_arch(device: torch.device | None = None) -> str:
    """`sm90`, `gfx90a` or `default` for the device that a kernel is about to run on."""
    if device is None or device.type != "cuda" or not torch.cuda.is_available():
        return "default"  # the interpreter on CPU
    return _arch_of(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _arch_of(index: int) -> str:
    """Asked once per GPU: every kernel launch looks its table up, and reading the device's
    properties each time cost a small model's training a visible share of its host time."""
    if torch.version.hip:
        name = torch.cuda.get_device_properties(index).gcnArchName.split(":")[0]
        return name if name in ATTENTION else "default"
    major, minor = torch.cuda.get_device_capability(index)
    arch = f"sm{major}{minor}"
    return arch if arch in ATTENTION else "default"


def attention_configs(
    arch: str,
    head_dim: int,
    has_segments: bool = False,
    window: bool = False,
    softcap: bool = False,
) -> AttentionConfigs:
    return ATTENTION[arch][64 if head_dim <= 64 else 128].specialised(has_segments, window, softcap)
