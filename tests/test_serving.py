"""The serving layer without a server: what the app's handlers do, called as plain methods
(the live app, driven over HTTP and in a browser, is test_app.py)."""

import json
import math
import os
import re
import threading
import time
from pathlib import Path

import pytest

from chargen import ChargenError
from chargen.serving import AUTO, BUSY, SCRATCH, Limits, Service, TextStream, Writing
from conftest import config_json, make_text, name_list, shelf_of_models


@pytest.fixture(scope="module")
def service(tmp_path_factory, trained_run):
    """models/ holds a stream model ("shakespeare") and a lines model ("names"); corpora/
    one small text; training limits low enough for tests."""
    base = tmp_path_factory.mktemp("serving")
    shelf_of_models(base, trained_run)
    (base / "corpora").mkdir()
    (base / "corpora" / "tiny.txt").write_text(make_text(200, seed=3))
    return Service(base / "models", base / "runs", base / "corpora",
                   Limits(min_train_seconds=1, max_train_seconds=120, max_upload_mb=1), poll=0.05)


def text_of(pieces) -> str:
    *_, (text, _) = pieces
    return text


def generate(service, model="shakespeare", prime="the ", length=100, seed=5, num_samples=1, temperature=1.0,
             top_k=0, top_p=1.0):
    return service.generate(model, prime, length, temperature, top_k, top_p, seed, num_samples)


def test_the_shelf_offers_model_folders_by_name(service):
    assert service.shelf.names()[:2] == ["names", "shakespeare"] and service.shelf.default() == "shakespeare"
    card, hint = service.describe("names")
    assert "lines" in card.lower() or "items" in card.lower()
    assert hint and service.describe("shakespeare")[1] != hint
    for bad in ("../models/shakespeare", "nope", None, 3):
        with pytest.raises(ChargenError, match="unknown model"):
            service.describe(bad)


def test_a_model_is_loaded_once_and_again_when_its_weights_change(service):
    first = service.shelf.get("shakespeare")
    assert service.shelf.get("shakespeare") is first
    weights = service.shelf.folders()["shakespeare"] / "model.safetensors"
    stamp = weights.stat().st_mtime
    os.utime(weights, (stamp + 5, stamp + 5))
    assert service.shelf.get("shakespeare") is not first


def test_generate_streams_a_growing_text(service):
    updates = [text for text, _ in generate(service, length=400)]
    assert updates[-1].startswith("the ") and len(updates[-1]) == len("the ") + 400
    assert all(b.startswith(a) for a, b in zip(updates, updates[1:], strict=False))


def test_the_seed_decides_the_text(service):
    a, b = text_of(generate(service, seed=17)), text_of(generate(service, seed=17))
    assert a == b and a != text_of(generate(service, seed=18))
    assert text_of(generate(service, seed=-1)) != text_of(generate(service, seed=-1))


def test_continue_carries_the_state(service):
    *_, (first, writing) = generate(service, prime="king ", seed=3, length=100)
    continued = text_of(service.continue_(writing, "shakespeare", 150, 1.0, 0, 1.0))
    assert continued.startswith(first) and continued == text_of(generate(service, prime="king ", seed=3, length=250))


def test_lines_models_continue_with_a_new_round_of_items(service):
    *_, (text, writing) = generate(service, model="names", prime="", num_samples=6, length=40)
    items = text.split("\n")
    assert len(items) == 6 and all(len(item) <= 40 for item in items)
    more = text_of(service.continue_(writing, "names", 40, 1.0, 0, 1.0)).split("\n")
    assert len(more) == 12 and more[:6] == items and writing.rounds == 2
    several = text_of(generate(service, num_samples=3, length=30))
    assert several.count("--- sample") == 3


def test_continue_needs_a_text_of_the_same_model(service):
    with pytest.raises(ChargenError, match="press Generate first"):
        service.continue_(None, "shakespeare", 10, 1.0, 0, 1.0)
    *_, (_, writing) = generate(service, length=10)
    with pytest.raises(ChargenError, match="model changed"):
        service.continue_(writing, "names", 10, 1.0, 0, 1.0)


