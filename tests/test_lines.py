import numpy as np
import pytest
import torch
import torch.nn.functional as F

from chargen import ChargenError, load_corpus, train
from chargen.checkpoint import ITEMS
from chargen.lines import (
    IGNORE,
    LineItems,
    detect_mode,
    epoch_batches,
    epoch_length,
    file_items,
    held_out,
    item_tokenizer,
    padded_share,
)
from chargen.model import CharLSTM, ModelConfig
from chargen.tokenizer import BOS_ID, EOS_ID, PAD_ID, SPECIALS, CharTokenizer
from conftest import config_json, interrupt_at, make_text, name_list, tiny_model, tiny_train


@pytest.fixture
def names_file(tmp_path):
    path = tmp_path / "names.txt"
    path.write_text("\n".join(name_list()) + "\n")
    return path


def split_items(text: str) -> list[str]:
    """What an item is, said in terms of text: one per line that is not blank, without the
    line break (``\\n`` or ``\\r\\n``). Lines mode works it out on ids (``file_items``)."""
    return [line.removesuffix("\r") for line in text.split("\n") if line.strip()]


def items_of(items: list[str], tokenizer: CharTokenizer) -> LineItems:
    """``items`` as the LineItems of a list that holds them, one a line."""
    n_chars = np.array([len(item) for item in items], dtype=np.int64)
    return LineItems(tokenizer.encode("".join(items)), np.cumsum(n_chars) - n_chars, n_chars)


def test_items_skip_blank_lines_and_line_ends():
    text = "Ada\r\n\n  \nBo\nCy"
    tokenizer = CharTokenizer.from_text(text)
    assert list(file_items(tokenizer.encode(text), tokenizer).strings(tokenizer)) == ["Ada", "Bo", "Cy"]


def test_detect_mode():
    assert detect_mode("\n".join(name_list()) + "\n")[0] == "lines"
    assert detect_mode(make_text())[0] == "stream"  # speeches with blank lines between
    prose = " ".join(["the quick brown fox jumps over the lazy dog and runs away"] * 400)
    wrapped = "\n".join(prose[i : i + 70] for i in range(0, len(prose), 70))
    mode, why = detect_mode(wrapped)
    assert mode == "stream" and "run on" in why
    assert detect_mode("one\ntwo\nthree\n") == ("stream", "only 3 non-blank lines")
    assert detect_mode("\n".join(["word " * 100] * 100))[0] == "stream"  # a paragraph per line


def test_validation_items_are_a_fixed_random_sample():
    held = held_out(1000, 0.1)
    assert held.sum() == 100 and not held[-100:].all()  # not the (sorted) tail
    assert np.array_equal(held_out(1000, 0.1), held)
    assert held_out(1000, 0.1, max_items=30).sum() == 30
    with pytest.raises(ChargenError, match="too few"):
        held_out(1, 0.1)


TRICKY = ("\n \t\nAda Lovelace\r\n\r\nBo\tB\n" + "x" * 70 + "\n\u3000\nCy\u2028z\r\n" + "Dee\nE\r" * 5
          + "last line, no break")


@pytest.mark.parametrize("window", [1, 3, 16, 1 << 24])
def test_items_found_in_the_ids_are_those_of_the_text(window):
    """Blank lines (white space only), \r\n line ends, a line longer than the window, a
    last line without a break: the items and their vocabulary, worked out on ids a window
    at a time, are those of ``split_items`` on the text."""
    file_tokenizer = CharTokenizer.from_text(TRICKY)
    items = file_items(file_tokenizer.encode(TRICKY), file_tokenizer, window=window)
    expected = split_items(TRICKY)
    assert list(items.strings(file_tokenizer, block_chars=window)) == expected
    tokenizer = item_tokenizer(file_tokenizer, items, window=window)
    assert tokenizer.chars == sorted(set("".join(expected)))  # not \n, nor \u3000 (blank lines only)
    assert "\r" in tokenizer and " " in tokenizer and "\t" in tokenizer  # these occur inside items
    assert list(items.strings(tokenizer)) == expected  # the ids were recoded in place


