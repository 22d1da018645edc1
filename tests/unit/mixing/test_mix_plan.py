"""The mix stage's pure parts: the scaling law, the filling order, caps, ratios, rehydration, config
checks."""

from __future__ import annotations

import math

import pytest

from pipeline.corpus.report import bytes_text, tokens_text
from pipeline.errors import ConfigError
from pipeline.mixing.mix_config import (
    MixConfig,
    MixSource,
    RehydrationConfig,
    RehydrationRow,
    validate_mix,
)
from pipeline.mixing.planner import (
    FILLER,
    FIXED_RATIO,
    R_STAR,
    TARGET,
    PlanError,
    Source,
    default_budget,
    effective_tokens,
    epoch_values,
    exact_plan,
    plan_mixture,
)
from pipeline.mixing.rehydration import rehydrate, weight_for
from pipeline.mixing.report import plan_document, plan_verdict, verdict

FINEWEB2_TABLE = [(1, 1.0), (2, 2.0), (3, 3.0), (5, 5.0), (100, 8.0)]


def by_hand(unique: float, epochs: float) -> float:
    """D' = U + U*R*(1 - exp(-R/R*)), R = epochs - 1, written out again for the test."""
    r = epochs - 1
    return unique + unique * 15.39 * (1 - math.exp(-r / 15.39))


# -- the scaling law -------------------------------------------------------------------------------


def test_effective_tokens_match_the_formula():
    assert R_STAR == 15.39
    for epochs in (1.5, 2, 4, 7.25, 16, 40):
        assert effective_tokens(1_000_000, epochs) == pytest.approx(
            by_hand(1_000_000, epochs), rel=1e-12
        )
    # typed out by hand: 1 + 15.39 * (1 - e^(-3/15.39)) and 1 + 15.39 * (1 - e^(-1/15.39))
    assert effective_tokens(1.0, 4) == pytest.approx(3.725711, abs=1e-6)
    assert effective_tokens(1.0, 2) == pytest.approx(1.968204, abs=1e-6)
    assert effective_tokens(1.0, 4) / 4 == pytest.approx(0.9314, abs=1e-4)  # "effective 93%"


def test_up_to_one_epoch_nothing_repeats():
    assert effective_tokens(1000, 1) == 1000
    assert effective_tokens(1000, 0.25) == 250
    assert effective_tokens(1000, 0) == 0


def test_repetition_has_diminishing_returns_and_a_ceiling():
    values = [effective_tokens(1.0, e) for e in range(1, 60)]
    assert all(b > a for a, b in zip(values, values[1:]))
    assert values[-1] < 1 + R_STAR


def test_each_epoch_is_worth_less_than_the_one_before():
    values = epoch_values(4)
    assert values == pytest.approx([1.0, 0.968204, 0.907293, 0.850214], abs=1e-6)
    assert sum(values) == pytest.approx(effective_tokens(1.0, 4))
    assert all(b / a == pytest.approx(math.exp(-1 / 15.39)) for a, b in zip(values[1:], values[2:]))
    # a last partial epoch is valued per token of that part
    partial = epoch_values(4.5)
    assert len(partial) == 5
    assert sum(partial[:4]) + 0.5 * partial[4] == pytest.approx(effective_tokens(1.0, 4.5))
    assert epoch_values(0.5) == [1.0]


# -- filling the budget ----------------------------------------------------------------------------


def test_target_to_its_cap_then_fillers_by_priority_each_within_its_cap():
    target = Source("nob", unique_tokens=100, max_epochs=4)
    eng = Source("eng", unique_tokens=1000, max_epochs=1, priority=2)
    nno = Source("nno", unique_tokens=50, max_epochs=4, priority=1)
    dan = Source("dan", unique_tokens=30, max_epochs=2, priority=1)
    plan = plan_mixture(1000, target, [eng, nno, dan])

    got = [(a.source.name, a.role, a.tokens) for a in plan.allocations]
    # priority 1 before 2; equal priorities in the configured order (nno before dan)
    assert got == [
        ("nob", TARGET, 400),
        ("nno", FILLER, 200),
        ("dan", FILLER, 60),
        ("eng", FILLER, 340),
    ]
    assert [a.epochs for a in plan.allocations] == [4, 4, 2, 0.34]
    assert [a.at_cap for a in plan.allocations] == [True, True, True, False]
    assert plan.budget_met and plan.shortfall == 0 and plan.planned_tokens == 1000
    assert [plan.share(a) for a in plan.allocations] == [0.4, 0.2, 0.06, 0.34]
    assert plan.effective_tokens == pytest.approx(
        by_hand(100, 4) + by_hand(50, 4) + by_hand(30, 2) + 340
    )


