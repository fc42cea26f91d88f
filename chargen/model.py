"""The model: embedding -> multi-layer LSTM -> linear head over the vocabulary."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import torch
from torch import nn

from .errors import ChargenError

State = tuple[torch.Tensor, torch.Tensor]  # (h, c), each (layers, batch, hidden)


@dataclass
class ModelConfig:
    vocab_size: int = 0  # 0: the text's (train sets it)
    embedding: int = 64
    hidden: int = 512
    layers: int = 1
    dropout: float | None = None  # None: as the epochs of the run call for (chargen.autosize); built alone, 0

    def __post_init__(self) -> None:
        if self.vocab_size < 0:
            raise ChargenError(f"the vocabulary size must be positive, not {self.vocab_size}")
        for name in ("embedding", "hidden", "layers"):
            if getattr(self, name) <= 0:
                raise ChargenError(f"--{name} must be positive, not {getattr(self, name)}")
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise ChargenError(f"--dropout must be in [0, 1), not {self.dropout}")

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class CharLSTM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.vocab_size <= 0:
            raise ChargenError("the model needs a vocabulary: set vocab_size (train sets it from the text)")
        self.config = config
        dropout = config.dropout or 0.0
        self.embed = nn.Embedding(config.vocab_size, config.embedding)
        self.drop = nn.Dropout(dropout)
        # One fused nn.LSTM for all layers: cuDNN on a GPU, one MKL-DNN call on a CPU.
        # PyTorch's own initialisation, forget gate included: a forget-gate bias of 1
        # (Jozefowicz et al. 2015) measured 0.06 nats worse at 600 steps and at 2,400
        # (benchmarks/recipe.py; benchmarks/README.md, "Time budgets").
        self.lstm = nn.LSTM(config.embedding, config.hidden, config.layers,
                            dropout=dropout if config.layers > 1 else 0.0)
        self.head = nn.Linear(config.hidden, config.vocab_size)

    def initial_state(self, batch_size: int, device: torch.device | str | None = None) -> State:
        device = device or self.head.weight.device
        shape = (self.config.layers, batch_size, self.config.hidden)
        return torch.zeros(shape, device=device), torch.zeros(shape, device=device)

    def forward(self, x: torch.Tensor, state: State | None = None) -> tuple[torch.Tensor, State]:
        """x: (time, batch) token ids -> logits (time, batch, vocab) and the final state."""
        if state is None:
            state = self.initial_state(x.shape[1], x.device)
        out, state = self.lstm(self.drop(self.embed(x)), state)
        return self.head(self.drop(out)), state

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def stepper(self) -> LeanStep:
        """A one-step forward for sampling, on weights pulled out now (see ``LeanStep``):
        the same function as ``forward`` on one time step in eval mode."""
        return LeanStep(self)


# Rows per matrix product when sampling. A CPU's GEMM sums each row of a product in an
# order that can depend on how many rows the product has (the kernel's blocking), so the
# same row alone and in a batch of 32 can differ in the last bit, and a draw near a
# boundary then differs. Products of a fixed number of rows (a batch is cut into tiles, the
# last padded) give each row the same sums whatever else is in the batch: a text is the
# same alone or among others (chargen.batching). 8 rows cost about what 1 does: a product
# this small is bound by reading the weights, not by the arithmetic.
TILE = 8
# Elementwise ops (the cell's sigmoid and tanh) run a vector loop of up to 32 floats at a
# time and a scalar loop for the remainder, and a scalar tanh can differ from the vector one
# in the last bit; above 32,768 elements (ATen's grain) they are split among threads, each
# with its own remainder. So the cell is computed in pieces of whole tiles below the grain,
# and a tile holds a multiple of 32 floats of a layer: then no row ever meets the scalar
# loop, wherever it sits in the batch (for hidden sizes below 2,048).
VECTOR_FLOATS = 32
ELEMENTWISE_GRAIN = 32768


def tile_rows(hidden: int) -> int:
    """Rows per tile for a layer of ``hidden`` units: TILE, or more where TILE rows would
    not hold a multiple of VECTOR_FLOATS floats."""
    return math.lcm(TILE, VECTOR_FLOATS // math.gcd(hidden, VECTOR_FLOATS))


def tiled_addmm(bias: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, tile: int) -> torch.Tensor:
    """bias + x @ weight for x of (tiles * tile, in), as products of ``tile`` rows."""
    tiles = x.shape[0] // tile
    if bias.dim() == 2:
        bias = bias.view(tiles, tile, -1)
    out = torch.baddbmm(bias, x.view(tiles, tile, -1), weight.expand(tiles, *weight.shape))
    return out.view(tiles * tile, -1)


class LeanStep:
    """One time step of a ``CharLSTM`` in eval mode, for sampling a character at a time.

    Per character, ``nn.LSTM`` costs far more in call overhead (argument checks, weight
    flattening, the general multi-step kernel) than in arithmetic. Here the weights are
    pulled out once: the embedding is folded into the first layer's input weights and both
    biases (a table of vocabulary x 4·hidden, so that product becomes a row lookup), and a
    step is one product per layer, the gate nonlinearities and one product for the head,
    in tiles (``tile_rows``): a row's result does not depend on the other rows.
    A snapshot: build a new one after the weights change."""

    @torch.inference_mode()
    def __init__(self, model: CharLSTM) -> None:
        lstm, layers = model.lstm, model.config.layers
        weight = [getattr(lstm, f"weight_ih_l{k}") for k in range(layers)]
        recurrent = [getattr(lstm, f"weight_hh_l{k}") for k in range(layers)]
        bias = [getattr(lstm, f"bias_ih_l{k}") + getattr(lstm, f"bias_hh_l{k}") for k in range(layers)]
        self.table = torch.addmm(bias[0], model.embed.weight, weight[0].t())
        self.recurrent = [w.t().contiguous() for w in recurrent]
        self.weight = [None] + [w.t().contiguous() for w in weight[1:]]
        self.bias = bias
        self.head_weight = model.head.weight.t().contiguous()
        self.head_bias = model.head.bias.detach().clone()
        self.hidden = model.config.hidden
        self.tile = tile_rows(self.hidden)

    def __call__(self, ids: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """ids (batch,) -> logits (batch, vocab) and the next state."""
        rows, tile = ids.shape[0], self.tile
        pad = -rows % tile  # (padding rows start from id 0 and a zero state; they are dropped)
        h, c = state
        if pad:
            ids = nn.functional.pad(ids, (0, pad))
            h, c = nn.functional.pad(h, (0, 0, 0, pad)), nn.functional.pad(c, (0, 0, 0, pad))
        hs, cs = [], []
        x = None
        for k in range(len(self.recurrent)):
            if k == 0:
                gates = tiled_addmm(self.table[ids], h[0], self.recurrent[0], tile)
            else:
                gates = tiled_addmm(tiled_addmm(self.bias[k], x, self.weight[k], tile), h[k], self.recurrent[k], tile)
            x, cell = lstm_cell(gates, c[k], self.hidden, tile)
            hs.append(x[:rows])
            cs.append(cell[:rows])
        return tiled_addmm(self.head_bias, x, self.head_weight, tile)[:rows], (torch.stack(hs), torch.stack(cs))


def lstm_cell(gates: torch.Tensor, c: torch.Tensor, n: int, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The new (h, c) from gates (rows, 4n) in PyTorch's order (input, forget, cell, output),
    in pieces of whole tiles below ELEMENTWISE_GRAIN elements."""
    piece = max(tile, (ELEMENTWISE_GRAIN - 1) // (2 * n) // tile * tile)
    hs, cs = [], []
    for lo in range(0, gates.shape[0], piece):
        g = gates[lo : lo + piece]
        i_f = torch.sigmoid(g[:, : 2 * n])
        cell = i_f[:, n:] * c[lo : lo + piece] + i_f[:, :n] * torch.tanh(g[:, 2 * n : 3 * n])
        hs.append(torch.sigmoid(g[:, 3 * n :]) * torch.tanh(cell))
        cs.append(cell)
    if len(hs) == 1:
        return hs[0], cs[0]
    return torch.cat(hs), torch.cat(cs)


def detach_state(state: State) -> State:
    """Cut the graph at a chunk boundary but keep the values: truncated BPTT."""
    return state[0].detach(), state[1].detach()
