"""Stage `pack`: the mix plan's sources tokenized once into memory-mapped shards, and the exact
plan.

Tokenizes each source the plan reads with the tokenizer stage's `tokenizer.json`
(pipeline/packing/pack_plan.py: one shard per input file in datatrove's format, each batch of
`pack.batch_size` documents encoded on `workers` threads), every document ending with EOS. The exact token counts then replace the mix
stage's estimates in the same planner (pipeline/mixing/planner.py): epochs, shares and, with
rehydration, the per-document weights are derived again. A source the estimated plan gave no tokens
is tokenized only if the exact plan gives it some. Repetition is an index, never a copy:
`repeats.npy` says how many times each document is read per pass (pipeline/packing/packed.py), so
the packed size is the unique tokens x 2 (or 4) bytes whatever the epochs. `packed.json` records the
exact plan next to the estimates and is what `pipeline.packing.sampler.PackedSampler` reads.
"""

from __future__ import annotations

from pipeline.contract import Stage, StageRun
from pipeline.packing.pack_plan import pack_plan
from pipeline.stage_outputs import MixOutput, TokenizerOutput
from pipeline.tokenization.workers import use_threads


def run_pack(run: StageRun) -> dict:
    use_threads(run.cfg.workers)
    mix, tokenizer = run.output(MixOutput), run.output(TokenizerOutput)
    plan_document = run.read_input(mix.plan)
    eos = run.read_input(tokenizer.special_tokens)["eos_token"]
    loaded = run.read_input(tokenizer.tokenizer)
    return pack_plan(
        run.work_dir,
        plan_document,
        run.input_file(tokenizer.tokenizer),
        loaded,
        eos,
        run.lang,
        run.cfg.pack,
        run.cfg.work_dir,
    )


STAGE = Stage(
    name="pack",
    run=run_pack,
    needs=("mix", "tokenizer"),
    config_sections=("pack",),
    # Documents per tokenizer call change the speed, not the shards.
    unhashed_keys=("pack.batch_size",),
)