def test_fillers_not_needed_get_nothing():
    plan = plan_mixture(300, Source("nob", 100, 4), [Source("eng", 1000, 4, priority=2)])
    target, eng = plan.allocations
    assert (target.tokens, target.epochs, eng.tokens) == (300, 3, 0)
    assert verdict(eng) == "eng: not needed, the budget is met before it"


def test_budget_beyond_every_cap_reports_the_shortfall_and_the_best_achievable():
    plan = plan_mixture(1000, Source("nob", 100, 4), [Source("eng", 100, 2, priority=2)])
    assert [a.tokens for a in plan.allocations] == [400, 200]
    assert not plan.budget_met and plan.shortfall == 400 and plan.planned_tokens == 600
    text = plan_verdict(plan)
    assert text.startswith("Budget NOT met")
    assert "600 of 1k tokens (60%), 400 short; the best achievable is 600 tokens" in text
    assert plan.sampling_weight(plan.allocations[0]) == pytest.approx(400 / 600)


def test_no_filler_and_a_raised_cap_shows_the_value_of_each_extra_epoch():
    capped = plan_mixture(1000, Source("nob", 100, 4), [])
    assert capped.allocations[0].epochs == 4 and capped.shortfall == 600
    assert verdict(capped.allocations[0]) == (
        "nob repeated 4.0x: effective 93% of unique-equivalent; epoch 4 is worth 85% of new data "
        "(at its 4-epoch cap)"
    )
    raised = plan_mixture(1000, Source("nob", 100, 10), [])
    assert raised.budget_met and raised.allocations[0].epochs == 10
    assert raised.effective_tokens == pytest.approx(by_hand(100, 10))
    assert verdict(raised.allocations[0]).endswith(
        "epoch 10 is worth 58% of new data (at its 10-epoch cap)"
    )


def test_fixed_ratios_come_first_even_before_the_target():
    code = Source("code", unique_tokens=500, max_epochs=1, priority=3, ratio=0.1)
    plan = plan_mixture(1000, Source("nob", 100, 4), [Source("eng", 10_000, 1, priority=2), code])
    assert [(a.source.name, a.role, a.tokens) for a in plan.allocations] == [
        ("nob", TARGET, 400),
        ("code", FIXED_RATIO, 100),
        ("eng", FILLER, 500),
    ]
    # a large fixed share leaves the target less than its cap
    big = plan_mixture(1000, Source("nob", 100, 4), [Source("code", 1000, 1, ratio=0.7)])
    assert [a.tokens for a in big.allocations] == [300, 700] and big.allocations[0].epochs == 3
    assert verdict(big.allocations[1]) == (
        "code: fixed ratio 0.7; 70% of its unique tokens, each seen once: effective 100%"
    )


def test_a_fixed_ratio_beyond_its_cap_fails_and_says_what_fits():
    with pytest.raises(
        PlanError,
        match=r"`code` cannot give its fixed ratio 0.1 .* Lower its ratio to at most 0.05, "
        r"raise its max_epochs to at least 2,",
    ):
        plan_mixture(1000, Source("nob", 100, 4), [Source("code", 50, 1, ratio=0.1)])


