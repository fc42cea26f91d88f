import math

import pytest

from chargen import ChargenError
from chargen.config import TrainConfig
from chargen.schedule import BatchScaling, WarmupDecay, format_schedule


def test_warmup_then_cosine():
    s = WarmupDecay(peak_lr=1.0, warmup_steps=10, total_steps=110, decay="cosine", final_fraction=0.1)
    assert s.lr_at(0) == pytest.approx(0.1)
    assert s.lr_at(9) == pytest.approx(1.0)
    assert s.lr_at(10) == pytest.approx(1.0)
    assert s.lr_at(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert s.lr_at(110) == pytest.approx(0.1)
    assert s.lr_at(500) == pytest.approx(0.1)


@pytest.mark.parametrize(
    "decay, halfway, end",
    [("linear", 0.1 + 0.9 * 0.5, 0.1), ("poly", 0.1 + 0.9 * 0.25, 0.1), ("exp", 0.1**0.5, 0.1), ("none", 1.0, 1.0)],
)
def test_decays(decay, halfway, end):
    s = WarmupDecay(1.0, 0, 100, decay, 0.1)
    assert s.lr_at(0) == pytest.approx(1.0)
    assert s.lr_at(50) == pytest.approx(halfway)
    assert s.lr_at(100) == pytest.approx(end)
    values = [s.lr_at(i) for i in range(101)]
    assert values == sorted(values, reverse=True)


@pytest.mark.parametrize(
    "kwargs", [dict(peak_lr=0), dict(warmup_steps=-1), dict(decay="step"), dict(decay="exp", final_fraction=0.0)]
)
def test_invalid(kwargs):
    with pytest.raises(ChargenError):
        WarmupDecay(**{"peak_lr": 1.0, "warmup_steps": 0, "total_steps": 10, **kwargs})


# Reference: B0 = 32, lr0 = 1e-3, W0 = 0.5 epochs. The run: B = 128 (k = 4), 100 updates an
# epoch at that batch (so 400 at B0), a 1,000-update plan, cosine decay to a tenth.
BASE = dict(base_batch_size=32, base_lr=1e-3, base_warmup_epochs=0.5)
HAND = {
    # scheme: (peak lr, warmup steps, {step: lr})
    "legw": (2e-3, 200, {0: 2e-3 / 200, 99: 1e-3, 199: 2e-3, 200: 2e-3, 600: 2e-3 * 0.55, 1000: 2e-4}),
    "linear": (4e-3, 50, {0: 4e-3 / 50, 24: 2e-3, 49: 4e-3, 525: 4e-3 * 0.55, 1000: 4e-4}),
    "none": (1e-3, 50, {0: 1e-3 / 50, 49: 1e-3, 525: 1e-3 * 0.55, 1000: 1e-4}),
}


@pytest.mark.parametrize("scheme", HAND)
def test_scaled_schedules_match_hand_computed_values(scheme):
    peak, warmup, values = HAND[scheme]
    schedule = BatchScaling(scheme, **BASE).schedule(128, steps_per_epoch=100, total_steps=1000)
    assert schedule.peak_lr == pytest.approx(peak)
    assert schedule.warmup_steps == warmup
    for step, lr in values.items():
        assert schedule.lr_at(step) == pytest.approx(lr), step
    ramp = [schedule.lr_at(i) for i in range(warmup)]
    assert all(a < b for a, b in zip(ramp, ramp[1:], strict=False))  # warmup rises every step
    assert schedule.lr_at(warmup - 1) == pytest.approx(peak)


def test_the_base_batch_is_the_reference_under_every_scheme():
    for scheme in HAND:
        schedule = BatchScaling(scheme, **BASE).schedule(32, steps_per_epoch=400, total_steps=4000)
        assert (schedule.peak_lr, schedule.warmup_steps) == (pytest.approx(1e-3), 200)


@pytest.mark.parametrize("k", [1, 2, 4, 16, 64])
def test_legw_warmup_is_the_base_runs_number_of_updates(k):
    """k times the batch: an epoch is 1/k the updates, the warmup k times the epochs."""
    scaling = BatchScaling("legw", base_batch_size=16, base_lr=2e-3, base_warmup_epochs=0.25)
    base = scaling.schedule(16, steps_per_epoch=6400, total_steps=64000)
    wide = scaling.schedule(16 * k, steps_per_epoch=6400 // k, total_steps=64000 // k)
    assert wide.warmup_steps == base.warmup_steps == 1600
    assert scaling.warmup_epochs(16 * k) == 0.25 * k
    assert wide.peak_lr == pytest.approx(2e-3 * math.sqrt(k))


def test_batch_need_not_be_a_whole_multiple():
    scaling = BatchScaling("legw", **BASE)
    assert scaling.ratio(48) == 1.5 and scaling.peak_lr(48) == pytest.approx(1e-3 * math.sqrt(1.5))
    assert scaling.peak_lr(8) == pytest.approx(1e-3 * 0.5)  # a smaller batch scales down


def test_warmup_cap_and_description():
    scaling = BatchScaling("legw", **BASE)
    schedule = scaling.schedule(128, steps_per_epoch=100, total_steps=300, max_warmup_steps=150)
    assert schedule.warmup_steps == 150
    info = scaling.describe(128, 100, schedule)
    assert info["k"] == 4 and info["warmup_epochs"] == 1.5 and info["decay_steps"] == 150
    assert info["final_lr"] == pytest.approx(2e-4)
    line = format_schedule(info)
    assert "legw" in line and "peak 0.002" in line and "warmup 150 steps (1.5 epochs)" in line


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(scheme="sqrt"), "--lr-scaling must be one of legw, linear, none"),
        (dict(base_batch_size=0), "--base-batch-size must be a positive whole number"),
        (dict(base_batch_size=-8), "--base-batch-size must be a positive whole number"),
        (dict(base_batch_size=2.5), "--base-batch-size must be a positive whole number"),
        (dict(base_lr=0.0), "--base-lr must be positive"),
        (dict(base_lr=float("nan")), "--base-lr must be positive"),
        (dict(base_warmup_epochs=-0.1), "--base-warmup-epochs must be 0 or more"),
    ],
)
def test_invalid_reference(kwargs, pattern):
    with pytest.raises(ChargenError, match=pattern):
        BatchScaling(**{**BASE, **kwargs})


