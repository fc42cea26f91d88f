"""The web app, measured from outside: start-up, time to first text, streaming speed.

Starts ``python app.py`` on loopback in a subprocess (serving models/, the shipped
models) and prints:
- start to first served page: from launching the process to the first HTTP 200 on "/";
- click to first text: in headless Chromium (when it and playwright are installed), from
  the Generate click to the first characters in the page; and through gradio_client, from
  the request to its first streamed update;
- streamed chars/s for 1 user and for 8 concurrent users (each its own gradio_client),
  against the baseline of the same sampling in-process with no server (``model.stream``).

    python benchmarks/app_latency.py              # ~1 min on 2 cores
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.update(GRADIO_ANALYTICS_ENABLED="False", HF_HUB_OFFLINE="1")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serving(port: int) -> bool:
    """Whether the app on this machine's loopback ``port`` answers "/" (a readiness poll)."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        connection.request("GET", "/")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def start_app(port: int, models: Path, root: Path = ROOT) -> tuple[subprocess.Popen, float]:
    """``root``'s app.py (and its chargen: the process starts there) on loopback ``port``."""
    started = time.perf_counter()
    server = subprocess.Popen([sys.executable, str(root / "app.py"), "--port", str(port), "--models", str(models)],
                              cwd=root, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    while True:
        if serving(port):
            return server, time.perf_counter() - started
        if server.poll() is not None or time.perf_counter() - started > 120:
            sys.exit("the app did not start")
        time.sleep(0.05)


def client_for(url: str):
    from gradio_client import Client

    return Client(url, verbose=False, analytics_enabled=False, download_files=False)


def timed_generation(url: str, model: str, length: int, seed: int) -> tuple[float, float, int]:
    """(seconds to the first update, seconds to the end, characters generated)."""
    client = client_for(url)
    start = time.perf_counter()
    job = client.submit(model, "", length, 0.8, 0, 1.0, seed, 1, api_name="/generate")
    first = None
    for _ in job:
        if first is None:
            first = time.perf_counter() - start
    total = time.perf_counter() - start
    return first or total, total, len(job.outputs()[-1])


def browser_first_text(url: str, tries: int) -> list[float] | None:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if chromium is None:
        return None
    times = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
        page = browser.new_page()
        page.goto(url)
        page.get_by_label("prime").fill("ROMEO:")
        output = page.locator("#output textarea")
        output.wait_for()
        for _ in range(tries):
            page.evaluate("document.querySelector('#output textarea').value = ''")
            start = time.perf_counter()
            page.get_by_role("button", name="Generate", exact=True).click()
            page.wait_for_function("document.querySelector('#output textarea').value.length > 6", polling="raf")
            times.append(time.perf_counter() - start)
            page.wait_for_timeout(1500)  # let this generation (500 chars) finish
        browser.close()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=Path, default=ROOT / "models")
    parser.add_argument("--model", default="shakespeare")
    parser.add_argument("--length", type=int, default=2000, help="characters per generation (default 2000)")
    parser.add_argument("--users", type=int, default=8)
    parser.add_argument("--tries", type=int, default=10)
    args = parser.parse_args()

    import chargen

    # Baseline: the same sampling in this process, no server.
    model = chargen.load(args.models / args.model, device="cpu")
    start = time.perf_counter()
    n = sum(1 for _ in model.stream("", args.length, seed=0))
    library_cps = n / (time.perf_counter() - start)
    del model

    port = free_port()
    server, start_seconds = start_app(port, args.models)
    url = f"http://127.0.0.1:{port}/"
    try:
        timed_generation(url, args.model, 50, 0)  # warm: loads the model
        firsts = [timed_generation(url, args.model, 30, i)[0] for i in range(args.tries)]
        browser = browser_first_text(url, args.tries)
        _, total, chars = timed_generation(url, args.model, args.length, 1)
        one_user = chars / total
        results: list[tuple[float, float, int]] = []
        threads = [threading.Thread(target=lambda i=i: results.append(timed_generation(url, args.model,
                                                                                       args.length, 100 + i)))
                   for i in range(args.users)]
        wall = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        wall = time.perf_counter() - wall
    finally:
        server.terminate()
        server.wait(timeout=30)

    per_user = [c / t for _, t, c in results]
    print(f"\napp: {args.model} from {args.models}, {os.cpu_count()} cores; python {sys.version.split()[0]}\n")
    print("| measure | value | target |")
    print("| --- | ---: | ---: |")
    print(f"| start to first served page | {start_seconds:.1f} s | < 15 s |")
    if browser:
        median = statistics.median(browser) * 1000
        print(f"| click to first text, Chromium (median of {len(browser)}) | {median:.0f} ms | < 300 ms |")
    else:
        print("| click to first text, Chromium | not measured (no chromium/playwright) | < 300 ms |")
    print(f"| request to first text, gradio_client (median of {len(firsts)}) | "
          f"{statistics.median(firsts) * 1000:.0f} ms | |")
    print(f"| in-process sampling, no server (baseline) | {library_cps:,.0f} chars/s | |")
    print(f"| streamed, 1 user | {one_user:,.0f} chars/s ({one_user / library_cps:.2f}x baseline) | |")
    print(f"| streamed, {args.users} users at once: each (median) | {statistics.median(per_user):,.0f} chars/s | |")
    print(f"| streamed, {args.users} users at once: all together | {sum(c for *_, c in results) / wall:,.0f} chars/s "
          f"({sum(c for *_, c in results) / wall / library_cps:.2f}x baseline) | |")
    print(f"| {args.users} users: first text, median / slowest | {statistics.median(f for f, *_ in results):.2f} s / "
          f"{max(f for f, *_ in results):.2f} s | |")


if __name__ == "__main__":
    main()
