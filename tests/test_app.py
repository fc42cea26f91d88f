"""The web app, live: started on loopback in a subprocess and driven with gradio_client
(and, once, with a real headless Chromium)."""

import json
import os
import re
import signal
import tempfile
import time
from pathlib import Path

import httpx
import pytest

gradio_client = pytest.importorskip("gradio_client")
from gradio_client import Client, handle_file  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402

from benchmarks import screenshots  # noqa: E402
from conftest import chromium, config_json, make_text, needs_a_browser, shelf_of_models, start_app  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


@pytest.fixture(scope="module")
def served(tmp_path_factory, trained_run):
    """models/ holds a tiny stream model ("shakespeare", the default) and a tiny lines model
    ("names"); the app serves them and writes its own runs to runs/."""
    base = tmp_path_factory.mktemp("app")
    shelf_of_models(base, trained_run)
    with start_app(["--models", str(base / "models"), "--runs", str(base / "runs")], cwd=base) as (url, server):
        yield {"url": url, "base": base, "server": server}


@pytest.fixture()
def client(served):
    return Client(served["url"], verbose=False, analytics_enabled=False, download_files=False)


def generate(client, model="shakespeare", prime="the ", length=300, seed=5, num_samples=1, temperature=1.0, top_k=0,
             top_p=1.0):
    return client.submit(model, prime, length, temperature, top_k, top_p, seed, num_samples, api_name="/generate")


def test_generate_streams_pieces_that_build_the_text(client):
    job = generate(client, length=400)
    updates = list(job)
    final = job.outputs()[-1]
    assert final.startswith("the ") and len(final) == len("the ") + 400
    assert len(set(updates)) >= 2, "the text came in one piece, not streamed"
    # Each update extends the one before: the streamed pieces concatenate to the text.
    pieces = [updates[0]] + [b[len(a):] for a, b in zip(updates, updates[1:], strict=False)]
    assert all(b.startswith(a) for a, b in zip(updates, updates[1:], strict=False))
    assert "".join(pieces) == final


def test_same_seed_same_text(client):
    a = generate(client, seed=17, length=120).result()
    b = generate(client, seed=17, length=120).result()
    c = generate(client, seed=18, length=120).result()
    assert a == b and a != c
    with pytest.raises(AppError, match="seed must be a whole number from 0 to 4,294,967,295"):  # (words, not "Error")
        generate(client, seed=2**32, length=10).result()
    # -1 (the page's default) draws a fresh seed each time.
    assert generate(client, seed=-1, length=120).result() != generate(client, seed=-1, length=120).result()


def test_continue_carries_the_state(client):
    """Generate 100 then Continue 150 gives exactly the text of 250 at once: the session
    keeps the sampler (LSTM state and random generator); the text is not re-read."""
    first = generate(client, prime="king ", seed=3, length=100).result()
    continued = client.predict("shakespeare", 150, 1.0, 0, 1.0, api_name="/continue")
    whole = generate(client, prime="king ", seed=3, length=250).result()
    assert continued.startswith(first) and continued == whole


def test_several_samples_and_lines_models(served):
    client = Client(served["url"], verbose=False, analytics_enabled=False, download_files=False)
    with pytest.raises(AppError, match="press Generate first"):
        client.predict("shakespeare", 10, 1.0, 0, 1.0, api_name="/continue")
    text = generate(client, num_samples=3, length=50).result()
    assert text.count("--- sample") == 3
    items = generate(client, model="names", prime="", num_samples=6, length=40).result().split("\n")
    assert len(items) == 6 and all(len(item) <= 40 for item in items)
    more = client.predict("names", 40, 1.0, 0, 1.0, api_name="/continue").split("\n")
    assert len(more) == 12 and more[:6] == items