def test_default_budget_is_the_target_at_its_cap_plus_the_fixed_ratios():
    target = Source("nob", 100, 4)
    assert default_budget(target, []) == 400
    others = [Source("code", 1000, 1, ratio=0.2), Source("eng", 1000, 1, priority=2)]
    budget = default_budget(target, others)
    assert budget == 500
    plan = plan_mixture(budget, target, others)
    assert [a.tokens for a in plan.allocations] == [400, 100, 0]
    # uneven numbers: the target still ends exactly at its cap, with nothing left over for the
    # fillers
    target = Source("nob", 656_758, 4)
    for ratios in ([0.1], [0.07, 0.13], [0.333, 0.111, 0.05]):
        others = [Source(f"s{i}", 10**9, 1, ratio=r) for i, r in enumerate(ratios)] + [
            Source("eng", 10**9, 1)
        ]
        plan = plan_mixture(default_budget(target, others), target, others)
        assert plan.allocations[0].tokens == target.capacity and plan.allocations[-1].tokens == 0
        assert [a.tokens for a in plan.allocations[1:-1]] == [
            math.floor(r * plan.budget) for r in ratios
        ]


def test_an_optional_source_too_small_for_its_ratio_gives_its_cap_and_the_target_stays_at_its_cap():
    # the base language's replay at 25% when the raw folder holds little of it: 4 epochs of 10
    # tokens
    target, replay = Source("nob", 1000, 4), Source("eng", 10, 4, ratio=0.25, optional=True)
    budget = default_budget(target, [replay])
    plan = plan_mixture(budget, target, [replay])
    assert (budget, [a.tokens for a in plan.allocations]) == (4040, [4000, 40]) and plan.budget_met
    # with enough of it, the ratio holds
    plan = plan_mixture(
        default_budget(target, [Source("eng", 10**6, 4, ratio=0.25, optional=True)]),
        target,
        [Source("eng", 10**6, 4, ratio=0.25, optional=True)],
    )
    assert [a.tokens for a in plan.allocations] == [4000, 1333] and plan.budget == 5333
    with pytest.raises(PlanError, match="cannot give its fixed ratio 0.25"):
        plan_mixture(
            4040, target, [Source("eng", 10, 4, ratio=0.25)]
        )  # a required one fails instead


def test_pack_replans_plan_json_with_an_optional_source_at_its_cap():
    """plan.json keeps each source's `optional`: pack's exact plan of a replay capped below its
    ratio is the mix's."""
    target, replay = Source("nob", 1000, 4), Source("eng", 10, 4, ratio=0.25, optional=True)
    plan = plan_mixture(default_budget(target, [replay]), target, [replay])
    facts = {"nob": {}, "eng": {}}
    document = plan_document("nob", plan, facts, "mix.tokens not set", [], {})
    again = exact_plan(document, {"nob": 1000, "eng": 10})
    assert (
        [a.tokens for a in again.allocations] == [a.tokens for a in plan.allocations] == [4000, 40]
    )


def test_tokens_are_shown_with_three_digits_and_a_unit():
    assert [tokens_text(n) for n in (999, 1000, 656_758, 2_627_032, 260e9)] == [
        "999",
        "1k",
        "657k",
        "2.63M",
        "260B",
    ]
    assert [bytes_text(n) for n in (999, 2_627_032, 1e9)] == ["999 B", "2.63 MB", "1 GB"]


# -- rehydration -----------------------------------------------------------------------------------


def test_rehydration_weights_follow_the_fineweb2_table():
    sizes = [1, 2, 3, 4, 5, 99, 100, 250]
    assert [weight_for(size, FINEWEB2_TABLE) for size in sizes] == [1, 2, 3, 3, 5, 5, 8, 8]


def test_rehydration_keeps_the_epoch_cap_on_average():
    # one document of 100 bytes per cluster size
    sizes = {size: (1, 100) for size in (1, 2, 3, 4, 5, 99, 100, 250)}
    result = rehydrate(sizes, FINEWEB2_TABLE, epochs=4)
    assert result.mean_weight == pytest.approx(35 / 8)
    assert result.scale == pytest.approx(4 / (35 / 8))
    assert [(b.label, b.docs, b.bytes, b.weight) for b in result.buckets] == [
        ("1", 1, 100, 1),
        ("2", 1, 100, 2),
        ("3-4", 2, 200, 3),
        ("5-99", 2, 200, 5),
        ("100+", 2, 200, 8),
    ]
    assert [b.epochs for b in result.buckets] == pytest.approx(
        [w * 32 / 35 for w in (1, 2, 3, 5, 8)]
    )
    assert result.mean_epochs == pytest.approx(4)


