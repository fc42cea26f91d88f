"""The web app, measured from outside: start-up and time to first text, then many users
streaming at once. Each part starts ``python app.py`` on loopback (serving ``--models``, the
shipped models by default) in a subprocess of its own.

``--only latency`` prints:
- start to first served page: from launching the process to the first HTTP 200 on "/";
- click to first text: in headless Chromium (when it and playwright are installed), from
  the Generate click to the first characters in the page; and through gradio_client, from
  the request to its first streamed update;
- streamed chars/s for 1 user and for ``--users`` concurrent users (8 by default; each its
  own gradio_client), against the baseline of the same sampling in-process with no server
  (``model.stream``).

``--only load``: for each count of ``--users`` (1, 8, 32 and 128 by default) it sends that
many requests at once, each for one generation of ``--length`` characters, through Gradio's
HTTP API (a POST, then its event stream: what the page's own script does), with a
per-request timeout. The clients are light on purpose (one event loop, one connection per
user): they share the server's cores, and gradio_client, one Client with its own threads
per user, took more CPU than the server did (1.2 cores to its 0.5 at 32 users on 2 cores).
The run is bounded in count and time and stops by itself. Every request must complete or be
turned away with a message; none may hang past its timeout. For each count it records the
outcomes, time to first text (p50/p95), chars/s per user and in all, and the server's
resident memory before and after; then it checks that the server still serves (a normal
request, and one naming an unknown model, which must get a clear error).

``--code REV`` runs the app of an earlier commit instead (from a git worktree under
benchmarks/out/app_load), so that before and after are measured on the same machine in one
sitting; the load rounds are appended to benchmarks/out/app_load/results.jsonl and
``--report`` prints them side by side.

    python -m benchmarks.app_load                     # both parts: about 4 min on 2 cores
    python -m benchmarks.app_load --only latency      # ~1 min
    python -m benchmarks.app_load --only load         # 1, 8, 32 and 128 users (~3 min)
    python -m benchmarks.app_load --only load --code 5920378   # the same against the app at that commit
    python -m benchmarks.app_load --report            # the load table of both
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import httpx

import chargen
from benchmarks.common import (
    OUT,
    ROOT,
    append_jsonl,
    checkout,
    chromium,
    client_for,
    command_line,
    read_jsonl,
    running_app,
)

PARTS = ("latency", "load")
LENGTH = {"latency": 2000, "load": 1000}  # characters per generation, by default
USERS = {"latency": [8], "load": [1, 8, 32, 128]}


# --- latency -------------------------------------------------------------------------------
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
    browser_path = chromium()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if browser_path is None:
        return None
    times = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
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


def in_process_speed(folder: Path, length: int) -> float:
    """The baseline: chars/s of the same sampling in this process, no server."""
    model = chargen.load(folder, device="cpu")
    start = time.perf_counter()
    n = sum(1 for _ in model.stream("", length, seed=0))
    return n / (time.perf_counter() - start)


def at_once(url: str, model: str, users: int, length: int) -> tuple[list[tuple[float, float, int]], float]:
    """``users`` gradio_client generations at once, each in its thread: their timings, and the wall time."""
    results: list[tuple[float, float, int]] = []
    threads = [threading.Thread(target=lambda i=i: results.append(timed_generation(url, model, length, 100 + i)))
               for i in range(users)]
    wall = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results, time.perf_counter() - wall


def latency(args: argparse.Namespace, root: Path) -> None:
    length, users = args.length or LENGTH["latency"], max(args.users or USERS["latency"])
    library_cps = in_process_speed(args.models / args.model, length)
    with running_app(["--models", str(args.models)], root=root) as app:
        timed_generation(app.url, args.model, 50, 0)  # warm: loads the model
        firsts = [timed_generation(app.url, args.model, 30, i)[0] for i in range(args.tries)]
        browser = browser_first_text(app.url, args.tries)
        _, total, chars = timed_generation(app.url, args.model, length, 1)
        results, wall = at_once(app.url, args.model, users, length)
    one_user, together = chars / total, sum(c for *_, c in results) / wall
    per_user = [c / t for _, t, c in results]
    print(f"\napp: {args.model} from {args.models}, {os.cpu_count()} cores; python {sys.version.split()[0]}\n")
    print("| measure | value | target |")
    print("| --- | ---: | ---: |")
    print(f"| start to first served page | {app.start_seconds:.1f} s | < 15 s |")
    if browser:
        median = statistics.median(browser) * 1000
        print(f"| click to first text, Chromium (median of {len(browser)}) | {median:.0f} ms | < 300 ms |")
    else:
        print("| click to first text, Chromium | not measured (no chromium/playwright) | < 300 ms |")
    print(f"| request to first text, gradio_client (median of {len(firsts)}) | "
          f"{statistics.median(firsts) * 1000:.0f} ms | |")
    print(f"| in-process sampling, no server (baseline) | {library_cps:,.0f} chars/s | |")
    print(f"| streamed, 1 user | {one_user:,.0f} chars/s ({one_user / library_cps:.2f}x baseline) | |")
    print(f"| streamed, {users} users at once: each (median) | {statistics.median(per_user):,.0f} chars/s | |")
    print(f"| streamed, {users} users at once: all together | {together:,.0f} chars/s "
          f"({together / library_cps:.2f}x baseline) | |")
    print(f"| {users} users: first text, median / slowest | {statistics.median(f for f, *_ in results):.2f} s / "
          f"{max(f for f, *_ in results):.2f} s | |")


# --- load ----------------------------------------------------------------------------------
def resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


async def one_user(http, url: str, model: str, length: int, seed: int, timeout: float) -> dict:
    """One request through Gradio's HTTP API (a POST, then its event stream), as a page's
    script makes it: the outcome, and for a completed one its timings and characters."""
    start = time.perf_counter()
    first, text = None, ""
    try:
        async with asyncio.timeout(timeout):
            answer = await http.post(f"{url}gradio_api/call/generate",
                                     json={"data": [model, "", length, 0.8, 0, 1.0, seed, 1]})
            if answer.status_code >= 400:  # (Gradio's queue turns a request away here, with a 503)
                return turned_away(answer.text)
            event_id, event = answer.json()["event_id"], None
            async with http.stream("GET", f"{url}gradio_api/call/generate/{event_id}") as events:
                async for line in events.aiter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: ") and event in ("generating", "complete"):
                        data = json.loads(line[6:])
                        text = data[0] if data and data[0] else text
                        if first is None and text:
                            first = time.perf_counter() - start
                    elif line.startswith("data: ") and event == "error":
                        return turned_away(line[6:])
                    if event == "complete" and line.startswith("data: "):
                        break
    except TimeoutError:
        return {"outcome": "timed out"}
    except (httpx.HTTPError, ValueError, KeyError) as e:
        return {"outcome": f"error: {type(e).__name__}: {str(e)[:60]}"}
    total = time.perf_counter() - start
    first = first or total
    return {"outcome": "completed", "first": first, "total": total,
            "chars_per_s": len(text) / max(1e-9, total - first), "chars": len(text)}


def turned_away(message: str) -> dict:
    """A refusal with a message (the server is busy, or its queue full), or another error."""
    refused = "busy" in message.lower() or "full" in message.lower()
    return {"outcome": "refused" if refused else f"error: {message[:80]}", "message": message[:200]}


async def all_users(url: str, model: str, users: int, length: int, timeout: float) -> list[dict]:
    """``users`` requests at once, from one event loop (light clients: the load generator
    shares the server's cores)."""
    # A connection per request, as separate browsers have: a pooled connection left idle past
    # the server's keep-alive (5 s) while the machine is saturated can be closed just as it
    # is reused, and a POST is not retried (a ReadError that is the client's, not the app's).
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout)) as http:
        return list(await asyncio.gather(*(one_user(http, url, model, length, seed, timeout)
                                           for seed in range(users))))


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def load_round(url: str, server_pid: int, users: int, length: int, timeout: float, model: str) -> dict:
    """``users`` clients at once, each one generation; the measures of the round."""
    before = resident_mb(server_pid)
    wall = time.perf_counter()
    results = asyncio.run(all_users(url, model, users, length, timeout))
    wall = time.perf_counter() - wall
    done = [r for r in results if r["outcome"] == "completed"]
    outcomes: dict[str, int] = {}
    for r in results:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    row = {"users": users, "length": length, "wall": wall, "outcomes": outcomes,
           "hung": outcomes.get("timed out", 0), "memory_before": before, "memory_after": resident_mb(server_pid)}
    refusals = [r["message"] for r in results if r["outcome"] == "refused"]
    if refusals:
        row["refusal"] = refusals[0]
    if done:
        firsts, speeds = [r["first"] for r in done], [r["chars_per_s"] for r in done]
        row.update(first_p50=percentile(firsts, 50), first_p95=percentile(firsts, 95),
                   per_user=statistics.median(speeds), all_chars_per_s=sum(r["chars"] for r in done) / wall)
    return row


