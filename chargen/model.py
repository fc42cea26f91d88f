"""The model: embedding -> multi-layer LSTM -> linear head over the vocabulary."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields, replace

import torch
from torch import nn

from .checks import check_field_types, check_finite
from .errors import ChargenError
from .tokenizer import MAX_VOCAB, SPECIALS

State = tuple[torch.Tensor, torch.Tensor]  # (h, c), each (layers, batch, hidden)
# LeanStep's state: (h, c) and each layer's recurrent part of the next step (layers, batch, 4·hidden)
LeanState = tuple[torch.Tensor, torch.Tensor, torch.Tensor]
# Bounds on a model's shape, far past any useful char-LSTM, so that a config.json asking for
# a million layers is refused at once rather than built for minutes (memory is checked after).
MAX_LAYERS, MAX_WIDTH = 64, 65_536


@dataclass
class ModelConfig:
    vocab_size: int = 0  # 0: the text's (train sets it)
    embedding: int = 64
    hidden: int = 512
    layers: int = 1
    dropout: float | None = None  # None: as the epochs of the run call for (chargen.autosize); built alone, 0

    def __post_init__(self) -> None:
        check_field_types(self)
        if not 0 <= self.vocab_size <= MAX_VOCAB + len(SPECIALS):
            raise ChargenError(f"the vocabulary size must be 0 to {MAX_VOCAB + len(SPECIALS):,}, not {self.vocab_size}")
        for name, most in (("embedding", MAX_WIDTH), ("hidden", MAX_WIDTH), ("layers", MAX_LAYERS)):
            if not 0 < getattr(self, name) <= most:
                raise ChargenError(f"--{name} must be 1 to {most:,}, not {getattr(self, name)}")
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise ChargenError(f"--dropout must be in [0, 1), not {self.dropout}")
        check_finite(self)

    def to_dict(self) -> dict:
        return asdict(self)

    def shapes(self) -> dict[str, tuple[int, ...]]:
        """Every weight's name and shape in a ``CharLSTM`` of this config, without building it."""
        v, e, h = self.vocab_size, self.embedding, self.hidden
        shapes: dict[str, tuple[int, ...]] = {"embed.weight": (v, e)}
        for k in range(self.layers):
            shapes |= {f"lstm.weight_ih_l{k}": (4 * h, e if k == 0 else h), f"lstm.weight_hh_l{k}": (4 * h, h),
                       f"lstm.bias_ih_l{k}": (4 * h,), f"lstm.bias_hh_l{k}": (4 * h,)}
        return shapes | {"head.weight": (v, h), "head.bias": (v,)}

    @classmethod
    def from_dict(cls, data: dict) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