@pytest.mark.parametrize("change, message", [
    ({"model": "../../etc/passwd"}, "unknown model"),
    ({"model": "nope"}, "unknown model"),
    ({"prime": "x" * 5000}, "longer than"),
    ({"prime": "\u263a"}, "never saw"),
    ({"length": 10**9}, "greater than maximum"),
    ({"num_samples": 0}, "less than minimum"),
    ({"temperature": -3}, "less than minimum"),
    ({"top_p": 7}, "greater than maximum"),
    ({"seed": -2}, "less than minimum"),
])
def test_bad_requests_are_refused_and_the_server_keeps_serving(client, served, change, message):
    with pytest.raises(AppError, match=message):
        generate(client, **change).result()
    assert served["server"].poll() is None
    assert len(generate(client, length=20).result()) == len("the ") + 20


def scratch_of(server) -> Path:
    """The app's own temp folder (app.scratch_folder)."""
    return Path(tempfile.gettempdir()) / f"chargen-app-{server.pid}"


def test_train_on_an_upload_then_generate(client, served, tmp_path):
    upload = tmp_path / "mine.txt"
    upload.write_text(make_text(300, seed=4))
    # Gradio keeps an upload where its answer to the upload says (by the content's hash): a
    # client that knows it can fetch it, until the app has read it into a run.
    url = served["url"]
    kept = httpx.post(url + "gradio_api/upload", files=[("files", ("mine.txt", upload.read_bytes()))]).json()[0]
    assert httpx.get(url + "gradio_api/file=" + kept).status_code == 200
    job = client.submit(handle_file(str(upload)), None, "tiny (1x128)", 10, "mine", api_name="/train")
    # One training at a time: a second start while this one runs gets a clear refusal.
    deadline = time.time() + 30
    while time.time() < deadline and not (served["base"] / "runs" / "mine").exists():
        time.sleep(0.2)
    with pytest.raises(AppError, match="already running"):
        client.predict(None, "first_names.txt", "tiny (1x128)", 10, "second", api_name="/train")
    status = job.result(timeout=120)[0]
    assert "runs/mine" in status and "bits/char" in status
    text = generate(client, model="runs/mine", prime="The ", length=60).result()
    assert len(text) == len("The ") + 60
    # The upload is gone, by every address: nothing with its bytes is left in the app's folders.
    assert httpx.get(url + "gradio_api/file=" + kept).status_code in (403, 404) and not Path(kept).exists()
    for folder in (scratch_of(served["server"]), served["base"] / "runs"):
        assert not [p for p in folder.rglob("*") if p.is_file() and p.read_bytes() == upload.read_bytes()]
    assert config_json(served["base"] / "runs" / "mine")["corpus"]["path"] == "mine.txt"
    # What another visitor sees of the run names the file and its hash, never a server path.
    other = Client(url, verbose=False, analytics_enabled=False, download_files=False)
    seen = [status, other.predict("runs/mine", api_name="/describe")[0]]
    seen += [httpx.get(f"{url}web/runs/mine/{file}").text for file in ("README.md", "model.json")]
    page = httpx.get(f"{url}web/runs/mine", follow_redirects=True)  # (a run's page redirects as a model's does)
    assert page.status_code == 200 and str(page.url).endswith("/web/runs/mine/")
    assert "mine.txt" in seen[2] and config_json(served["base"] / "runs" / "mine")["corpus"]["sha256"] in seen[2]
    for shown in seen:
        assert tempfile.gettempdir() not in shown and str(served["base"]) not in shown, shown


def test_stop_saves_a_training_run(client, served):
    job = client.submit(None, "shakespeare.txt", "tiny (1x128)", 300, "stopped", api_name="/train")
    metrics, deadline = served["base"] / "runs" / "stopped" / "metrics.jsonl", time.time() + 60
    while time.time() < deadline and not (metrics.exists() and '"train"' in metrics.read_text()):
        time.sleep(0.2)  # (until a step is logged: stopped before its first step, the run would save step 0)
    other = Client(served["url"], verbose=False, analytics_enabled=False, download_files=False)
    assert "another page" in other.predict(api_name="/stop_training")
    assert "Stopping" in client.predict(api_name="/stop_training")
    status = job.result(timeout=120)[0]
    # (a run stopped before its first validation says so; "best validation n/a bits/char" it was)
    assert re.search(r"stopped at step [\d,]+; (not validated yet|(best )?validation \d\.\d{3} bits/char"
                     r"( on a sample)?)\.", status)
    assert config_json(served["base"] / "runs" / "stopped")["summary"]["step"] > 0


