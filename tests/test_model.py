import pytest
import torch
import torch.nn.functional as F

from chargen.errors import ChargenError
from chargen.model import CharLSTM, ModelConfig, detach_state


def test_state_carry_equals_one_long_chunk():
    """The loss over two chunks with the state carried equals the loss over one chunk of
    twice the length: carrying the state loses nothing in the forward pass."""
    torch.manual_seed(0)
    model = CharLSTM(ModelConfig(vocab_size=30, embedding=8, hidden=32, layers=2, dropout=0.0)).eval()
    ids = torch.randint(0, 30, (41, 3))
    x, y = ids[:-1], ids[1:]

    def loss(logits, target):
        return F.cross_entropy(logits.flatten(0, 1), target.flatten(), reduction="sum")

    whole, _ = model(x)
    first, state = model(x[:20])
    second, _ = model(x[20:], detach_state(state))
    carried = loss(first, y[:20]) + loss(second, y[20:])
    assert torch.allclose(carried, loss(whole, y), rtol=1e-5)
    assert torch.allclose(second, whole[20:], atol=1e-5)
    fresh, _ = model(x[20:])  # dropping the state instead changes the predictions
    assert (fresh - whole[20:]).abs().max() > 1e-3


def test_detach_cuts_the_graph():
    model = CharLSTM(ModelConfig(vocab_size=10, embedding=4, hidden=8, layers=1))
    _, state = model(torch.randint(0, 10, (5, 2)))
    assert state[0].requires_grad
    h, c = detach_state(state)
    assert not h.requires_grad and not c.requires_grad and torch.equal(h, state[0])


def test_shapes_and_pytorchs_own_initialisation():
    """No forget-gate bias of 1: it measured worse (``python -m benchmarks.recipe``)."""
    cfg = ModelConfig(vocab_size=17, embedding=6, hidden=12, layers=3, dropout=0.2)
    model = CharLSTM(cfg)
    logits, (h, c) = model(torch.randint(0, 17, (9, 4)))
    assert logits.shape == (9, 4, 17) and h.shape == (3, 4, 12) and c.shape == (3, 4, 12)
    forget = model.lstm.bias_ih_l0[12:24]
    assert forget.abs().max() <= 12**-0.5 and forget.std() > 0  # uniform(-1/sqrt(hidden), 1/sqrt(hidden))


def test_a_model_needs_a_vocabulary_and_dropout_may_wait():
    with pytest.raises(ChargenError, match="vocabulary"):
        CharLSTM(ModelConfig(hidden=8))
    assert CharLSTM(ModelConfig(vocab_size=5, hidden=8)).drop.p == 0.0  # dropout not chosen yet: none
