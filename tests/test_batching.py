"""The shared sampling loop (chargen.batching): many generations stepped as one batch, each
drawing the text it draws alone, joining and leaving at any step, within bounds."""

import asyncio
import os
import random
import subprocess
import sys
import threading
import time

import pytest
import torch

import chargen
from chargen import ChargenError
from chargen.batching import Generation, SharedLoop
from chargen.model import CharLSTM, ModelConfig, cell_tile
from chargen.sample import DEFAULTS, SamplingOptions
from chargen.serving import Service
from conftest import shelf_of_models

ASKS = [  # (prime, samples, seed, options): every option and a mix of lengths
    ("the ", 1, 1, SamplingOptions(1.0, 0, 1.0, 150)),
    ("king", 3, 2, SamplingOptions(0.8, 5, 1.0, 90)),
    ("a", 1, 3, SamplingOptions(1.3, 0, 0.9, 200)),
    ("the king ", 2, 4, SamplingOptions(0.0, 0, 1.0, 60)),
    ("and ", 8, 5, SamplingOptions(1.0, 20, 0.95, 120)),
    ("to", 1, 6, SamplingOptions(0.6, 0, 1.0, 40)),
]


@pytest.fixture(scope="module")
def model(trained_run):
    return chargen.load(trained_run, device="cpu")


def alone(model, prime, n, seed, options) -> list[str]:
    sampler = model.sampler(prime, num_samples=n, seed=seed)
    list(sampler.pieces(options.length, options.temperature, options.top_k, options.top_p))
    return sampler.texts