@pytest.mark.parametrize("args, message", [
    ((None, "../secret.txt", "tiny (1x128)", 10, ""), "shipped corpus"),
    ((None, "first_names.txt", "huge", 10, ""), "not in the list of choices"),
    ((None, "first_names.txt", "tiny (1x128)", 10, "../../x"), "run name"),
])
def test_bad_training_requests_are_refused(client, args, message):
    with pytest.raises(AppError, match=message):
        client.predict(*args, api_name="/train")


def test_each_model_has_its_page_that_samples_in_the_browser(client, served):
    """/web/<model>/: the model's static page (chargen.web), linked from its card."""
    import httpx

    card = client.predict("names", api_name="/describe")[0]
    assert "[run it in your browser](web/names/)" in card
    page = httpx.get(served["url"] + "web/names", follow_redirects=True)
    assert page.status_code == 200 and str(page.url).endswith("/web/names/") and "chargen.js" in page.text
    # The page's own <meta> policy comes as a header too, with what a <meta> cannot say.
    meta = re.search(r'Content-Security-Policy"\s+content="([^"]+)"', page.text).group(1)
    policy = page.headers["content-security-policy"]
    assert policy.startswith(meta) and "frame-ancestors 'self'" in policy
    assert page.headers["x-content-type-options"] == "nosniff" and page.headers["x-frame-options"] == "SAMEORIGIN"
    header = httpx.get(served["url"] + "web/names/model.json").json()
    assert header["format"] == "chargen-web" and header["items"]
    weights = httpx.get(served["url"] + "web/names/weights.bin")
    assert len(weights.content) == header["weights"]["bytes"]
    card = httpx.get(served["url"] + "web/names/README.md")
    assert card.headers["content-type"].startswith("text/plain") and "sdk: static" in card.text
    for missing in ("web/names/config.json", "web/nobody/index.html", "web/..%2F..%2Fapp.py",
                    "web/names/..%2Fnames/model.json"):
        assert httpx.get(served["url"] + missing).status_code == 404


def test_browser_types_a_prime_and_sees_text(served):
    """A real browser: load the page, type a prime, click Generate, see the text appear."""
    needs_a_browser()
    from playwright.sync_api import expect

    ARTIFACTS.mkdir(exist_ok=True)
    with screenshots.browser_page() as page:
        page.goto(served["url"])
        page.get_by_label("prime").fill("the king ")
        page.get_by_role("button", name="Generate", exact=True).click()
        output = page.locator("#output textarea")
        expect(output).to_have_value(re.compile(r"^the king .{100,}", re.S), timeout=30_000)
        page.screenshot(path=str(ARTIFACTS / "app-generate-tiny.png"), full_page=True)


@pytest.mark.docs
def test_each_tab_as_a_user_sees_it(tmp_path):
    """The steps of the docs' pictures (python -m benchmarks.screenshots) in a real browser:
    an example prime of the shipped model clicked and generated from, then the Train tab's
    defaults (Shakespeare, auto size, 60 s), a training started with them and stopped with
    Stop and save once its curve has points, its samples headed by their validation loss.
    The pictures go to tests/artifacts/ (the docs' own come from the full 60 s)."""
    needs_a_browser()
    ARTIFACTS.mkdir(exist_ok=True)
    with start_app(["--models", str(ROOT / "models"), "--runs", str(tmp_path / "runs")], cwd=tmp_path) as (url, _), \
            screenshots.browser_page() as page:
        screenshots.generate_tab(page, url, ARTIFACTS)
        screenshots.train_tab(page, ARTIFACTS, stop_after_progress=True)
    assert (ARTIFACTS / "app-generate.png").stat().st_size and (ARTIFACTS / "app-train.png").stat().st_size
    assert any((tmp_path / "runs").iterdir()) and not list((tmp_path / "runs").glob("*/.*.tmp"))  # (saved whole)


