"""The learning-rate schedules of the training stages."""

from __future__ import annotations

import pytest

from pipeline.training.train_config import lr_factor


def factors(schedule: str, steps: int = 100, warmup: int = 10, floor: float = 0.1) -> list[float]:
    return [lr_factor(step, schedule, steps, warmup, floor) for step in range(steps)]


@pytest.mark.parametrize("schedule", ["constant", "cosine", "linear", "wsd"])
def test_every_schedule_warms_up_linearly_to_the_peak(schedule):
    values = factors(schedule)
    assert values[:10] == pytest.approx([(i + 1) / 10 for i in range(10)])
    assert values[10] == pytest.approx(1.0)


def test_decaying_schedules_end_at_the_floor_and_never_rise():
    for schedule in ("cosine", "linear", "wsd"):
        values = factors(schedule)[10:] + [lr_factor(100, schedule, 100, 10, 0.1)]
        assert all(later <= earlier + 1e-12 for earlier, later in zip(values, values[1:])), schedule
        assert values[-1] == pytest.approx(0.1), schedule
    assert factors("constant")[-1] == 1.0


def test_cosine_is_halfway_at_the_middle_and_wsd_holds_the_peak_until_its_last_tenth():
    assert lr_factor(55, "cosine", 100, 10, 0.0) == pytest.approx(0.5)
    wsd = factors("wsd")
    assert all(value == 1.0 for value in wsd[10:90]) and wsd[95] < 1.0