def wait_until(condition, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def finish(generation: Generation, timeout: float = 60.0) -> list[str]:
    assert generation.wait_done(timeout), "the generation hung"
    return generation.sampler.texts


class Counted:
    """A loop's step that records the rows of every tick, slowed down (``pause`` seconds a
    tick) so that generations started a little apart are in the loop together."""

    def __init__(self, step, pause: float = 0.0) -> None:
        self.step, self.pause, self.rows = step, pause, []

    def __call__(self, ids, state):
        self.rows.append(len(ids))
        time.sleep(self.pause)
        return self.step(ids, state)


def ask(model, prime, n, seed, options) -> Generation:
    return Generation(model.sampler(prime, num_samples=n, seed=seed), options)


def test_each_text_is_the_text_it_draws_alone_whatever_joins_or_leaves(model):
    """Six generations of different primes, sample counts, lengths and options join a running
    loop at staggered steps and leave as they finish (one is stopped midway): every text is,
    character for character, what the same seed draws alone."""
    step = Counted(model.stepper(), pause=0.001)
    loop = SharedLoop(step)
    generations = []
    for prime, n, seed, options in ASKS:
        generations.append(loop.submit(ask(model, prime, n, seed, options)))
        ticks = len(step.rows)
        wait_until(lambda t=ticks: len(step.rows) >= t + 7)  # (joins at some later step)
    stopped = loop.submit(ask(model, "the ", 2, 9, SamplingOptions(1.0, 0, 1.0, 3000)))
    wait_until(lambda: stopped.steps >= 30)
    stopped.cancel()
    for generation, (prime, n, seed, options) in zip(generations, ASKS, strict=True):
        assert finish(generation) == alone(model, prime, n, seed, options), (prime, seed)
    finish(stopped)
    assert stopped.status == "cancelled" and 30 <= stopped.steps < 3000
    assert stopped.sampler.texts == alone(model, "the ", 2, 9, SamplingOptions(1.0, 0, 1.0, stopped.steps))
    assert max(step.rows) >= 1 + 3 + 1 + 2  # four or more of them were stepped as one batch


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize(("hidden", "layers"), [(24, 2), (37, 2), (50, 1), (128, 3), (301, 1), (512, 1), (1024, 1)])
def test_a_row_computes_the_same_in_any_batch(hidden, layers, threads):
    """The lean step: a row's logits and state are bit for bit the same alone and at any
    place in batches of any size, for the served sizes and for hidden sizes whose cells need
    tiles of several rows, on one thread and on several."""
    torch.manual_seed(hidden)
    net = CharLSTM(ModelConfig(vocab_size=70, embedding=16, hidden=hidden, layers=layers)).eval()
    step = net.stepper()
    assert step.tile == cell_tile(hidden) and (step.tile * hidden) % 32 == 0
    rows, was = 70, torch.get_num_threads()
    ids = torch.randint(0, 70, (rows,))
    state = tuple(torch.randn(layers, rows, hidden) for _ in range(2))
    torch.set_num_threads(threads)
    try:
        with torch.inference_mode():
            whole_logits, whole = step(ids, step(ids, state)[1])  # (the second step on the carried state)
            for lo, hi in [(0, 1), (5, 6), (3, 20), (64, 70), (9, 17), (0, 33)]:
                logits, part = step(ids[lo:hi], step(ids[lo:hi], tuple(s[:, lo:hi] for s in state))[1])
                assert torch.equal(logits, whole_logits[lo:hi]), (lo, hi)
                assert all(torch.equal(p, w[:, lo:hi]) for p, w in zip(part, whole, strict=True))
    finally:
        torch.set_num_threads(was)


def test_lines_mode_rows_end_at_their_own_end(trained_run, tmp_path):
    """In lines mode each item ends at its own <eos>: in the loop, as alone."""
    shelf_of_models(tmp_path, trained_run)
    names = chargen.load(tmp_path / "models" / "names", device="cpu")
    loop = SharedLoop(names.stepper())
    options = SamplingOptions(1.0, 0, 1.0, 40)
    together = [loop.submit(ask(names, "", n, seed, options)) for n, seed in [(6, 1), (3, 2), (1, 3)]]
    for generation, (n, seed) in zip(together, [(6, 1), (3, 2), (1, 3)], strict=True):
        texts = finish(generation)
        assert texts == alone(names, "", n, seed, options)
        assert all(generation.sampler.ended) or generation.steps == 40


def test_rows_are_bounded_then_requests_wait_then_they_are_refused(model):
    loop = SharedLoop(model.stepper(), max_rows=4, max_waiting=1)
    long = SamplingOptions(1.0, 0, 1.0, 100_000)
    running = [loop.submit(ask(model, "the ", 2, s, long)) for s in (1, 2)]
    wait_until(lambda: loop.rows == 4)
    waiting = loop.submit(ask(model, "the ", 1, 3, long))
    with pytest.raises(ChargenError, match="busy.*Try again"):
        loop.submit(ask(model, "the ", 1, 4, long))
    with pytest.raises(ChargenError, match="more than this server steps"):
        loop.submit(ask(model, "the ", 5, 4, long))
    wait_until(lambda: running[0].steps >= 5)
    assert waiting.status == "waiting" and loop.rows == 4
    running[0].cancel()
    wait_until(lambda: waiting.status != "waiting")
    assert waiting.status == "running" and running[0].status == "cancelled"
    for g in (running[1], waiting):
        g.cancel()
        finish(g)


def test_a_failing_step_fails_its_generations_and_the_loop_goes_on(model):
    real = model.stepper()
    calls = []

    def step(ids, state):
        calls.append(len(ids))
        if len(calls) == 3:
            raise RuntimeError("out of memory")
        return real(ids, state)

    loop = SharedLoop(step)
    failed = loop.submit(ask(model, "the ", 1, 1, SamplingOptions(1.0, 0, 1.0, 50)))
    finish(failed)
    assert failed.status == "failed" and "out of memory" in failed.error
    after = loop.submit(ask(model, "the ", 1, 1, SamplingOptions(1.0, 0, 1.0, 20)))
    assert finish(after) == alone(model, "the ", 1, 1, SamplingOptions(1.0, 0, 1.0, 20))


def test_the_loops_thread_ends_when_idle_and_starts_again(model):
    loop = SharedLoop(model.stepper(), idle_seconds=0.05)
    finish(loop.submit(ask(model, "the ", 1, 1, SamplingOptions(1.0, 0, 1.0, 10))))
    wait_until(lambda: loop._thread is None, timeout=10)
    assert len(finish(loop.submit(ask(model, "the ", 1, 2, SamplingOptions(1.0, 0, 1.0, 10))))[0]) == 10


def test_a_finished_row_leaves_a_copy_of_its_state_not_the_batch(model):
    """A sampler that has left the loop holds its own rows' state, not a view of the batch's
    (a session kept for an hour would otherwise keep every batch it was in)."""
    loop = SharedLoop(model.stepper())
    short, long = ask(model, "the ", 1, 1, SamplingOptions(1.0, 0, 1.0, 5)), ask(model, "the ", 8, 2, DEFAULTS)
    loop.submit(long)
    loop.submit(short)
    finish(short)
    long.cancel()
    finish(long)
    for part in short.sampler.state:
        assert part.shape[1] == 1 and part.untyped_storage().nbytes() == part.numel() * part.element_size()


@pytest.fixture(scope="module")
def service(tmp_path_factory, trained_run):
    base = tmp_path_factory.mktemp("batching")
    shelf_of_models(base, trained_run)
    (base / "corpora").mkdir()
    return Service(base / "models", base / "runs", base / "corpora")


def test_many_sessions_stream_at_once_in_asyncio_without_a_thread_each(service):
    """What the app does: 48 sessions' generations, each an ``async for`` on the event loop,
    served by the one sampling loop; each text is its seed's text alone, and no thread is
    added per session (only the loop's, and asyncio's few workers that feed the primes)."""
    model = service.shelf.get("shakespeare")
    sessions = 48

    async def one(seed: int) -> str:
        updates = [text async for text, _ in service.generate("shakespeare", "the ", 80 + seed, 1.0, 0, 1.0, seed, 1)]
        return updates[-1]

    async def everyone() -> tuple[list[str], int]:
        tasks = [asyncio.ensure_future(one(seed)) for seed in range(sessions)]
        await asyncio.sleep(0.2)
        threads = threading.active_count()
        return await asyncio.gather(*tasks), threads

    before = threading.active_count()
    texts, during = asyncio.run(everyone())
    assert during <= before + 1 + min(32, (os.cpu_count() or 1) + 4) < before + sessions
    for seed, text in enumerate(texts):
        assert text == "the " + alone(model, "the ", 1, seed, SamplingOptions(1.0, 0, 1.0, 80 + seed))[0]


def test_a_slow_reader_still_gets_the_whole_text_last(service):
    """A page that takes its time with each update (Gradio sending it) still gets the whole
    text as its last update, however far the loop got meanwhile."""
    model = service.shelf.get("shakespeare")
    for length in (20, 300):
        updates = []
        for text, _ in service.generate("shakespeare", "the ", length, 1.0, 0, 1.0, 4, 1):
            updates.append(text)
            time.sleep(0.1)
        assert updates[-1] == "the " + alone(model, "the ", 1, 4, SamplingOptions(1.0, 0, 1.0, length))[0]


def test_stop_then_continue_is_one_text(service):
    """Stopped after some characters and continued, a text is the one drawn in one go."""
    stream = service.generate("shakespeare", "king ", 3000, 1.0, 0, 1.0, 11, 1)
    updates = [next(stream) for _ in range(3)]
    stream.close()
    writing = updates[-1][1]
    drawn = len(writing.sampler.texts[0])
    assert 0 < drawn < 3000
    *_, (whole, _) = service.continue_(writing, "shakespeare", 100, 1.0, 0, 1.0)
    model = service.shelf.get("shakespeare")
    taken = len(writing.sampler.texts[0])
    assert taken >= drawn + 100 and whole == "king " + alone(model, "king ", 1, 11,
                                                                 SamplingOptions(1.0, 0, 1.0, taken))[0]


def test_requests_in_random_order_from_threads_draw_their_own_texts(model):
    loop = SharedLoop(model.stepper(), max_rows=16)
    rng = random.Random(0)
    asks = [(rng.choice(["the ", "a", "king "]), rng.randint(1, 3), seed,
             SamplingOptions(rng.choice([0.0, 0.7, 1.2]), rng.choice([0, 3]), rng.choice([1.0, 0.8]),
                             rng.randint(5, 120))) for seed in range(16)]
    results = {}

    def user(i):
        time.sleep(rng.random() * 0.05)
        results[i] = finish(loop.submit(ask(model, *asks[i])))

    threads = [threading.Thread(target=user, args=(i,)) for i in range(len(asks))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [results[i] for i in range(len(asks))] == [alone(model, *a) for a in asks]


def test_the_process_exits_cleanly_with_a_generation_running(trained_run):
    """At exit the loops are closed: a thread still inside torch when the interpreter ends
    would abort the process ("terminate called without an active exception")."""
    code = ("import time, chargen\n"
            "from chargen.batching import Generation, SharedLoop\n"
            "from chargen.sample import SamplingOptions\n"
            f"model = chargen.load({str(trained_run)!r}, device='cpu')\n"
            "loop = SharedLoop(model.stepper())\n"
            "g = loop.submit(Generation(model.sampler('the ', num_samples=8, seed=1), "
            "SamplingOptions(1.0, 0, 1.0, 10_000_000)))\n"
            "time.sleep(0.5)\n"
            "print('stepping', g.steps > 0)\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "stepping True" in done.stdout, done.stderr[-500:]
    assert "terminate" not in done.stderr