def test_every_item_once_per_epoch_and_never_split():
    lengths = np.random.default_rng(1).integers(1, 40, size=1003)
    for factor in (1, 10, 50):
        batches = epoch_batches(lengths, 16, factor, seed=3, epoch=0)
        assert len(batches) == epoch_length(1003, 16, factor)
        flat = np.concatenate(batches)
        assert sorted(flat.tolist()) == list(range(1003))


def test_batches_are_sorted_within_superbatches_and_pad_little():
    lengths = np.random.default_rng(2).integers(1, 200, size=3200)
    batches = epoch_batches(lengths, 32, 50, seed=0, epoch=0)
    # Every batch is a contiguous run of one sorted superbatch: its lengths are in order.
    for b in batches:
        assert (np.diff(lengths[b]) >= 0).all()
    bucketed = padded_share(lengths, batches)
    random = padded_share(lengths, epoch_batches(lengths, 32, 1, seed=0, epoch=0))
    assert bucketed < 0.05 < 0.3 < random


def test_batch_order_repeats_with_a_seed_and_varies_between_epochs():
    lengths = np.random.default_rng(3).integers(1, 50, size=640)
    first = epoch_batches(lengths, 8, 10, seed=5, epoch=0)
    again = epoch_batches(lengths, 8, 10, seed=5, epoch=0)
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    for other in (epoch_batches(lengths, 8, 10, seed=5, epoch=1), epoch_batches(lengths, 8, 10, seed=6, epoch=0)):
        assert [b.tolist() for b in other] != [b.tolist() for b in first]


def test_batch_frames_items_and_pads():
    tokenizer = CharTokenizer.from_text("abc")
    items = items_of(["ab", "c", "abca"], tokenizer)
    x, y = items.batch(np.array([0, 1, 2]))
    assert x.shape == y.shape == (5, 3)
    a, b, c = (tokenizer.id_of(ch) for ch in "abc")
    assert x[:, 0].tolist() == [BOS_ID, a, b, PAD_ID, PAD_ID]
    assert y[:, 0].tolist() == [a, b, EOS_ID, IGNORE, IGNORE]
    assert x[:, 2].tolist() == [BOS_ID, a, b, c, a] and y[:, 2].tolist() == [a, b, c, a, EOS_ID]


def test_padding_never_reaches_loss_or_gradients():
    """Change what the padded positions hold: loss and every gradient stay the same."""
    tokenizer = CharTokenizer.from_text("abcdefgh")
    items = items_of(["abcdefgh", "ab", "cde", "h"], tokenizer)
    x, y = items.batch(np.arange(4))
    torch.manual_seed(0)
    model = CharLSTM(ModelConfig(vocab_size=tokenizer.vocab_size, embedding=8, hidden=16, dropout=0.0))

    def loss_and_grads(inputs):
        model.zero_grad()
        logits, _ = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1), y.flatten(), ignore_index=IGNORE)
        loss.backward()
        return loss.item(), [p.grad.clone() for p in model.parameters()]

    base_loss, base_grads = loss_and_grads(x)
    scrambled = x.clone()
    pad = x == PAD_ID
    scrambled[pad] = torch.randint(len(SPECIALS), tokenizer.vocab_size, (int(pad.sum()),))
    loss, grads = loss_and_grads(scrambled)
    assert pad.any() and loss == base_loss
    for g0, g1 in zip(base_grads, grads, strict=True):
        assert torch.equal(g0, g1)


