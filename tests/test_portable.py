"""The portable arithmetic (chargen.portable): what the exported page computes, to the bit.
The page itself is checked against it in tests/test_web.py."""

import math
import subprocess
import sys

import numpy as np
import pytest
import torch

from chargen import ChargenError, ModelConfig, load
from chargen.model import CharLSTM
from chargen.portable import (
    LANES,
    PCG32,
    PortableModel,
    PortableSampler,
    blocked,
    exp64,
    matvec,
    pad,
    pick,
    sigmoid32,
    tanh32,
)
from chargen.sample import SamplingOptions
from chargen.tokenizer import CharTokenizer


def test_pcg32_is_the_reference_generator():
    # pcg32-demo's first outputs for pcg32_srandom_r(&rng, 42u, 54u) (O'Neill, pcg-c-basic).
    rng = PCG32(42, 54)
    assert [rng.next_u32() for _ in range(6)] == [0xA15C02B7, 0x7B47F409, 0xBA1D3330, 0x83D2F293, 0xBFA4784B,
                                                  0xCBED606E]
    draws = [PCG32(7, 0).uniform() for _ in range(3)] + [PCG32(7, 1).uniform()]
    assert draws[0] == draws[1] == draws[2] != draws[3]  # seeded alike, alike; another stream, another
    rng = PCG32(2**63 - 1, 999)
    values = [rng.uniform() for _ in range(10_000)]
    assert min(values) >= 0 and max(values) < 1 and abs(np.mean(values) - 0.5) < 0.01


def test_exp64_is_exp_to_the_last_digits():
    x = np.concatenate([np.linspace(-700, 700, 200_001), [-1e-300, 0.0, 1e-300]])
    assert np.max(np.abs(exp64(x) / np.exp(x) - 1)) < 1e-13
    assert exp64(np.array([-np.inf, -800.0, 710.0, np.inf])).tolist() == [0.0, 0.0, math.inf, math.inf]
    assert sigmoid32(np.array([-1000, 0, 1000], np.float32)).tolist() == [0.0, 0.5, 1.0]
    assert tanh32(np.array([-1000, 0, 1000], np.float32)).tolist() == [-1.0, 0.0, 1.0]
    grid = np.linspace(-20, 20, 4001, dtype=np.float32)
    assert np.max(np.abs(tanh32(grid) - np.tanh(grid))) < 1e-6
    assert np.max(np.abs(sigmoid32(grid) - 1 / (1 + np.exp(-grid.astype(np.float64))))) < 1e-6


def test_matvec_sums_in_the_documented_order():
    """Bit for bit the loop that the page's kernel runs: lane j sums columns j, j+8, ... from
    +0, then lanes 0-3 plus 4-7, then (s0 + s1) + (s2 + s3), then + bias, all in float32."""
    rng = np.random.default_rng(0)
    weight, bias = rng.standard_normal((5, 21)).astype(np.float32), rng.standard_normal(5).astype(np.float32)
    x = pad(rng.standard_normal((3, 21)).astype(np.float32))
    got = matvec(blocked(weight), x, bias)
    f32 = np.float32
    for s in range(3):
        for r in range(5):
            lanes = [f32(0)] * LANES
            for k in range(x.shape[1]):
                w = weight[r, k] if k < 21 else f32(0)
                lanes[k % LANES] = f32(lanes[k % LANES] + f32(w * x[s, k]))
            half = [f32(lanes[j] + lanes[j + 4]) for j in range(4)]
            assert got[s, r] == f32(f32(f32(half[0] + half[1]) + f32(half[2] + half[3])) + bias[r])
    assert np.allclose(got, x[:, :21] @ weight.T + bias, atol=1e-5)
    assert np.array_equal(matvec(blocked(weight), x, bias, chunk=LANES * 5), got)  # one sample at a time


@pytest.mark.parametrize("shape", [dict(embedding=13, hidden=37, layers=2), dict(embedding=8, hidden=32, layers=1)])
def test_the_portable_step_is_the_model(shape):
    """Any width (padded to 8 inside), one or more layers: the logits of nn.LSTM's forward."""
    torch.manual_seed(0)
    model = CharLSTM(ModelConfig(vocab_size=23, **shape)).eval()
    ids = torch.randint(0, 23, (40, 3))
    with torch.no_grad():
        expected, _ = model(ids)
    portable = PortableModel(model)
    state = portable.initial_state(3)
    for t in range(40):
        logits, state = portable.step(ids[t].numpy(), state)
        assert np.allclose(logits, expected[t].numpy(), atol=2e-5), t
    # float16 weights: the numbers of an fp16 export, near the model's but not the same.
    half = PortableModel(model, "float16")
    assert all(np.array_equal(half.tensors[n], t.detach().half().float().numpy()) for n, t in model.named_parameters())