@pytest.mark.parametrize("change, message", [
    ({"model": "../../etc/passwd"}, "unknown model"),
    ({"prime": "x" * 5000}, "longer than"),
    ({"prime": 12}, "must be text"),
    ({"prime": "\u263a"}, "never saw"),
])
def test_bad_requests_are_refused_before_anything_streams(service, change, message):
    with pytest.raises(ChargenError, match=message):
        generate(service, **change)


@pytest.mark.parametrize("length, temperature, top_k, top_p, expected", [
    (10**9, 9.0, 10**6, 7.0, (3000, 2.0, 1000, 1.0)),
    (-5, -3.0, -1, 0.0, (1, 0.0, 0, 0.01)),
    (None, math.nan, "x", True, (500, 0.8, 0, 1.0)),
])
def test_sampling_values_are_clamped_whatever_the_client_sends(service, length, temperature, top_k, top_p,
                                                               expected):
    options = service.options(length, temperature, top_k, top_p)
    assert (options.length, options.temperature, options.top_k, options.top_p) == expected


def test_one_generation_at_a_time_per_text(service):
    """Continue pressed again while the text is still growing is refused, not run on the
    same sampler at once; the lock is let go when a generation ends or is cancelled."""
    first = generate(service, length=3000)  # (still growing when Continue is pressed)
    _, writing = next(first)
    with pytest.raises(ChargenError, match="still being generated"):
        next(service.continue_(writing, "shakespeare", 10, 1.0, 0, 1.0))
    first.close()  # what a cancel does
    assert not writing.busy
    text = text_of(service.continue_(writing, "shakespeare", 10, 1.0, 0, 1.0))
    drawn = len(text) - len("the ")
    assert drawn >= 11 and text == text_of(generate(service, length=drawn))  # one text, from one sampler