def still_serves(url: str, model: str) -> dict:
    normal = len(client_for(url).predict(model, "", 50, 0.8, 0, 1.0, 1, 1, api_name="/generate")) == 50
    try:
        client_for(url).predict("no such model", "", 50, 0.8, 0, 1.0, 1, 1, api_name="/generate")
        unknown = "accepted (wrong)"
    except Exception as e:
        unknown = f"refused: {str(e)[:60]}"
    return {"normal": "served" if normal else "FAILED", "unknown": unknown}


MEASURES = [  # (row of the table, how a round shows it)
    ("completed", lambda r: str(r["outcomes"].get("completed", 0))),
    ("refused with a message", lambda r: str(r["outcomes"].get("refused", 0))),
    ("other errors", lambda r: str(sum(v for k, v in r["outcomes"].items() if k.startswith("error")))),
    ("hung past the timeout", lambda r: str(r["hung"])),
    ("first text, p50 / p95", lambda r: f"{r['first_p50']:.2f} / {r['first_p95']:.2f} s" if "first_p50" in r
     else "–"),
    ("chars/s per user (p50)", lambda r: f"{r['per_user']:,.0f}" if "per_user" in r else "–"),
    ("chars/s in all", lambda r: f"{r['all_chars_per_s']:,.0f}" if "all_chars_per_s" in r else "–"),
    ("server memory before / after", lambda r: f"{r['memory_before']:,.0f} / {r['memory_after']:,.0f} MB"),
    ("afterwards: a normal request / an unknown model",
     lambda r: f"{r['after']['normal']} / {r['after']['unknown'][:40]}"),
]