@pytest.mark.parametrize("batch", [0, -32, 1.5])
def test_invalid_batch(batch):
    with pytest.raises(ChargenError, match="batch size must be a positive whole number"):
        BatchScaling("legw", **BASE).peak_lr(batch)


@pytest.mark.parametrize(
    "kwargs, pattern",
    [
        (dict(lr_scaling="quadratic"), "--lr-scaling must be one of"),
        (dict(base_batch_size=0), "--base-batch-size must be"),
        (dict(base_lr=-1e-3), "--base-lr must be between 0 and 1"),
        (dict(base_lr=2.0), "--base-lr must be between 0 and 1"),
        (dict(weight_decay=float("nan")), "--weight-decay must be 0 to 1"),
        (dict(epochs=float("inf")), "--epochs must be positive and finite"),
        (dict(base_warmup_epochs=1e308), "--base-warmup-epochs must be at most"),
        (dict(seed=-1), "--seed must be 0 to"),
        (dict(sample_chars=10**9), "--sample-chars must be 0 to"),
        (dict(base_warmup_epochs=-1.0), "--base-warmup-epochs must be 0 or more"),
        (dict(warmup_steps=-5), "--warmup-steps must be 0 or more"),
        (dict(decay="sawtooth"), "--decay must be one of"),
    ],
)
def test_train_config_refuses_bad_settings(kwargs, pattern):
    with pytest.raises(ChargenError, match=pattern):
        TrainConfig(**kwargs)


def test_warmup_in_steps_is_updates_at_the_base_batch():
    config = TrainConfig(batch_size=128, base_batch_size=32, warmup_steps=100)
    scaling = config.scaling(base_steps_per_epoch=400)
    assert scaling.base_warmup_epochs == 0.25
    assert scaling.schedule(128, steps_per_epoch=100, total_steps=1000).warmup_steps == 100