def test_lines_mode_trains_resumes_and_samples(tmp_path, names_file):
    from chargen import load

    corpus = load_corpus(names_file, mode="auto")
    assert corpus.mode == "lines" and "list" in corpus.source["mode_reason"]
    assert "\n" not in corpus.tokenizer
    config = tiny_train(steps=30, eval_every=10, batch_size=8, bucket_factor=4, base_lr=1e-2, base_batch_size=8)
    run = tmp_path / "run"
    straight = train(corpus, tmp_path / "straight", tiny_model(), config)
    first = train(corpus, run, tiny_model(), config, on_event=interrupt_at(16))
    second = train(corpus, run, None, config, resume=True)
    assert first.stopped == "interrupted" and first.step == 16
    assert second.step == 30 and second.best_val_loss == straight.best_val_loss  # resumed exactly
    vals = [e["val_bpc"] for e in straight.history if e["event"] == "val"]
    assert vals[-1] < vals[0]
    assert first.history[0]["chars_per_s"] > 0
    saved = config_json(run)
    assert saved["mode"] == "lines" and (run / ITEMS).is_file() and saved["default_prime"] == ""

    model = load(run)
    assert model.mode == "lines"
    items = model.generate_batch("", 40, num_samples=20, seed=1, temperature=1.0)
    assert len(items) == 20 and all("\n" not in item and len(item) < 40 for item in items)
    assert all(set(item) <= set(corpus.tokenizer.chars) for item in items)  # no specials, no <unk>
    prefixed = model.generate_batch("Ka", 40, num_samples=3, seed=1)
    assert len(prefixed) == 3 and all(item.startswith("Ka") for item in prefixed)  # an item starts with its prime
    train_items = list(corpus.train_items.strings(corpus.tokenizer))
    assert len(train_items) == len(corpus.train_items) and all(train_items)
    known = model.is_training_item(train_items[:3] + ["Not A Name In The List"])
    assert known == [True, True, True, False]
    val_text = "\n".join(corpus.val_items.strings(corpus.tokenizer))
    result = model.evaluate(val_text)
    val_file = tmp_path / "val.txt"
    val_file.write_bytes(("\r\n \r\n" + val_text.replace("\n", "\r\n\n")).encode())  # CRLF, blank lines
    assert model.evaluate_file(val_file) == pytest.approx(result)
    assert result["items"] == len(corpus.val_items) and result["bpc"] > 0


def test_sampling_stops_at_the_end_token(trained_lines_model):
    model = trained_lines_model
    steps = list(model.stream_batch("", 200, num_samples=4, seed=0))
    assert len(steps) < 200  # every sample ended well before the cap
    for j in range(4):
        text = [step[j] for step in steps]
        ended = text.index("") if "" in text else len(text)
        assert all(piece == "" for piece in text[ended:])  # nothing after the end


@pytest.fixture(scope="module")
def trained_lines_model(tmp_path_factory):
    from chargen import load

    path = tmp_path_factory.mktemp("lines") / "names.txt"
    path.write_text("\n".join(name_list(600, seed=4)) + "\n")
    run = tmp_path_factory.mktemp("runs") / "names"
    train(load_corpus(path, mode="lines"), run, tiny_model(hidden=48, layers=1),
          tiny_train(steps=120, eval_every=60, batch_size=16, base_batch_size=16, base_lr=1e-2))
    return load(run)


def test_resume_refuses_another_mode_or_bucketing(tmp_path, names_file):
    corpus = load_corpus(names_file, mode="lines")
    run = tmp_path / "run"
    train(corpus, run, tiny_model(), tiny_train(steps=4, batch_size=8))
    with pytest.raises(ChargenError, match="trained in lines mode; resume it with --mode lines"):
        train(load_corpus(names_file, mode="stream"), run, None, tiny_train(steps=8, batch_size=8), resume=True)
    with pytest.raises(ChargenError, match="--bucket-factor differs"):
        train(corpus, run, None, tiny_train(steps=8, batch_size=8, bucket_factor=3), resume=True)


def test_a_lines_runs_samples_are_one_line_in_its_log(tmp_path):
    """Eight short items a validation, each on a line of its own, made a 40-second run's log
    hundreds of lines long: they share one line."""
    path = tmp_path / "names.txt"
    path.write_text("\n".join(name_list(300, seed=2)) + "\n")
    lines = []
    train(load_corpus(path, mode="lines"), tmp_path / "run", tiny_model(), tiny_train(steps=12, eval_every=6),
          log=lines.append)
    shown = [line for line in lines if line.startswith("--- sample")]
    assert len(shown) == 2 and all("\n" not in line and line.count(" · ") == 7 for line in shown), shown