def report(rows: list[dict]) -> str:
    lines = []
    for code in dict.fromkeys(r["code"] for r in rows):
        mine = sorted((r for r in rows if r["code"] == code), key=lambda r: r["users"])
        counts = " | ".join(f"{r['users']} user{'s' * (r['users'] > 1)}" for r in mine)
        lines += [f"\n### app at {code}\n", f"| measure | {counts} |",
                  "| --- |" + " ---: |" * len(mine)]
        lines += [f"| {name} | " + " | ".join(show(r) for r in mine) + " |" for name, show in MEASURES]
    return "\n".join(lines)


def load(args: argparse.Namespace, root: Path) -> None:
    """The rounds (unless ``--report``), each appended to the results as it ends; then the table."""
    results = args.out / "results.jsonl"
    if not args.report:
        length = args.length or LENGTH["load"]
        with running_app(["--models", str(args.models)], root=root) as app:
            client_for(app.url).predict(args.model, "", 20, 0.8, 0, 1.0, 0, 1, api_name="/generate")  # load the model
            for users in args.users or USERS["load"]:
                row = load_round(app.url, app.process.pid, users, length, args.timeout, args.model)
                row.update(code=args.code, after=still_serves(app.url, args.model))
                print(json.dumps(row), flush=True)
                append_jsonl(results, row)
    print(report(read_jsonl(results)))


# --- the command -----------------------------------------------------------------------------
def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--only", choices=PARTS, help="one part (default: latency, then load)")
    parser.add_argument("--models", type=Path, default=ROOT / "models", help="the models folder the app serves")
    parser.add_argument("--model", default="shakespeare")
    parser.add_argument("--length", type=int,
                        help="characters per generation (default 2000 for latency, 1000 for load)")
    parser.add_argument("--users", type=int, nargs="+",
                        help="users at once: load's rounds (default 1 8 32 128); latency measures the largest "
                             "(default 8)")
    parser.add_argument("--tries", type=int, default=10, help="latency: first-text timings (default 10)")
    parser.add_argument("--timeout", type=float, default=120.0, help="load: seconds a request may take (default 120)")
    parser.add_argument("--code", default="now", metavar="REV",
                        help="a git revision whose app to run (default: this tree's)")
    parser.add_argument("--report", action="store_true", help="only print the load results so far")
    parser.add_argument("--out", type=Path, default=OUT / "app_load",
                        help="folder of load results and checkouts (default %(default)s)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report:
        load(args, ROOT)
        return
    root = ROOT if args.code == "now" else checkout(args.code, args.out / f"code-{args.code}")
    if args.only in (None, "latency"):
        latency(args, root)
    if args.only in (None, "load"):
        load(args, root)


if __name__ == "__main__":
    main()
