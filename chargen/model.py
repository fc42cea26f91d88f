"""The model: embedding -> multi-layer LSTM -> linear head over the vocabulary."""

from __future__ import annotations

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


class LeanStep:
    """One time step of a ``CharLSTM`` in eval mode, for sampling a character at a time.

    Per character, ``nn.LSTM`` costs far more in call overhead (argument checks, weight
    flattening, the general multi-step kernel) than in arithmetic. Here the weights are
    pulled out once: the embedding is folded into the first layer's input weights and both
    biases (a table of vocabulary x 4·hidden, so that product becomes a row lookup), and a
    step is one ``addmm`` per layer, the gate nonlinearities and one ``addmm`` for the head.
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

    def __call__(self, ids: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """ids (batch,) -> logits (batch, vocab) and the next state."""
        h, c = state
        hs, cs = [], []
        x = None
        for k in range(len(self.recurrent)):
            if k == 0:
                gates = torch.addmm(self.table[ids], h[0], self.recurrent[0])
            else:
                gates = torch.addmm(torch.addmm(self.bias[k], x, self.weight[k]), h[k], self.recurrent[k])
            n = self.hidden  # PyTorch's gate order: input, forget, cell, output
            i_f = torch.sigmoid(gates[:, : 2 * n])
            cell = i_f[:, n:] * c[k] + i_f[:, :n] * torch.tanh(gates[:, 2 * n : 3 * n])
            x = torch.sigmoid(gates[:, 3 * n :]) * torch.tanh(cell)
            hs.append(x)
            cs.append(cell)
        return torch.addmm(self.head_bias, x, self.head_weight), (torch.stack(hs), torch.stack(cs))


def detach_state(state: State) -> State:
    """Cut the graph at a chunk boundary but keep the values: truncated BPTT."""
    return state[0].detach(), state[1].detach()
