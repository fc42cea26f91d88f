"""``chargen export --web``: the folder, and the page in a real headless Chromium drawing
the CLI's text (``chargen sample --rng portable``) for the same seed."""

import hashlib
import json
import re
import subprocess
import sys
import urllib.parse
from pathlib import Path

import numpy as np
import pytest

from benchmarks.common import static_server
from chargen import load
from chargen.export import export_web
from chargen.portable import PortableModel, PortableSampler
from chargen.web import WEB_DTYPES, tensor_order
from conftest import chromium, needs_a_browser

ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = Path(__file__).resolve().parent / "artifacts"


def cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "chargen", *args], capture_output=True, text=True)


@pytest.fixture(scope="module")
def pages(tmp_path_factory, trained_run, lines_run):
    """The tiny stream and lines runs exported as pages (fp32), and the stream one in fp16."""
    base = tmp_path_factory.mktemp("web")
    for name, run, dtype in (("stream", trained_run, "fp32"), ("lines", lines_run, "fp32"),
                             ("stream16", trained_run, "fp16")):
        done = cli("export", str(run), str(base / name), "--web", "--web-dtype", dtype)
        assert done.returncode == 0, done.stderr
        assert "as a web page" in done.stdout and "python -m http.server" in done.stdout
    return base


def test_the_folder_holds_the_page_the_weights_and_a_card(pages, trained_run):
    folder = pages / "stream"
    assert sorted(p.name for p in folder.iterdir()) == ["README.md", "chargen.js", "index.html", "model.json",
                                                       "weights.bin"]
    header = json.loads((folder / "model.json").read_text())
    model = load(trained_run)
    assert header["format"] == "chargen-web" and header["mode"] == "stream" and not header["items"]
    assert header["chars"] == model.tokenizer.chars and header["default_prime"] == model.default_prime
    blob = (folder / "weights.bin").read_bytes()
    assert header["weights"] == {"file": "weights.bin", "dtype": "float32", "bytes": len(blob),
                                 "sha256": hashlib.sha256(blob).hexdigest()}
    assert [t["name"] for t in header["tensors"]] == tensor_order(model.model.config.layers)
    # Each tensor where the header says, rows padded with zeros to a multiple of 8.
    floats = np.frombuffer(blob, "<f4")
    for entry in header["tensors"]:
        tensor = model.model.state_dict()[entry["name"]].numpy()
        rows, width = entry["shape"][0], entry["shape"][-1]
        stored = floats[entry["offset"] : entry["offset"] + int(np.prod(entry["shape"]))].reshape(entry["shape"])
        assert entry["width"] == tensor.shape[-1]
        if tensor.ndim == 2:
            assert width % 8 == 0 and np.array_equal(stored[:, : tensor.shape[1]], tensor)
            assert not stored[:, tensor.shape[1] :].any()
            assert rows == tensor.shape[0]
        else:
            assert np.array_equal(stored, tensor)
    assert len((pages / "stream16" / "weights.bin").read_bytes()) == len(blob) // 2
    card = (folder / "README.md").read_text()
    assert card.startswith("---\ntitle:") and "\nsdk: static\n" in card and "\napp_file: index.html\n" in card
    assert "--rng portable" in card
    page = (folder / "index.html").read_text()
    assert '<script src="chargen.js">' in page and "Content-Security-Policy" in page and "default-src 'self'" in page
    assert set(WEB_DTYPES) == {"fp32", "fp16"}


def test_export_refuses_in_one_line(tmp_path, trained_run, pages):
    done = cli("export", str(trained_run), str(pages / "stream"), "--web")
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and \
        "already holds a web page export; choose another folder" in done.stderr
    done = cli("export", str(trained_run), str(tmp_path / "x"), "--web-dtype", "fp16")
    assert done.returncode == 2 and "add --web" in done.stderr
    done = cli("export", str(trained_run), str(trained_run / "page"), "--web")
    assert done.returncode == 2 and "not the run folder or one inside it" in done.stderr
    export_web(trained_run, pages / "stream", force=True)  # (--force replaces a page)


@pytest.fixture(scope="module")
def browser():
    needs_a_browser()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=chromium(), args=["--no-sandbox"])
        yield launched
        launched.close()


def open_page(browser, url, bypass_csp=True):
    """A page on ``url`` with every request it makes recorded. (Playwright's waiting runs
    eval, which the page's own policy refuses: bypassed, save where the policy is tested.)"""
    page = browser.new_context(bypass_csp=bypass_csp).new_page()
    page.requests = []
    page.on("request", lambda request: page.requests.append(request.url))
    page.goto(url)
    return page


def texts_of(page, runs=1):
    page.wait_for_function(f"window.chargenTimings && window.chargenTimings.runs >= {runs}", timeout=60_000)
    return page.eval_on_selector_all(".sample", "nodes => nodes.map(n => n.textContent)")


def query(**options) -> str:
    return "/index.html?" + urllib.parse.urlencode(options)


