"""The public app on a busy minute (issue 30): 32 users generating at once while one visitor
trains and 12 models' pages are asked for for the first time (each exported on that first
request), then what taking a model home costs.

    python -m benchmarks.app_busy          # about 2 minutes on 2 cores

The app serves a models folder of 12 copies of the shipped models (6 of each). One client
starts a training (the shipped first-names list, a tiny model, 60 s); then, together, 32
light clients each ask for 1,000 characters through Gradio's HTTP API (app_load's) and
12 threads each fetch a different model's page (``/web/<model>/model.json``). It reports
every outcome (none may fail or hang), the generations' first text p50/p95, the pages' time
to their first byte, that the training went on; and then each download of the shipped
Shakespeare model (``/download/shakespeare/model.zip`` and ``page.zip``), the first (made
on request) and again (made already).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import shutil
import tempfile
import time
from pathlib import Path

import httpx

from benchmarks.app_load import all_users, percentile
from benchmarks.common import ROOT, client_for, command_line, running_app

USERS, PAGES, LENGTH, TIMEOUT = 32, 12, 1000, 180.0


def shelf(work: Path) -> Path:
    models = work / "models"
    for k in range(PAGES // 2):
        for name in ("shakespeare", "names"):
            shutil.copytree(ROOT / "models" / name, models / (name if k == 0 else f"{name}-{k}"))
    return models


def fetch(url: str) -> tuple[int, float]:
    start = time.perf_counter()
    answer = httpx.get(url, timeout=TIMEOUT)
    return answer.status_code, time.perf_counter() - start


def main() -> None:
    command_line(__doc__, __spec__.name).parse_args()
    work = Path(tempfile.mkdtemp(prefix="chargen-app-busy-"))
    try:
        with running_app(["--models", str(shelf(work)), "--runs", str(work / "runs")], cwd=work) as app:
            busy_minute(app.url, work)
            downloads(app.url)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def busy_minute(url: str, work: Path) -> None:
    """The generations, the training and the first pages at once."""
    client_for(url).predict("shakespeare", "", 20, 0.8, 0, 1.0, 0, 1, api_name="/generate")  # (loaded)
    trainer = client_for(url)
    training = trainer.submit(None, "first_names.txt", "tiny (1x128)", 60, "busy", api_name="/train")
    time.sleep(5)  # (reading the text and the speed probe: the run is training)
    names = sorted(p.name for p in (work / "models").iterdir())
    with concurrent.futures.ThreadPoolExecutor(PAGES) as pool:
        pages = [pool.submit(fetch, f"{url}web/{name}/model.json") for name in names]
        start = time.perf_counter()
        users = asyncio.run(all_users(url, "shakespeare", USERS, LENGTH, TIMEOUT))
        wall = time.perf_counter() - start
        pages = [p.result() for p in pages]
    status = training.result(timeout=TIMEOUT)[0]
    done = [u for u in users if u["outcome"] == "completed"]
    firsts = [u["first"] for u in done]
    print(f"{USERS} users, {LENGTH} characters each, while training and {PAGES} first page exports:")
    print(f"  generations completed {len(done)} of {USERS}; first text p50 {percentile(firsts, 50):.2f} s, "
          f"p95 {percentile(firsts, 95):.2f} s; all done in {wall:.1f} s")
    print(f"  others: {[u for u in users if u['outcome'] != 'completed'][:3]}")
    print(f"  pages served {sum(code == 200 for code, _ in pages)} of {PAGES}; time to the first: "
          f"p50 {percentile([t for _, t in pages], 50):.2f} s, longest {max(t for _, t in pages):.2f} s")
    print(f"  training: {status}")


def downloads(url: str) -> None:
    """Each download of the shipped model, twice: made on request, then made already."""
    for file in ("model.zip", "page.zip"):
        (code, first), (code2, again) = fetch(f"{url}download/shakespeare/{file}"), \
            fetch(f"{url}download/shakespeare/{file}")
        size = len(httpx.get(f"{url}download/shakespeare/{file}", timeout=TIMEOUT).content)
        print(f"download {file}: {code}/{code2}, {size / 1e6:.1f} MB, first {first:.2f} s, again {again:.2f} s")


if __name__ == "__main__":
    main()
