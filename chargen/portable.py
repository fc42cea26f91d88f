"""Portable sampling: the same characters in Python and in a visitor's browser.

The page that ``chargen export --web`` writes (chargen/web/chargen.js) runs the model in
the browser. For the page and ``chargen sample --rng portable`` to draw the same text for
the same seed, both compute the same numbers to the last bit, by construction rather
than by luck: every operation below is one that IEEE 754 defines exactly (+ - * /,
rounding to float32, floor, scaling by a power of two), in an order written down here.

- Random numbers: PCG32 (O'Neill 2014: ``pcg32_srandom_r(seed, stream)`` and
  ``pcg32_random_r``), one stream per sample (stream = the sample's index). One uniform
  in [0, 1) per sample per step, from two outputs a, b: ``((a >> 5) * 2**26 + (b >> 6)) / 2**53``.
- Products: float32, ``sum(W[r, k] * x[k])`` with each product rounded, summed in
  ``LANES`` lanes (lane j holds columns j, j+8, j+16, ... added in column order), then
  lanes 0-3 plus lanes 4-7, then (s0 + s1) + (s2 + s3). That is the order of the page's
  WebAssembly kernel (two f32x4 accumulators); numpy's ``add.accumulate`` is sequential by
  definition, so it reproduces the order here. Rows are padded with zero columns to a
  multiple of 8.
- The cell: gates = (W_ih x + b_ih) + (W_hh h + b_hh); sigmoid and tanh in float64 with
  ``exp64`` below (not the platform's exp, whose last bit differs between libm and V8),
  rounded to float32; c' = (f c) + (i g) and h' = o tanh(c') in float32.
- The draw: the logits in float64, scaled by the temperature, cut to the top k and top p,
  exp64 of each, then inverse CDF over the kept ids in id order (sums sequential).

It is slower than the default sampler (numpy, not oneDNN): it exists to reproduce the
page, and to check it.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Iterator

import numpy as np
import torch

from .checks import check_seed
from .errors import ChargenError
from .model import CharLSTM
from .sample import Drawn, SamplingOptions, banned_ids, prime_ids
from .tokenizer import CharTokenizer

LANES = 8
M64, M32 = (1 << 64) - 1, (1 << 32) - 1
PCG_MULT = 6364136223846793005
WEIGHT_DTYPES = ("float32", "float16")
RNGS = ("torch", "portable")  # the default sampler's random numbers, or these


class PCG32:
    """PCG-XSH-RR 64/32, seeded as the reference ``pcg32_srandom_r(seed, stream)``."""

    def __init__(self, seed: int, stream: int) -> None:
        self.inc = ((stream << 1) | 1) & M64
        self.state = 0
        self.next_u32()
        self.state = (self.state + seed) & M64
        self.next_u32()

    def next_u32(self) -> int:
        old = self.state
        self.state = (old * PCG_MULT + self.inc) & M64
        shifted = (((old >> 18) ^ old) >> 27) & M32
        rot = old >> 59
        return ((shifted >> rot) | (shifted << ((-rot) & 31))) & M32

    def uniform(self) -> float:
        """A float in [0, 1) on the 2**53 grid, from two outputs."""
        a, b = self.next_u32() >> 5, self.next_u32() >> 6
        return (a * 67108864 + b) / 9007199254740992


# exp in float64 from + - * / alone: x = n ln2 + r (|r| <= ln2/2; Cody and Waite's split of
# ln2, whose high part has trailing zeros, so n * LN2_HI is exact), then the Taylor
# polynomial to r**11 (relative error below 1e-14) by Estrin's scheme (a shallower chain of
# operations than Horner's: half the time in the page), then times 2**n. Near enough to exp
# for sampling and the cell, and the same bits wherever IEEE doubles are.
LN2_HI, LN2_LO = 6.93147180369123816490e-01, 1.90821492927058770002e-10
INV_LN2 = 1.44269504088896338700e00
E0, E1, E2, E3, E4, E5, E6, E7, E8, E9, E10, E11 = (1 / math.factorial(k) for k in range(12))
EXP_MIN, EXP_MAX = -708.0, 709.0  # below: 0; above: inf


def exp64(x: np.ndarray) -> np.ndarray:
    """exp of float64 ``x`` (-inf gives 0), elementwise, as chargen.js's ``exp64``."""
    x = np.asarray(x, dtype=np.float64)
    clipped = np.clip(x, EXP_MIN, EXP_MAX)
    n = np.floor(clipped * INV_LN2 + 0.5)
    r = (clipped - n * LN2_HI) - n * LN2_LO
    r2 = r * r
    r4 = r2 * r2
    p = (((E0 + E1 * r) + (E2 + E3 * r) * r2) + ((E4 + E5 * r) + (E6 + E7 * r) * r2) * r4) \
        + ((E8 + E9 * r) + (E10 + E11 * r) * r2) * (r4 * r4)
    out = np.ldexp(p, n.astype(np.int64))
    out[x < EXP_MIN] = 0.0
    out[x > EXP_MAX] = np.inf
    return out