def test_bad_uploads_and_budgets_are_refused(client, tmp_path):
    binary = tmp_path / "data.bin"
    binary.write_bytes(bytes(range(256)) * 10)
    with pytest.raises(AppError, match=r"\.txt|file type|Invalid file"):
        client.predict(handle_file(str(binary)), None, "tiny (1x128)", 10, "", api_name="/train")
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(AppError, match="^empty.txt is empty") as refused:  # (its name, not where the server kept it)
        client.predict(handle_file(str(empty)), None, "tiny (1x128)", 10, "", api_name="/train")
    assert "/" not in str(refused.value)
    with pytest.raises(AppError, match="greater than maximum"):
        client.predict(None, "first_names.txt", "tiny (1x128)", 10**6, "", api_name="/train")


def test_a_cancelled_generation_leaves_the_server_serving(client, served):
    job = generate(client, length=3000)
    for _ in job:
        break  # the first streamed piece arrived: cancel, as the Stop button does
    job.cancel()
    assert served["server"].poll() is None
    assert len(generate(client, length=30).result()) == len("the ") + 30


def test_sigterm_removes_the_apps_temp_folder(tmp_path, trained_run):
    """A host stops a service with SIGTERM: the app's own temp folder (uploads not yet read,
    exported pages) goes with it."""
    shelf_of_models(tmp_path, trained_run)
    args = ["--models", str(tmp_path / "models"), "--runs", str(tmp_path / "runs")]
    with start_app(args, cwd=tmp_path) as (url, server):
        assert httpx.get(url + "web/shakespeare/model.json").status_code == 200  # (a page exported there)
        scratch = scratch_of(server)
        assert any(scratch.rglob("weights.bin"))
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    assert not scratch.exists()


@pytest.mark.parametrize("args, env, message", [
    (["--port", "99999"], {}, "argument --port: a port is a whole number from 1 to 65535, not '99999'"),
    (["--models", "nowhere"], {}, "--models nowhere: no such folder"),
    (["--port", "{busy}"], {}, "the port is in use by another program; pass --port with a free one"),
    ([], {"GRADIO_SERVER_PORT": "{busy}"}, "the port is in use by another program; pass --port"),
    ([], {"GRADIO_SERVER_PORT": "http"}, "GRADIO_SERVER_PORT='http' is not a port"),
])
def test_a_start_that_cannot_work_is_one_line_with_the_apps_own_flag(tmp_path, args, env, message):
    import socket
    import subprocess
    import sys

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        fill = {"busy": str(busy.getsockname()[1])}
        done = subprocess.run([sys.executable, str(ROOT / "app.py"), *[a.format(**fill) for a in args]],
                              capture_output=True, text=True, timeout=120, cwd=tmp_path,
                              env=os.environ | {k: v.format(**fill) for k, v in env.items()})
    lines = [line for line in done.stderr.splitlines() if line.strip() and not line.startswith(("usage:", " "))]
    assert done.returncode == 2 and len(lines) == 1 and message in lines[0], done.stderr
    assert "server_port" not in done.stderr and "Traceback" not in done.stderr