def test_a_row_is_the_same_alone_and_among_others():
    torch.manual_seed(1)
    portable = PortableModel(CharLSTM(ModelConfig(vocab_size=11, embedding=8, hidden=20, layers=2)))
    rng = np.random.default_rng(2)
    state = [rng.standard_normal(part.shape).astype(np.float32) for part in portable.initial_state(5)]
    for part in state[::2]:
        part[:, 20:] = 0  # (h's padding is zero)
    together, _ = portable.step(np.arange(5), state)
    for row in range(5):
        alone, _ = portable.step(np.array([row]), [part[row : row + 1] for part in state])
        assert np.array_equal(alone[0], together[row])


def test_pick_draws_by_the_cut_distribution():
    logits = np.array([0.0, 2.0, 1.0, -1.0, 2.0, 0.5], np.float32)
    allowed = np.array([False, True, True, True, True, True])
    us = (np.arange(20_000) + 0.5) / 20_000  # an even spread of draws: counts follow the probabilities
    options = SamplingOptions(temperature=0.7)
    counts = np.bincount([pick(logits, allowed, options, u) for u in us], minlength=6) / len(us)
    p = np.where(allowed, np.exp(logits / 0.7), 0)
    assert np.allclose(counts, p / p.sum(), atol=1e-3) and counts[0] == 0
    assert pick(logits, allowed, SamplingOptions(temperature=0), 0.99) == 1  # greedy: the first of the top two
    top2 = {pick(logits, allowed, SamplingOptions(top_k=2), u) for u in us[::100]}
    assert top2 == {1, 4}
    # top-p: the likeliest first, until those before cover p: 1 and 4 hold 0.379 of the mass
    # each (ties by id), 2 the next 0.139.
    for top_p, kept in ((0.3, {1}), (0.5, {1, 4}), (0.757, {1, 4}), (0.8, {1, 2, 4})):
        assert {pick(logits, allowed, SamplingOptions(temperature=1, top_p=top_p), u) for u in us[::100]} == kept
    assert {pick(logits, allowed, SamplingOptions(top_p=1e-30), u) for u in us[::100]} == {1}


def test_the_portable_sampler(trained_run):
    model = load(trained_run)
    first = model.generate_batch("the ", 120, num_samples=3, seed=11, rng="portable")
    assert first == model.generate_batch("the ", 120, num_samples=3, seed=11, rng="portable")
    assert first != model.generate_batch("the ", 120, num_samples=3, seed=12, rng="portable")
    assert len(set(first)) == 3 and all(len(text) == len("the ") + 120 for text in first)
    # Sample j is stream j of the seed, whatever the number of samples drawn with it.
    assert model.generate_batch("the ", 120, num_samples=1, seed=11, rng="portable")[0] == first[0]
    # Continue: a second call carries the state and the random streams on.
    sampler = model.sampler("the ", num_samples=2, seed=11, rng="portable")
    for _ in sampler.pieces(50):
        pass
    for _ in sampler.pieces(70):
        pass
    assert ["the " + text for text in sampler.texts] == first[:2]
    with pytest.raises(ChargenError, match="--rng is one of torch, portable"):
        model.sampler(rng="mersenne")
    with pytest.raises(ChargenError, match="never saw"):
        PortableSampler(model.portable(), CharTokenizer(["a"]), "b")


def test_lines_items_end_where_the_model_ends_them(lines_run):
    model = load(lines_run)
    sampler = model.sampler("", num_samples=20, seed=3, rng="portable")
    for _ in sampler.pieces(200):
        pass
    assert all(sampler.ended) and all(0 < len(text) < 200 and "\n" not in text for text in sampler.texts)


def test_cli_rng_portable(trained_run):
    def sample(*flags):
        done = subprocess.run([sys.executable, "-m", "chargen", "sample", str(trained_run), "--length", "80",
                               *flags], capture_output=True, text=True)
        return done.returncode, done.stdout, done.stderr

    code, out, _ = sample("--rng", "portable", "--seed", "4", "--prime", "the ")
    assert code == 0
    assert out == load(trained_run).generate("the ", 80, seed=4, rng="portable") + "\n"
    assert sample("--rng", "portable", "--seed", "4", "--prime", "the ")[1] == out
    code, _, err = sample("--rng", "lcg")
    assert code == 2 and "invalid choice: 'lcg'" in err
