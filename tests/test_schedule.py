import math

import pytest

from chargen import ChargenError
from chargen.schedule import WarmupDecay


def test_warmup_then_cosine():
    s = WarmupDecay(peak_lr=1.0, warmup_steps=10, total_steps=110, decay="cosine", final_fraction=0.1)
    assert s.lr_at(0) == pytest.approx(0.1)
    assert s.lr_at(9) == pytest.approx(1.0)
    warm = [s.lr_at(i) for i in range(10)]
    assert warm == sorted(warm)
    assert s.lr_at(10) == pytest.approx(1.0)
    assert s.lr_at(60) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.5)))
    assert s.lr_at(110) == pytest.approx(0.1)
    assert s.lr_at(500) == pytest.approx(0.1)


def test_linear_and_none():
    linear = WarmupDecay(2.0, 0, 100, "linear", 0.0)
    assert linear.lr_at(0) == pytest.approx(2.0) and linear.lr_at(50) == pytest.approx(1.0)
    flat = WarmupDecay(2.0, 0, 100, "none")
    assert flat.lr_at(99) == 2.0


@pytest.mark.parametrize("kwargs", [dict(peak_lr=0), dict(warmup_steps=-1), dict(decay="step")])
def test_invalid(kwargs):
    with pytest.raises(ChargenError):
        WarmupDecay(**{"peak_lr": 1.0, "warmup_steps": 0, "total_steps": 10, **kwargs})