def test_take_the_model_and_its_page_home(client, served, tmp_path):
    """The card links both downloads; the model folder unzipped loads and samples as the
    served model does, and the page unzipped draws in a browser what the CLI draws."""
    import io
    import zipfile

    from test_web import cli, open_page, query, texts_of

    import chargen
    from benchmarks.common import static_server

    card = client.predict("shakespeare", api_name="/describe")[0]
    links = re.findall(r"\]\((download/shakespeare/(?:model|page)\.zip)\)", card)
    assert links == ["download/shakespeare/model.zip", "download/shakespeare/page.zip"]
    got = {}
    for link in links:
        answer = httpx.get(served["url"] + link, timeout=120)
        assert answer.status_code == 200 and answer.headers["content-type"] == "application/zip"
        assert "shakespeare-" in answer.headers["content-disposition"]
        zipfile.ZipFile(io.BytesIO(answer.content)).extractall(tmp_path / link.split("/")[-1].removesuffix(".zip"))
        got[link] = tmp_path / link.split("/")[-1].removesuffix(".zip") / "shakespeare"
    served_model = served["base"] / "models" / "shakespeare"
    home = chargen.load(got[links[0]])
    assert home.generate("the ", 80, seed=9) == chargen.load(served_model).generate("the ", 80, seed=9)
    assert (got[links[0]] / "README.md").is_file() and (got[links[1]] / "index.html").is_file()
    assert httpx.get(served["url"] + "download/nobody/model.zip").status_code == 404
    assert httpx.get(served["url"] + "download/shakespeare/config.json").status_code == 404
    needs_a_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p, static_server(got[links[1]]) as url:
        browser = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        try:
            shown = texts_of(open_page(browser, url + query(seed=77, length=120, prime="the ")))
        finally:
            browser.close()
    done = cli("sample", str(served_model), "--rng", "portable", "--seed", "77", "--length", "120", "--prime", "the ")
    assert done.returncode == 0 and shown == [done.stdout.removesuffix("\n")]


def test_forged_requests_get_words_not_a_bare_error(served):
    """Values no page would send, straight to the HTTP API: each answer names the problem."""
    def error_of(name: str, data: list) -> str:
        url = served["url"]
        event = httpx.post(f"{url}gradio_api/call/{name}", json={"data": data}).json()["event_id"]
        with httpx.stream("GET", f"{url}gradio_api/call/{name}/{event}", timeout=60) as events:
            errors = [line for line in events.iter_lines() if line.startswith("data: ") and '"error"' in line]
        assert errors, name
        return json.loads(errors[0][6:])["error"] or ""

    forged = {"path": "/etc/hostname", "meta": {"_type": "gradio.FileData"}}
    assert "not uploaded" in error_of("train", [forged, None, "tiny (1x128)", 10, "", "nothing: train from scratch"])
    assert "number" in error_of("generate", ["shakespeare", "", 10, 0.8, 0, 1.0, "abc", 1])
    assert "seed must be a whole number" in error_of("generate", ["shakespeare", "", 10, 0.8, 0, 1.0, 1e30, 1])


def test_a_bad_flag_is_answered_before_gradio_and_torch_are_imported():
    """The flags and the address are checked first: a mistake is answered at once, not after
    the seconds that importing Gradio and torch take."""
    import subprocess
    import sys

    code = ("import runpy, sys\nsys.argv = sys.argv[1:]\ntry:\n    runpy.run_path(sys.argv[0], run_name='__main__')\n"
            "except SystemExit as e:\n    print(e.code, 'gradio' in sys.modules, 'torch' in sys.modules)")
    for flags in (["--port", "99999"], ["--models", "nowhere"], ["--help"]):
        done = subprocess.run([sys.executable, "-c", code, str(ROOT / "app.py"), *flags], capture_output=True,
                              text=True, timeout=60)
        assert done.stdout.split()[-3:] == ["0" if flags == ["--help"] else "2", "False", "False"], done.stdout


def test_a_privileged_port_is_named_as_one():
    """(Root may bind port 80, so a real try is not possible here: the error the kernel gives
    an ordinary user, EACCES, as app.py words it.)"""
    import errno

    from conftest import load_script

    app = load_script("app.py")
    assert "ports below 1024 need root; pass --port 1024 or higher" in app.port_problem(
        PermissionError(errno.EACCES, "Permission denied"))
    assert "in use by another program" in app.port_problem(OSError(errno.EADDRINUSE, "Address already in use"))