def test_only_one_of_many_threads_draws_from_a_text(service):
    """A server runs handlers in threads: of many generations started on one text at the
    same moment, exactly one draws, and the others get the busy message."""
    model = service.shelf.get("shakespeare")
    writing = Writing("shakespeare", "the ", model.sampler("the ", seed=1), 1)
    start, outcomes, running = threading.Barrier(8), [], []

    def press():
        pieces = TextStream(service.loop(model), writing, service.options(3000, 1.0, 0, 1.0))
        start.wait()
        try:
            next(pieces)
            running.append(pieces)
            outcomes.append("drew")
        except ChargenError as e:
            outcomes.append("busy" if str(e) == BUSY else str(e))

    threads = [threading.Thread(target=press) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert sorted(outcomes) == ["busy"] * 7 + ["drew"]
    for pieces in running:
        pieces.close()
    assert not writing.busy


def test_a_training_runs_to_its_end_and_joins_the_shelf(service):
    views = service.train("page-a", None, "tiny.txt", "tiny (1x128)", 3, "short")
    first = next(views)
    assert "runs/short" in first.status and "stream mode" in first.status and not first.finished
    *_, last = views
    assert last.finished and "runs/short" in last.status and "bits/char" in last.status, last.status
    assert len(last.curve) > 1 and all(bpc > 0 for _, bpc in last.curve)  # (the training loss, every few steps)
    assert re.match(r"step [\d,]+ \(validation \d\.\d{3} bits/char\):\n", last.samples), last.samples
    assert "runs/short" in service.shelf.names()
    assert len(text_of(generate(service, model="runs/short", prime="The ", length=30))) == len("The ") + 30


def test_a_training_can_start_from_a_model_on_the_shelf(service, tmp_path):
    """'Start from' fine-tunes a shelf model in its own size and mode (a list of names read
    as a stream, as the stream model was trained), and config.json says where it started."""
    upload = tmp_path / "names.txt"
    upload.write_text("\n".join(name_list(1000)) + "\n")
    views = service.train("page-a", str(upload), None, AUTO, 2, "tuned", "shakespeare")
    first = next(views)
    assert "fine-tuning shakespeare, its size 2x24" in first.status and "stream mode" in first.status, first.status
    *_, last = views
    assert last.finished and "bits/char" in last.status, last.status
    saved = config_json(service.shelf.runs_dir / "tuned")
    assert saved["init_from"]["path"] == str(service.shelf.folders()["shakespeare"])
    assert (saved["model"]["layers"], saved["model"]["hidden"]) == (2, 24)
    with pytest.raises(ChargenError, match="unknown model 'nope' to start from"):
        service.train("page-a", None, "tiny.txt", AUTO, 2, "never", "nope")
    *_, last = service.train("page-a", None, "tiny.txt", "tiny (1x128)", 3, "scratch2", SCRATCH)
    assert "init_from" not in config_json(service.shelf.runs_dir / "scratch2")


def test_the_auto_size_is_the_default_and_says_what_it_chose(service):
    from chargen.autosize import LADDER
    from chargen.serving import AUTO, PRESETS

    assert next(iter(PRESETS)) == AUTO
    *_, last = service.train("page-a", None, "tiny.txt", AUTO, 2, "auto")
    saved = json.loads((service.shelf.runs_dir / "auto" / "config.json").read_text())
    size = (saved["model"]["layers"], saved["model"]["hidden"])
    assert size in LADDER and f"({size[0]}x{size[1]}, dropout" in last.status, last.status


def test_one_training_at_a_time_and_only_its_page_stops_it(service, tmp_path):
    upload = tmp_path / "mine.txt"
    upload.write_text(make_text(300, seed=4))
    views = service.train("page-a", str(upload), None, "tiny (1x128)", 100, "stopped")
    next(views)
    with pytest.raises(ChargenError, match="already running"):
        service.train("page-b", None, "tiny.txt", "tiny (1x128)", 5, "second")
    assert "another page" in service.stop_training("page-b")
    for view in views:  # (until a step is logged: stopped before its first step, the run would save step 0)
        if "· loss" in view.status:
            break
    assert "Stopping" in service.stop_training("page-a")
    *_, last = views
    assert last.finished and "stopped at step" in last.status, last.status
    assert config_json(service.shelf.runs_dir / "stopped")["summary"]["step"] > 0
    assert service.stop_training("page-a") == "No training is running."


def test_bad_training_requests_are_refused(service, tmp_path):
    binary, big = tmp_path / "data.bin", tmp_path / "big.txt"
    binary.write_bytes(bytes(range(256)))
    big.write_text("x" * 1_100_000)
    for args, message in [
        ((None, "../secret.txt", "tiny (1x128)", 10, ""), "shipped corpus"),
        ((None, "tiny.txt", "huge", 10, ""), "unknown model size"),
        ((None, "tiny.txt", "tiny (1x128)", 10, "../../x"), "run name"),
        ((str(binary), None, "tiny (1x128)", 10, ""), r"\.txt"),
        ((str(big), None, "tiny (1x128)", 10, ""), "over 1 MB"),
    ]:
        with pytest.raises(ChargenError, match=message):
            service.train("page-a", *args)
    (service.shelf.runs_dir / "taken").mkdir(parents=True, exist_ok=True)
    with pytest.raises(ChargenError, match="exists already"):
        service.train("page-a", None, "tiny.txt", "tiny (1x128)", 10, "taken")
    assert not service.job.busy()


def test_the_device_models_generate_on_is_checked_at_start(tmp_path):
    import subprocess
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("CUDA is here")
    with pytest.raises(ChargenError, match="no CUDA GPU"):
        Service(tmp_path, tmp_path, tmp_path, device="cuda")
    app = Path(__file__).resolve().parents[1] / "app.py"
    env = os.environ | {"GRADIO_ANALYTICS_ENABLED": "False", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, str(app), "--device", "cuda", "--port", "1"], capture_output=True,
                          text=True, timeout=120, env=env)
    assert done.returncode == 2 and "no CUDA GPU" in done.stderr and "Traceback" not in done.stderr