@pytest.mark.parametrize("kernel", ["auto", "js"])
def test_the_page_draws_the_clis_stream(browser, pages, trained_run, kernel):
    options = dict(seed=3123456789, length=400, temperature=0.9, top_k=12, top_p=0.95, prime="the ", samples=3)
    with static_server(pages / "stream") as url:
        page = open_page(browser, url + query(**options, kernel=kernel))
        shown = texts_of(page)
        assert page.inner_text("#about").endswith("wasm-simd" if kernel == "auto" else "js")
    done = cli("sample", str(trained_run), "--rng", "portable", "--seed", str(options["seed"]), "--length", "400",
               "--temperature", "0.9", "--top-k", "12", "--top-p", "0.95", "--prime", "the ", "--num-samples", "3")
    assert done.returncode == 0
    printed = [text.removesuffix("\n") for text in re.split(r"--- sample \d of 3 ---\n", done.stdout)[1:]]
    assert shown == printed and len(set(shown)) == 3 and all(len(text) == 404 for text in shown)
    assert "--rng portable --seed 3123456789 --length 400" in page.inner_text("#command")


def test_the_page_draws_the_clis_items(browser, pages, lines_run):
    with static_server(pages / "lines") as url:
        page = open_page(browser, url + query(seed=7, samples=10, prime="Ka", length=40))
        shown = texts_of(page)
    done = cli("sample", str(lines_run), "--rng", "portable", "--seed", "7", "--num-samples", "10", "--prime", "Ka",
               "--length", "40")
    assert done.returncode == 0
    assert shown == done.stdout.splitlines() and all(item.startswith("Ka") for item in shown)


def test_continue_carries_the_state_and_fp16_weights(browser, pages, trained_run):
    model = load(trained_run)
    with static_server(pages / "stream16") as url:
        page = open_page(browser, url + query(seed=5, length=150, samples=2))
        texts_of(page)
        page.get_by_role("button", name="Continue").click()
        shown = texts_of(page, runs=2)
    # The page's fp16 numbers are the portable model's on weights rounded through float16.
    sampler = PortableSampler(PortableModel(model.model, "float16"), model.tokenizer, model.default_prime,
                              num_samples=2, seed=5)
    for _ in sampler.pieces(300):
        pass
    assert shown == sampler.texts and all(len(text) == 300 for text in shown)
    assert "these are fp16" in page.inner_text("#command")


def test_the_shipped_model_as_a_visitor_sees_it(browser, tmp_path):
    """The shipped Shakespeare model's page: the CLI's text, and the README's picture
    (docs/web-page.png is a copy of tests/artifacts/web-page.png)."""
    export_web(ROOT / "models" / "shakespeare", tmp_path / "page")
    with static_server(tmp_path / "page") as url:
        page = browser.new_page(viewport={"width": 1000, "height": 900})
        page.goto(url + query(seed=1, prime="ROMEO:", length=400))
        page.locator("#status", has_text="characters in").wait_for(timeout=60_000)
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "web-page.png"), full_page=True)
        shown = page.inner_text(".sample")
    done = cli("sample", str(ROOT / "models" / "shakespeare"), "--rng", "portable", "--seed", "1", "--prime", "ROMEO:",
               "--length", "400")
    assert shown == done.stdout.removesuffix("\n") and shown.startswith("ROMEO:")


def test_any_width_any_depth(browser, tmp_path, corpus_file):
    """Widths that are not multiples of 8 (padded inside) and three layers: still the Python text."""
    from chargen import load_corpus, train
    from conftest import tiny_model, tiny_train

    run = tmp_path / "odd"
    train(load_corpus(corpus_file), run, tiny_model(hidden=19, embedding=5, layers=3), tiny_train(steps=6))
    export_web(run, tmp_path / "page")
    with static_server(tmp_path / "page") as url:
        page = open_page(browser, url + query(seed=9, samples=3, length=120, temperature=1.3, prime="a"))
        shown = texts_of(page)
    assert shown == load(run).generate_batch("a", 120, num_samples=3, seed=9, temperature=1.3, rng="portable")


def test_bad_settings_get_one_line(browser, pages):
    with static_server(pages / "stream") as url:
        page = open_page(browser, url + query(autostart=0))
        page.wait_for_function("window.chargenTimings && window.chargenTimings.loaded")
        for field, value, message in (("#seed", "-3", "seed must be a whole number"),
                                      ("#temperature", "-1", "temperature must be 0 or more"),
                                      ("#prime", "the \u263a", "never saw in training: \"\u263a\"")):
            page.reload()
            page.wait_for_function("window.chargenTimings && window.chargenTimings.loaded")
            page.fill(field, value)
            page.get_by_role("button", name="Generate").click()
            assert message in page.inner_text("#status.error")
            assert page.eval_on_selector_all(".sample", "nodes => nodes.length") == 0


def test_no_request_leaves_the_origin(browser, pages):
    """Under the page's own Content-Security-Policy (not bypassed): it runs, with the
    WebAssembly kernel, and the browser refuses a request to any other host."""
    with static_server(pages / "stream") as url:
        page = open_page(browser, url + query(seed=1, length=50), bypass_csp=False)
        page.locator("#status", has_text="characters in").wait_for(timeout=60_000)
        assert page.inner_text("#about").endswith("wasm-simd")
        assert len(page.inner_text(".sample")) == 50
        refused = page.evaluate("() => fetch('http://127.0.0.2:9/x').then(() => 'sent', e => e.name)")
        assert refused == "TypeError"
        assert page.requests and all(r.startswith(url + "/") for r in page.requests), page.requests