class LockedDropout(nn.Module):
    """Dropout on (time, batch, features) with one mask per row of the batch, shared by all
    the chunk's time steps (variational dropout, Gal & Ghahramani 2016; AWD-LSTM's locked
    dropout). On the play at 1x512, dropout 0.2, 3,400 steps it scored as nn.Dropout's fresh
    mask per element did (1.4842 against 1.4861), on a step 22% shorter natively (bf16) and 7%
    under the AVX2 cap (fp32): the mask is batch x features, not time x batch x features
    (python -m benchmarks.locked_dropout; docs/training.md, "Dropout and weight decay")."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0:
            return x
        keep = 1.0 - self.p
        return x * x.new_empty(1, *x.shape[1:]).bernoulli_(keep).div_(keep)

    def extra_repr(self) -> str:
        return f"p={self.p}"


class CharLSTM(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        if config.vocab_size <= 0:
            raise ChargenError("the model needs a vocabulary: set vocab_size (train sets it from the text)")
        self.config = config
        dropout = config.dropout or 0.0
        self.embed = nn.Embedding(config.vocab_size, config.embedding)
        self.drop = LockedDropout(dropout)
        # One fused nn.LSTM for all layers: cuDNN on a GPU, one MKL-DNN call on a CPU.
        # PyTorch's own initialisation, forget gate included: a forget-gate bias of 1
        # (Jozefowicz et al. 2015) measured 0.06 nats worse at 600 steps and at 2,400
        # (python -m benchmarks.recipe; benchmarks/README.md, "Recipe and the bump").
        self.lstm = nn.LSTM(config.embedding, config.hidden, config.layers,
                            dropout=dropout if config.layers > 1 else 0.0)
        self.head = nn.Linear(config.hidden, config.vocab_size)

    def set_dropout(self, dropout: float) -> None:
        """Dropout from now on (a timed run's, refitted with its plan: chargen.prepare)."""
        self.config = replace(self.config, dropout=dropout)
        self.drop.p = dropout
        self.lstm.dropout = dropout if self.config.layers > 1 else 0.0

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


# Sampling steps many texts' rows as one batch (chargen.batching), and a text must come out
# the same as alone: every row's numbers the same to the last bit, whatever else is in the
# batch. Two things stand in the way on a CPU.
#
# Matrix products: MKL's GEMM (torch.addmm) sums a row in an order that depends on how many
# rows the product has (one row goes to a GEMV, more to blocked kernels), so a row alone and
# in a batch of 32 differ in the last bit. oneDNN's inner product on weights packed once
# (the op torch.compile uses on a CPU) sums every row with the same kernel for any number of
# rows, at the cost of a GEMV for one row: ``RowProduct`` uses it where it runs, and
# tests/test_batching.py checks the property on the machine the tests run on.
#
# Elementwise ops (the cell's sigmoid and tanh): a vector loop of up to 32 floats at a time
# and a scalar loop for the remainder, and a scalar tanh can differ from the vector one in
# the last bit; above 32,768 elements (ATen's grain) they are split among threads, each with
# its own remainder. So the cell is computed on whole tiles of rows (``cell_tile``: rows that
# hold a multiple of 32 floats of a layer, the last tile padded) in pieces below the grain:
# then no row ever meets the scalar loop, wherever it sits (for hidden sizes below 2,048).
VECTOR_FLOATS = 32
ELEMENTWISE_GRAIN = 32768


def cell_tile(hidden: int) -> int:
    """Rows whose cell values fill whole vector loops: 1 for a hidden size that is a
    multiple of 32, up to 32 rows for an odd one."""
    return VECTOR_FLOATS // math.gcd(hidden, VECTOR_FLOATS)


class RowProduct:
    """``x @ weight.T + bias`` for any number of rows, each row's result the same whatever
    the other rows: oneDNN's inner product on the weight packed once, on a CPU where it
    runs; elsewhere (a GPU, a CPU build without oneDNN) ``torch.addmm``, whose rows may
    differ in the last bit with the batch's size."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        self.weight_t, self.bias = weight.t().contiguous(), bias
        self.packed = packed_for_rows(weight, bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        # (Under a caller's autocast, or on a lower-precision state, torch's own product
        # takes the precision: the packed weights are float32 only.)
        if self.packed is not None and x.dtype == torch.float32 and not torch.is_autocast_enabled(x.device.type):
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")
        return x @ self.weight_t if self.bias is None else torch.addmm(self.bias, x, self.weight_t)


def packed_for_rows(weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
    """``weight`` (out, in) packed for oneDNN's inner product, or None where that does not
    run here (tried once on a row of zeros)."""
    if weight.device.type != "cpu" or weight.dtype != torch.float32 or not torch.backends.mkldnn.is_available():
        return None
    try:
        packed = torch.ops.mkldnn._reorder_linear_weight(weight.contiguous())
        torch.ops.mkldnn._linear_pointwise(weight.new_zeros(1, weight.shape[1]), packed, bias, "none", [], "")
        return packed
    except (RuntimeError, AttributeError):
        return None


class LeanStep:
    """One time step of a ``CharLSTM`` in eval mode, for sampling a character at a time.

    Per character, ``nn.LSTM`` costs far more in call overhead (argument checks, weight
    flattening, the general multi-step kernel) than in arithmetic. Here the weights are
    pulled out once: the embedding is folded into the first layer's input weights and both
    biases (a table of vocabulary x 4·hidden, so that product becomes a row lookup), and a
    step is the gate nonlinearities (``lstm_cell``) and one product per layer
    (``RowProduct``): a row's result does not depend on the other rows.

    That one product takes a layer's new h to all it feeds: the next layer's input (the
    head's logits after the last layer) and the layer's own recurrent part of the next step,
    which the state carries (``LeanState``): at a few rows a product's fixed cost outweighs
    its arithmetic, and one user's text is a row (benchmarks/README.md, "The web app
    under load"). A snapshot: build a new one after the weights change."""

    @torch.inference_mode()
    def __init__(self, model: CharLSTM) -> None:
        lstm, layers, n = model.lstm, model.config.layers, model.config.hidden
        weight = [getattr(lstm, f"weight_ih_l{k}").detach() for k in range(layers)]
        recurrent = [getattr(lstm, f"weight_hh_l{k}").detach() for k in range(layers)]
        bias = [getattr(lstm, f"bias_ih_l{k}") + getattr(lstm, f"bias_hh_l{k}") for k in range(layers)]
        self.table = torch.addmm(bias[0], model.embed.weight, weight[0].t())
        feeds = list(zip(weight[1:], bias[1:], strict=True)) + [(model.head.weight.detach(), model.head.bias.detach())]
        no_bias = bias[0].new_zeros(4 * n)
        self.products = [RowProduct(torch.cat([w, r]), torch.cat([b, no_bias]))
                         for (w, b), r in zip(feeds, recurrent, strict=True)]
        self.split = [w.shape[0] for w, _ in feeds]  # (each product: what it feeds, then the recurrent part)
        self.hidden = n
        self.tile = cell_tile(n)

    @torch.inference_mode()
    def begin(self, state: State) -> LeanState:
        """(h, c) -> the lean state: with each layer's recurrent part of the next step."""
        h, c = state
        return h, c, torch.stack([p(h[k])[:, s:] for k, (p, s) in enumerate(zip(self.products, self.split,
                                                                                 strict=True))])

    def __call__(self, ids: torch.Tensor, state: State | LeanState) -> tuple[torch.Tensor, LeanState]:
        """ids (batch,) -> logits (batch, vocab) and the next state; ``state`` is a
        ``LeanState``, or an (h, c) that ``begin`` makes one of."""
        h, c, recurrent = state if len(state) == 3 else self.begin(state)
        hs, cs, rs = [], [], []
        into = self.table.index_select(0, ids)
        for k, (product, split) in enumerate(zip(self.products, self.split, strict=True)):
            x, cell = lstm_cell(recurrent[k] + into, c[k], self.hidden, self.tile)
            out = product(x)
            into = out[:, :split]
            hs.append(x)
            cs.append(cell)
            rs.append(out[:, split:])
        return into, (layered(hs), layered(cs), layered(rs))


def layered(parts: list[torch.Tensor]) -> torch.Tensor:
    """Each layer's (rows, size) as one (layers, rows, size): a view for one layer."""
    return parts[0].unsqueeze(0) if len(parts) == 1 else torch.stack(parts)


def lstm_cell(gates: torch.Tensor, c: torch.Tensor, n: int, tile: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The new (h, c) from gates (rows, 4n) in PyTorch's order (input, forget, cell, output),
    on whole tiles of rows (padded), in pieces below ELEMENTWISE_GRAIN elements."""
    rows = gates.shape[0]
    if pad := -rows % tile:
        gates, c = nn.functional.pad(gates, (0, 0, 0, pad)), nn.functional.pad(c, (0, 0, 0, pad))
    # One sigmoid over all four gates where a tile's gates fit in the grain (the cell gate's
    # quarter goes unused, but at a few rows each call costs more than its arithmetic);
    # otherwise one over each half that needs it. Fixed per model, so a row's bits are too.
    whole = tile * 4 * n < ELEMENTWISE_GRAIN
    piece = max(tile, (ELEMENTWISE_GRAIN - 1) // ((4 if whole else 2) * n) // tile * tile)
    if gates.shape[0] <= piece:  # (the common case, kept free of the pieces' bookkeeping)
        h, cell = _cell(gates, c, n, whole)
    else:
        parts = [_cell(gates[lo : lo + piece], c[lo : lo + piece], n, whole)
                 for lo in range(0, gates.shape[0], piece)]
        h, cell = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
    return (h[:rows], cell[:rows]) if pad else (h, cell)


def _cell(gates: torch.Tensor, c: torch.Tensor, n: int, whole: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if whole:
        s = torch.sigmoid(gates)
        i, f, o = s[:, :n], s[:, n : 2 * n], s[:, 3 * n :]
    else:
        i_f = torch.sigmoid(gates[:, : 2 * n])
        i, f, o = i_f[:, :n], i_f[:, n:], torch.sigmoid(gates[:, 3 * n :])
    cell = torch.addcmul(f * c, i, torch.tanh(gates[:, 2 * n : 3 * n]))
    return o * torch.tanh(cell), cell


def zero_streams(state: State, streams: torch.Tensor) -> State:
    """``state`` with the streams where ``streams`` (a (batch,) bool) is true set to zero."""
    keep = (~streams).to(state[0].dtype).view(1, -1, 1)
    return state[0] * keep, state[1] * keep


def detach_state(state: State) -> State:
    """Cut the graph at a chunk boundary but keep the values: truncated BPTT."""
    return state[0].detach(), state[1].detach()