def test_rehydration_averages_over_bytes_not_documents():
    # 900 bytes of unique text and 100 bytes from a 2-document cluster: mean weight 1.1
    result = rehydrate({1: (9, 900), 2: (1, 100)}, FINEWEB2_TABLE, epochs=2.2)
    assert result.mean_weight == pytest.approx(1.1)
    assert [b.epochs for b in result.buckets[:2]] == pytest.approx([2.0, 4.0])
    assert result.mean_epochs == pytest.approx(2.2)
    assert result.effective_tokens(bytes_per_token=1) == pytest.approx(
        by_hand(900, 2) + by_hand(100, 4)
    )


# -- configuration checks --------------------------------------------------------------------------


def _mix(**changes) -> MixConfig:
    sources = changes.pop("sources", [MixSource(name="eng", path="work/eng/clean", priority=2)])
    return MixConfig(sources=sources, **changes)


def _table(*rows: tuple[int, float]) -> RehydrationConfig:
    return RehydrationConfig(weights=[RehydrationRow(size, weight) for size, weight in rows])


@pytest.mark.parametrize(
    "mix, key",
    [
        (_mix(tokens=-5.0), "mix.tokens"),
        (_mix(tokens=0.0), "mix.tokens"),
        (_mix(max_epochs=0.0), "mix.max_epochs"),
        (
            _mix(sources=[MixSource(name="code", path="/data/code", ratio=1.5)]),
            "mix.sources.0.ratio",
        ),
        (
            _mix(sources=[MixSource(name="code", path="/data/code", ratio=-0.1)]),
            "mix.sources.0.ratio",
        ),
        (
            _mix(
                sources=[
                    MixSource(name="a", path="/a", ratio=0.6),
                    MixSource(name="b", path="/b", ratio=0.5),
                ]
            ),
            "mix.sources.*.ratio",
        ),
        (_mix(sources=[MixSource(name="code", path=None)]), "mix.sources.0.path"),
        (
            _mix(sources=[MixSource(name="eng", path="/a"), MixSource(name="eng", path="/b")]),
            "mix.sources",
        ),
        (
            _mix(sources=[MixSource(name="eng", path="/a", max_epochs=0)]),
            "mix.sources.0.max_epochs",
        ),
        (_mix(default_bytes_per_token=0.0), "mix.default_bytes_per_token"),
        (_mix(bytes_per_token={"Latn": -1.0}), "mix.bytes_per_token.Latn"),
        (_mix(rehydration=_table((2, 1.0))), "mix.rehydration.weights"),
        (_mix(rehydration=_table((1, 1.0), (1, 2.0))), "mix.rehydration.weights"),
        (_mix(rehydration=_table((1, 1.0), (5, 0.0))), "mix.rehydration.weights"),
    ],
    ids=[
        "negative-budget",
        "zero-budget",
        "zero-cap",
        "ratio-over-1",
        "negative-ratio",
        "ratios-over-1",
        "no-path",
        "same-name",
        "source-cap",
        "default-bytes",
        "script-bytes",
        "table-start",
        "table-order",
        "table-weight",
    ],
)
def test_bad_mix_config_fails_naming_the_key(mix, key):
    with pytest.raises(
        ConfigError, match=rf"Invalid value for `{key.replace('*', '[*]')}`: .* Allowed: "
    ):
        validate_mix(mix)


def test_good_mix_config_passes():
    validate_mix(
        _mix(
            tokens=260e9,
            sources=[
                MixSource(name="code", path="/data/code", ratio=0.1, script="code"),
                MixSource(name="eng", path="/data/eng", priority=2),
            ],
        )
    )