def test_continue_stays_with_the_model_the_text_was_started_on(service):
    """A model reloaded under the same name (a run still writing checkpoints) does not
    change a text midway: Continue goes on with the weights, and in the sampling loop, that
    the text was started with."""
    *_, (_, writing) = generate(service, length=20)
    started = writing.model
    weights = service.shelf.folders()["shakespeare"] / "model.safetensors"
    stamp = weights.stat().st_mtime
    os.utime(weights, (stamp + 7, stamp + 7))
    assert service.shelf.get("shakespeare") is not started
    stream = service.continue_(writing, "shakespeare", 10, 1.0, 0, 1.0)
    assert stream.loop is service.loop(started)
    assert len(text_of(stream)) == len("the ") + 30


def test_any_file_name_makes_a_run_name_and_an_upload_is_not_kept(service, tmp_path):
    """An upload named with spaces and accents, and no run name: a safe, unique name comes
    out; the upload is read into the run and deleted; the run records its name alone."""
    upload = tmp_path / "gradio" / "0123abcd" / "mes données.txt"  # (as Gradio keeps an upload)
    upload.parent.mkdir(parents=True)
    upload.write_text(make_text(200, seed=5))
    *_, last = service.train("page-a", str(upload), None, "tiny (1x128)", 3, "")
    assert last.finished and "bits/char" in last.status, last.status
    run = next(service.shelf.runs_dir.glob("mes-donnees-*"))
    assert not upload.exists() and not upload.parent.exists()
    assert config_json(run)["corpus"]["path"] == "mes données.txt"
    assert str(tmp_path) not in service.describe(f"runs/{run.name}")[0]


def test_a_run_that_died_before_its_first_checkpoint_gives_its_name_up(service):
    dead = service.shelf.runs_dir / "dead"
    dead.mkdir(parents=True)
    record = {k: v for k, v in config_json(service.shelf.models_dir / "shakespeare").items() if k != "exported"}
    (dead / "config.json").write_text(json.dumps(record))  # (a run's record, no weights yet)
    (dead / "notes.txt").write_text("not chargen's\n")
    *_, last = service.train("page-a", None, "tiny.txt", "tiny (1x128)", 1, "dead")
    assert last.finished and "runs/dead" in service.shelf.names(), last.status
    assert (dead / "notes.txt").read_text() == "not chargen's\n"
    with pytest.raises(ChargenError, match="a run named 'dead' exists already"):  # (it has weights now)
        service.train("page-a", None, "tiny.txt", "tiny (1x128)", 1, "dead")


def test_messages_to_visitors_carry_no_server_path(service):
    models, runs = service.shelf.models_dir.resolve(), service.shelf.runs_dir.resolve()
    assert service.public(f"{models}/x/model.safetensors is a Git LFS pointer") == \
        "models/x/model.safetensors is a Git LFS pointer"
    assert service.public(f"{runs}/r/config.json: model: bad") == "runs/r/config.json: model: bad"
    assert service.public("/tmp/gradio/ab12/mine.txt is empty; 3/4 at 20 chars/s") == \
        "mine.txt is empty; 3/4 at 20 chars/s"


def test_one_seed_domain_and_no_seed_wraps(service):
    """Seeds are 0 to 2^32-1 in the app as in the CLI and the page: s and s + 2^32 never
    both draw (the same text); a seed beyond is refused in words; -1 is a random one."""
    assert text_of(generate(service, seed=2**32 - 1))
    for bad in (2**32, 2**32 + 5, 2**63 - 1, 1.5, "7"):
        with pytest.raises(ChargenError, match=r"seed must be a whole number from 0 to 4,294,967,295.*-1 for a random"):
            generate(service, seed=bad)
    assert text_of(generate(service, seed=5.0)) == text_of(generate(service, seed=5))
    model = service.shelf.get("shakespeare")
    for rng in ("torch", "portable"):
        with pytest.raises(ChargenError, match="seed must be a whole number"):
            model.generate("", 5, seed=2**32 + 5, rng=rng)


