import pytest
import torch

import chargen
from chargen import ChargenError, textfile
from chargen.sample import SamplingOptions, draw_race, pick_prepared, prepare, row_options
from chargen.tokenizer import SPECIALS


@pytest.fixture(scope="module")
def model(trained_run):
    return chargen.load(trained_run, device="cpu")


def pick_next(logits: torch.Tensor, temperature: float, top_k: int, top_p: float,
              generator: torch.Generator) -> torch.Tensor:
    """The next ids with the same options for every row, drawn from ``generator``."""
    options = SamplingOptions(temperature, top_k, top_p)
    race = draw_race(logits.shape[0], logits.shape[-1], generator)
    return pick_prepared(logits, prepare(*row_options(options, logits.shape[0], logits.device), logits.shape[-1]),
                         race)


def test_seeded_sampling_repeats(model):
    a = model.generate("the ", 80, seed=5, temperature=1.0)
    b = model.generate("the ", 80, seed=5, temperature=1.0)
    c = model.generate("the ", 80, seed=6, temperature=1.0)
    assert a == b and a != c and len(a) == len("the ") + 80 and a.startswith("the ")


def test_streamed_pieces_join_to_the_text(model):
    pieces = list(model.stream("king", 60, seed=11))
    assert pieces[0] == "king" and len(pieces) == 61 and all(len(p) == 1 for p in pieces[1:])
    assert "".join(pieces) == model.generate("king", 60, seed=11)


def test_a_sample_is_its_prime_then_what_was_drawn(model):
    """One rule everywhere: generate, generate_batch and stream give the prime first, as the
    CLI and the app show it; only a Sampler's pieces (what Continue adds) leave it out."""
    sampler = model.sampler("the ", num_samples=2, seed=4)
    drawn = list(sampler.pieces(30, temperature=1.0))
    assert len(drawn) == 30 and all(len(step[0]) == 1 for step in drawn)
    texts = model.generate_batch("the ", 30, num_samples=2, seed=4, temperature=1.0)
    assert texts == ["the " + t for t in sampler.texts]
    assert model.generate("", 30, seed=4) == "".join(model.stream("", 30, seed=4))  # no prime: nothing added
    assert len(model.generate("", 30, seed=4)) == 30


def test_batch_of_samples(model):
    texts = model.generate_batch("", 50, num_samples=4, seed=1)
    assert len(texts) == 4 and all(len(t) == 50 for t in texts)
    assert len(set(texts)) > 1
    steps = list(model.stream_batch("", 50, num_samples=4, seed=1))
    assert ["".join(s[i] for s in steps) for i in range(4)] == texts


def test_greedy_and_its_equivalents(model):
    greedy = model.generate("and ", 40, temperature=0)
    assert greedy == model.generate("and ", 40, temperature=0, seed=123)
    assert model.generate("and ", 40, top_k=1, seed=9) == greedy
    assert model.generate("and ", 40, top_p=1e-6, seed=9) == greedy


def test_state_is_carried_not_refed(model, monkeypatch):
    """The prime is fed once through nn.LSTM, all but its last character; then each new
    character costs one lean step (the first on the prime's last character), from the
    carried state."""
    from chargen.model import LeanStep

    calls = []
    hook = model.model.lstm.register_forward_hook(lambda m, args, out: calls.append(("lstm", args[0].shape[0])))
    real_step = LeanStep.__call__

    def step(self, ids, state):
        calls.append(("step", tuple(ids.shape)))
        return real_step(self, ids, state)

    monkeypatch.setattr(LeanStep, "__call__", step)
    try:
        model.generate("the king", 30, seed=0)
    finally:
        hook.remove()
    assert calls == [("lstm", len("the king") - 1)] + [("step", (1,))] * 30


def test_never_emits_specials(model):
    text = "".join(model.generate_batch("", 300, num_samples=8, seed=3, temperature=3.0))
    assert not any(s in text for s in SPECIALS)
    assert set(text) <= set(model.tokenizer.chars)


def test_bad_options(model):
    with pytest.raises(ChargenError, match="never saw.*'Z'"):
        model.stream("Zebra", 10)  # refused when asked, not at the first character
    with pytest.raises(ChargenError, match="never saw.*'Z'"):
        model.generate("Zebra", 10)
    with pytest.raises(ChargenError, match="temperature"):
        model.generate("a", 10, temperature=-1)
    with pytest.raises(ChargenError, match="top-p"):
        model.generate("a", 10, top_p=1.5)
    with pytest.raises(ChargenError, match="top-p"):
        model.generate("a", 10, top_p=0)


def test_top_k_and_top_p_filter():
    gen = torch.Generator().manual_seed(0)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]])).repeat(2000, 1)
    picks = pick_next(logits, 1.0, 2, 1.0, gen)
    assert set(picks.tolist()) == {0, 1}
    picks = pick_next(logits, 1.0, 0, 0.7, gen)  # 0.5 + 0.3 reach 0.7: the rest are cut
    assert set(picks.tolist()) == {0, 1}
    picks = pick_next(logits, 1.0, 0, 1.0, gen)
    assert set(picks.tolist()) == {0, 1, 2, 3}


