"""Streams whose state is reset now and then at a random place: the model must learn to
start from a zero state anywhere, as it does in validation and when it continues a prompt."""

import numpy as np
import pytest
import torch

import chargen
from benchmarks.cold_starts import cold_starts, stream_losses
from chargen import feeds, load_corpus, train
from chargen.corpus import eval_streams
from chargen.distributed import SINGLE, Ranks
from chargen.evaluate import evaluate_streams
from chargen.feeds import RESET_CHARS, Batch, StreamFeed
from chargen.model import CharLSTM
from chargen.train import starting_state
from chargen.trainer_state import Progress
from conftest import tiny_model, tiny_train


def stream_feed(corpus_file, batch_size: int = 8, ranks: Ranks = SINGLE) -> StreamFeed:
    corpus = load_corpus(corpus_file)
    return StreamFeed(corpus.train_ids, corpus.val_ids, batch_size, 16, False, "cpu", ranks)


def fresh_draws(feed: StreamFeed, steps: int, seed: int = 3) -> list[np.ndarray]:
    rng, progress = np.random.default_rng(seed), Progress()
    draws = []
    for _ in range(steps):
        fresh = feed.next(progress, rng).fresh
        draws.append(np.zeros(feed.streams.n_streams, bool) if fresh is None else fresh.numpy())
    return draws


def test_streams_are_reset_at_the_rate_of_their_characters(corpus_file):
    draws = np.array(fresh_draws(stream_feed(corpus_file), 4000))
    expected = 16 / (16 + RESET_CHARS)  # (the feed's chunks are 16 characters)
    assert draws.mean() == pytest.approx(expected, rel=0.25)
    assert draws.any(axis=0).all()  # every stream is reset some time, at places of its own
    assert len({tuple(np.flatnonzero(column)) for column in draws.T}) == draws.shape[1]


def test_the_resets_are_the_same_on_a_rerun_and_split_between_ranks(corpus_file):
    whole = np.array(fresh_draws(stream_feed(corpus_file), 2000))
    assert np.array_equal(whole, np.array(fresh_draws(stream_feed(corpus_file), 2000)))
    halves = [np.array(fresh_draws(stream_feed(corpus_file, ranks=Ranks(rank, 2)), 2000)) for rank in (0, 1)]
    assert np.array_equal(np.concatenate(halves, axis=1), whole)


def test_a_batch_starts_from_the_carried_state_with_its_fresh_streams_zeroed():
    h, c = torch.randn(2, 4, 3), torch.randn(2, 4, 3)
    fresh = torch.tensor([False, True, False, True])
    x = torch.zeros(5, 4, dtype=torch.long)
    start = starting_state(Batch(x, x, 20, 1.0, False, fresh=fresh), (h, c))
    for before, after in zip((h, c), start, strict=True):
        assert torch.equal(after[:, fresh], torch.zeros(2, 2, 3))
        assert torch.equal(after[:, ~fresh], before[:, ~fresh])
    assert starting_state(Batch(x, x, 20, 1.0, True, fresh=fresh), (h, c)) is None  # an epoch starts
    assert starting_state(Batch(x, x, 20, 1.0, False), (h, c)) == (h, c)


def test_training_zeroes_the_state_of_the_fresh_streams(tmp_path, corpus_file, monkeypatch):
    """The trainer hands the model each chunk's state with the fresh streams zeroed and the
    rest carried."""
    monkeypatch.setattr(feeds, "RESET_CHARS", 64)  # resets at most steps
    fresh_at, states_at = [], []
    next_batch, forward = StreamFeed.next, CharLSTM.forward

    def spy_next(self, progress, rng):
        batch = next_batch(self, progress, rng)
        fresh_at.append(None if batch.new_epoch else batch.fresh)
        return batch

    def spy_forward(self, x, state=None):
        if self.training:
            states_at.append(None if state is None else state[0].detach().clone())
        return forward(self, x, state)

    monkeypatch.setattr(StreamFeed, "next", spy_next)
    monkeypatch.setattr(CharLSTM, "forward", spy_forward)
    train(load_corpus(corpus_file), tmp_path / "run", tiny_model(), tiny_train(steps=30, eval_every=1000))
    checked = 0
    for fresh, h in zip(fresh_at, states_at, strict=True):
        if fresh is not None and h is not None and not fresh.all():
            assert torch.count_nonzero(h[:, fresh]) == 0
            assert torch.count_nonzero(h[:, ~fresh]) == h[:, ~fresh].numel()
            checked += 1
    assert checked >= 5


def test_the_cold_start_benchmark_scores_as_chargen_validates(trained_run, corpus_file):
    """benchmarks.cold_starts's losses are chargen's own: its validation streams' mean is
    ``evaluate_streams``'s figure; a model scored against itself derails nowhere."""
    trained = chargen.load(trained_run)
    ids = np.asarray(trained.tokenizer.encode(corpus_file.read_text(encoding="utf-8")[-20_000:]), dtype=np.int64)
    streams = eval_streams(ids)
    assert stream_losses(trained.model, streams.data.long()).mean().item() == pytest.approx(
        evaluate_streams(trained.model, streams), rel=1e-5)
    carried = stream_losses(trained.model, torch.from_numpy(ids).view(1, -1))[0]
    found = cold_starts(trained.model, ids, carried)
    assert found["derailed"] == 0 and found["cold_first_32"] > found["cold_late"] > 0