def sigmoid32(x: np.ndarray) -> np.ndarray:
    return (1.0 / (1.0 + exp64(-x.astype(np.float64)))).astype(np.float32)


def tanh32(x: np.ndarray) -> np.ndarray:
    return (1.0 - 2.0 / (exp64(2.0 * x.astype(np.float64)) + 1.0)).astype(np.float32)


def padded(width: int) -> int:
    return -(-width // LANES) * LANES


def pad(x: np.ndarray) -> np.ndarray:
    """(rows, width) float32 with zero columns up to a multiple of LANES."""
    out = np.zeros((x.shape[0], padded(x.shape[1])), dtype=np.float32)
    out[:, : x.shape[1]] = x
    return out


def blocked(weight: np.ndarray) -> np.ndarray:
    """(rows, cols) float32 as (cols / LANES, rows, LANES), padded with zero columns to a
    multiple of LANES: ``matvec``'s layout, one block of columns after another."""
    rows = weight.shape[0]
    return np.ascontiguousarray(pad(weight).reshape(rows, -1, LANES).transpose(1, 0, 2))


def matvec(weight: np.ndarray, x: np.ndarray, bias: np.ndarray, chunk: int = 1 << 22) -> np.ndarray:
    """``x @ W.T + bias`` in float32 in the portable order, for ``weight`` = ``blocked(W)``
    and ``x`` (samples, cols) with zeros past its width; samples taken so many at a time
    that the running sums hold at most ``chunk`` floats."""
    blocks, rows, _ = weight.shape
    out = np.empty((x.shape[0], rows), np.float32)
    step = max(1, chunk // (rows * LANES))
    for start in range(0, x.shape[0], step):
        xs = x[start : start + step].reshape(-1, blocks, 1, LANES)
        lanes = np.zeros((xs.shape[0], rows, LANES), np.float32)  # lane j sums columns j, j + 8, ... from +0
        product = np.empty_like(lanes)
        for b in range(blocks):  # (in column order)
            np.multiply(weight[b], xs[:, b], out=product)
            lanes += product
        half = lanes[..., :4] + lanes[..., 4:]
        out[start : start + step] = ((half[..., 0] + half[..., 1]) + (half[..., 2] + half[..., 3])) + bias
    return out


def as_weights(tensor: torch.Tensor, dtype: str) -> np.ndarray:
    """A weight as float32 numbers, rounded through float16 first for fp16 weights."""
    if dtype not in WEIGHT_DTYPES:
        raise ChargenError(f"weights are float32 or float16, not {dtype}")
    return tensor.detach().to("cpu", getattr(torch, dtype)).float().numpy()


class PortableModel:
    """A CharLSTM's weights, padded, and its one-step forward in the portable arithmetic.
    ``weights`` float16 gives the numbers of the page's fp16 export."""

    def __init__(self, model: CharLSTM, weights: str = "float32") -> None:
        config, params = model.config, dict(model.named_parameters())
        self.hidden, self.layers, self.vocab_size = config.hidden, config.layers, config.vocab_size
        self.weights_dtype = weights
        self.tensors = {name: as_weights(t, weights) for name, t in params.items()}
        w = {name: blocked(t) if t.ndim == 2 else t for name, t in self.tensors.items()}
        self.w_ih = [w[f"lstm.weight_ih_l{k}"] for k in range(self.layers)]
        self.w_hh = [w[f"lstm.weight_hh_l{k}"] for k in range(self.layers)]
        self.b_ih = [w[f"lstm.bias_ih_l{k}"] for k in range(self.layers)]
        self.b_hh = [w[f"lstm.bias_hh_l{k}"] for k in range(self.layers)]
        self.head, self.head_bias = w["head.weight"], w["head.bias"]
        # Layer 0's input part for every id, once: (vocab, 4 hidden).
        self.table = matvec(self.w_ih[0], pad(self.tensors["embed.weight"]), self.b_ih[0])

    def initial_state(self, rows: int) -> list[np.ndarray]:
        """h (padded) and c of each layer: [h0, c0, h1, c1, ...], each (rows, width)."""
        state = []
        for _ in range(self.layers):
            state += [np.zeros((rows, padded(self.hidden)), np.float32), np.zeros((rows, self.hidden), np.float32)]
        return state

    def step(self, ids: np.ndarray, state: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
        """Logits (rows, vocab) float32 for input ``ids`` (rows,), and the next state."""
        n, x, new = self.hidden, self.table[ids], []
        for k in range(self.layers):
            h, c = state[2 * k], state[2 * k + 1]
            if k:
                x = matvec(self.w_ih[k], new[-2], self.b_ih[k])
            gates = x + matvec(self.w_hh[k], h, self.b_hh[k])
            i, f, o = (sigmoid32(gates[:, j * n : (j + 1) * n]) for j in (0, 1, 3))
            g = tanh32(gates[:, 2 * n : 3 * n])
            c = f * c + i * g
            h = np.zeros_like(state[2 * k])
            h[:, :n] = o * tanh32(c)
            new += [h, c]
        return matvec(self.head, new[-2], self.head_bias), new


def pick(logits: np.ndarray, allowed: np.ndarray, options: SamplingOptions, u: float) -> int:
    """The id drawn from one row of float32 ``logits`` by uniform ``u``, as chargen.js's
    ``pick``: greedy at temperature 0; else the temperature-scaled distribution cut to the
    top k and top p, and the first id (in id order) whose running sum passes ``u`` of the
    total."""
    values = np.where(allowed, logits.astype(np.float64), -np.inf)
    if options.temperature == 0:
        return int(np.argmax(values))
    scaled = (values - values.max()) / options.temperature
    count = int(allowed.sum())
    if 0 < options.top_k < count:
        kth = np.sort(scaled)[::-1][options.top_k - 1]
        scaled = np.where(scaled < kth, -np.inf, scaled)
    weights = exp64(scaled)
    if options.top_p < 1:
        order = np.lexsort((np.arange(len(scaled)), -scaled))  # likeliest first; ties by id
        running = np.add.accumulate(weights[order])  # (sequential sums)
        cut = running - weights[order] >= options.top_p * running[-1]
        cut[0] = False
        weights[order[cut]] = 0.0
    running = np.add.accumulate(weights)
    passed = np.flatnonzero(running > u * running[-1])
    return int(passed[0]) if len(passed) else int(np.flatnonzero(weights)[-1])


class PortableSampler(Drawn):
    """``chargen.sample.Sampler``'s interface (``pieces``, ``texts``, ``ended``) in the
    portable arithmetic: the text the exported page draws for the same seed."""

    def __init__(self, model: PortableModel, tokenizer: CharTokenizer, prime: str, *, num_samples: int = 1,
                 seed: int | None = None, items: bool = False) -> None:
        super().__init__(tokenizer, num_samples, items)
        self.model, self._prime = model, prime_ids(tokenizer, prime, items)
        check_seed(seed)
        self.seed = secrets.randbits(32) if seed is None else seed
        self.rngs = [PCG32(self.seed, j) for j in range(num_samples)]
        self.allowed = np.ones(model.vocab_size, dtype=bool)
        self.allowed[list(banned_ids(items))] = False
        self.pending: np.ndarray | None = None
        self.state: list[np.ndarray] | None = None

    def start(self) -> None:
        """Feed the prime but its last character, one step at a time, once."""
        if self.pending is not None:
            return
        state = self.model.initial_state(1)
        for i in self._prime[:-1]:
            _, state = self.model.step(np.array([i]), state)
        self.state = [np.repeat(part, self.num_samples, axis=0) for part in state]
        self.pending = np.full(self.num_samples, self._prime[-1])

    def _steps(self, length: int, options: SamplingOptions) -> Iterator[list[str]]:
        for _ in range(length):
            if all(self.ended):
                return
            self.start()
            logits, self.state = self.model.step(self.pending, self.state)
            for j in range(self.num_samples):  # (an ended item draws nothing: its stream stays where it was)
                if not self.ended[j]:
                    self.pending[j] = pick(logits[j], self.allowed, options, self.rngs[j].uniform())
            yield self.append(self.pending.tolist())
