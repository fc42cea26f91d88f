import pytest
import torch
import torch.nn.functional as F

from chargen.errors import ChargenError
from chargen.model import CharLSTM, LockedDropout, ModelConfig, detach_state


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


def test_locked_dropout_keeps_one_mask_for_all_time_steps_of_a_row():
    torch.manual_seed(0)
    drop, ones = LockedDropout(0.5), torch.ones(7, 64, 32)
    dropped = drop(ones)
    assert torch.equal(dropped, dropped[:1].expand_as(dropped))  # every step the same mask
    assert set(dropped.unique().tolist()) == {0.0, 2.0}  # kept values scaled by 1 / (1 - p)
    assert not torch.equal(dropped[0, 0], dropped[0, 1])  # each row its own
    assert 0.4 < (dropped[0] == 0).float().mean() < 0.6
    assert not torch.equal(drop(ones), dropped)  # a new mask each call (each chunk)
    assert torch.equal(drop.eval()(ones), ones) and torch.equal(LockedDropout(0.0)(ones), ones)


def test_the_model_drops_the_same_features_at_every_step_in_training_only():
    """One character repeated: with the mask locked across time, the LSTM's input is the same
    at every step of a row (nn.Dropout's fresh mask per element would differ)."""
    torch.manual_seed(0)
    model = CharLSTM(ModelConfig(vocab_size=5, embedding=16, hidden=8, dropout=0.5))
    seen = []
    model.lstm.register_forward_hook(lambda module, args, out: seen.append(args[0]))
    ids = torch.full((6, 3), 2)
    model.train()(ids)
    into = seen[-1]
    assert torch.equal(into, into[:1].expand_as(into)) and not torch.equal(into[0, 0], model.embed.weight[2])
    model.eval()(ids)
    assert torch.equal(seen[-1], model.embed.weight[2].expand(6, 3, 16))


def test_a_model_needs_a_vocabulary_and_dropout_may_wait():
    with pytest.raises(ChargenError, match="vocabulary"):
        CharLSTM(ModelConfig(hidden=8))
    assert CharLSTM(ModelConfig(vocab_size=5, hidden=8)).drop.p == 0.0  # dropout not chosen yet: none