def test_a_text_stops_growing_at_the_page_limit_and_says_so(service):
    limits = service.limits
    *_, (text, writing) = generate(service, length=limits.max_length, num_samples=limits.max_samples)
    grown = len(text)
    while True:
        try:
            *_, (text, writing) = service.continue_(writing, "shakespeare", limits.max_length, 1.0, 0, 1.0)
        except ChargenError as e:
            assert "one page keeps at most 50,000" in str(e) and "press Generate" in str(e)
            break
        assert len(text) > grown
        grown = len(text)
    assert grown <= limits.max_text


def test_the_owners_switches(tmp_path, trained_run):
    limits = Limits.from_environment({"CHARGEN_TRAINING": "off", "CHARGEN_MAX_TRAIN_SECONDS": "30",
                                      "CHARGEN_KEEP_RUNS": "2"})
    assert (limits.training, limits.max_train_seconds, limits.keep_runs) == (False, 30, 2)
    for bad in ({"CHARGEN_TRAINING": "maybe"}, {"CHARGEN_MAX_TRAIN_SECONDS": "5"}, {"CHARGEN_KEEP_RUNS": "all"}):
        with pytest.raises(ChargenError, match=f"{next(iter(bad))}=.*set it to"):
            Limits.from_environment(bad)
    shelf_of_models(tmp_path, trained_run)
    (tmp_path / "corpora").mkdir()
    (tmp_path / "corpora" / "tiny.txt").write_text(make_text(200, seed=3))
    assert Limits.from_environment({"CHARGEN_MAX_HIDDEN": "256"}).max_hidden == 256
    narrow = Service(tmp_path / "models", tmp_path / "runs", tmp_path / "corpora",
                     Limits.from_environment({"CHARGEN_MAX_HIDDEN": "256"}), poll=0.05)
    assert narrow.presets() == [AUTO, "tiny (1x128)", "small (1x256)"]
    with pytest.raises(ChargenError, match="unknown model size"):
        narrow.train("page-a", None, "tiny.txt", "medium (1x512)", 10, "x")
    tiniest = Service(tmp_path / "models", tmp_path / "runs", tmp_path / "corpora", Limits(max_hidden=16))
    with pytest.raises(ChargenError, match="shakespeare is wider than this server trains .at most 16 units."):
        tiniest.train("page-a", None, "tiny.txt", AUTO, 10, "x", "shakespeare")
    off = Service(tmp_path / "models", tmp_path / "runs", tmp_path / "corpora", limits, poll=0.05)
    with pytest.raises(ChargenError, match="Training is turned off on this server"):
        off.train("page-a", None, "tiny.txt", "tiny (1x128)", 10, "x")
    kept = Service(tmp_path / "models", tmp_path / "runs", tmp_path / "corpora",
                   Limits(min_train_seconds=1, keep_runs=2), poll=0.05)
    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "notes").mkdir()  # (not a run: never deleted)
    for name in ("one", "two", "three"):
        *_, last = kept.train("page-a", None, "tiny.txt", "tiny (1x128)", 1, name)
        assert last.finished, last.status
        time.sleep(0.05)  # (their config.json's times differ)
    assert sorted(p.name for p in (tmp_path / "runs").iterdir()) == ["notes", "three", "two"]


def test_a_text_too_short_is_refused_in_the_apps_words(service, tmp_path):
    short = tmp_path / "up" / "short.txt"
    short.parent.mkdir()
    short.write_text("to be or not to be\n" * 40)
    with pytest.raises(ChargenError, match=r"^short.txt has [\d,]+ characters to train on; the app trains on") as e:
        service.train("page-a", str(short), None, "tiny (1x128)", 10, "")
    assert "--" not in str(e.value) and not short.exists()