def test_evaluate(model, corpus_file):
    result = model.evaluate(corpus_file.read_text()[-3000:])
    assert result["chars"] == 3000 and result["bpc"] == pytest.approx(result["loss"] / 0.6931471805599453)
    assert 0 < result["bpc"] < 5.2


def test_evaluate_file_reads_in_chunks_and_agrees(model, corpus_file, tmp_path, monkeypatch):
    """A file, read 64 bytes at a time and never as one string, scores as its text does;
    characters the model never saw are named."""
    monkeypatch.setattr(textfile, "CHUNK_BYTES", 64)
    path = tmp_path / "eval.txt"
    path.write_text(corpus_file.read_text()[-3000:])
    assert model.evaluate_file(path) == pytest.approx(model.evaluate(path.read_text()))
    path.write_text("the Zebra and the \u263a\n" * 10)
    with pytest.raises(ChargenError, match="evaluation text has characters the model never saw.*'Z', '☺'"):
        model.evaluate_file(path)


def test_sampler_continues_from_its_own_state(model):
    """Drawing 40 then 60 more from one Sampler is the same text as 100 at once: the LSTM
    state and the random generator are carried between calls, not rebuilt from the text."""
    sampler = model.sampler("the ", num_samples=3, seed=21)
    first = [list(step) for step in sampler.pieces(40, temperature=1.0)]
    assert len(first) == 40 and sampler.texts == ["".join(s[i] for s in first) for i in range(3)]
    more = list(sampler.pieces(60, temperature=1.0))
    assert len(more) == 60
    assert ["the " + t for t in sampler.texts] == model.generate_batch("the ", 100, num_samples=3, seed=21,
                                                                      temperature=1.0)


def test_sampler_checks_options_when_asked(model):
    sampler = model.sampler("the ", seed=1)
    with pytest.raises(ChargenError, match="temperature"):
        sampler.pieces(10, temperature=-1)
    with pytest.raises(ChargenError, match="never saw.*'Z'"):
        model.sampler("Zed")
    assert sampler.texts == [""]  # a refused call drew nothing


def test_lean_step_is_the_models_step(model):
    """LeanStep (weights pulled out once, embedding folded into a table, each layer's
    recurrent part worked out with what its h feeds and carried to the next step) computes
    what the model's forward does, step after step, for every layer (the tiny model has 2)."""
    net = model.model
    assert net.config.layers == 2
    torch.manual_seed(0)
    state = tuple(torch.randn(2, 5, net.config.hidden) for _ in range(2))
    ids = torch.randint(0, net.config.vocab_size, (3, 5))
    step = net.stepper()
    with torch.inference_mode():
        logits, (h, c) = net(ids, state)
        lean_state = state
        for t in range(3):
            lean_logits, lean_state = step(ids[t], lean_state)
            torch.testing.assert_close(lean_logits, logits[t])
        lean_h, lean_c, recurrent = lean_state
        torch.testing.assert_close(recurrent[1], h[1] @ net.lstm.weight_hh_l1.T)
    torch.testing.assert_close(lean_h, h)
    torch.testing.assert_close(lean_c, c)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_lean_sampling_draws_the_reference_samples(model, seed):
    from chargen.sample import Sampler

    texts = []
    for lean in (True, False):
        sampler = Sampler(model.model, model.tokenizer, "the ", num_samples=3, seed=seed, lean=lean)
        list(sampler.pieces(400, temperature=1.0, top_k=20))
        texts.append(sampler.texts)
    assert texts[0] == texts[1]


def test_lean_path_for_few_samples_only(model):
    from chargen.sample import LEAN_MAX_SAMPLES, Sampler

    few = Sampler(model.model, model.tokenizer, "the ", num_samples=LEAN_MAX_SAMPLES)
    many = Sampler(model.model, model.tokenizer, "the ", num_samples=LEAN_MAX_SAMPLES + 1)
    assert few._step is not None and many._step is None
    assert len(model.generate_batch("the ", 20, num_samples=LEAN_MAX_SAMPLES + 1, seed=2)) == LEAN_MAX_SAMPLES + 1


@pytest.mark.parametrize("temperature", [1e-320, 1e-45, 1e-30, 1e30, 1e39, 1e308])
@pytest.mark.parametrize("top_p", [1.0, 1e-320, 1e-9])
def test_any_finite_temperature_and_top_p_draws(temperature, top_p):
    """Temperatures and top-p values beyond float32's range (tiny ones act as greedy, huge ones
    as uniform) never make a NaN distribution, and never draw a banned (-inf) id."""
    logits = torch.tensor([[2.0, -1.0, float("-inf"), 0.5], [float("-inf"), 3.0, 1.0, -2.0]])
    ids = pick_next(logits, temperature, 0, top_p, torch.Generator().manual_seed(0))
    assert ids.shape == (2,) and ids[0] != 2 and ids[1] != 0
    if temperature < 1e-30 or top_p < 1e-6:
        assert ids.tolist() == [0, 1]  # greedy
