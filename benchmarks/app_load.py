"""The web app under load: many users streaming at once from ``python app.py``.

Starts the app on loopback (the shipped models), then for each count of ``--users`` sends
that many requests at once, each for one generation of ``--length`` characters, through
Gradio's HTTP API (a POST, then its event stream: what the page's own script does), with a
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
sitting; results are appended to benchmarks/out/app_load/results.jsonl and ``--report``
prints them side by side.

    python benchmarks/app_load.py                          # 1, 8, 32 and 128 users (~3 min on 2 cores)
    python benchmarks/app_load.py --code 5920378           # the same against the app at that commit
    python benchmarks/app_load.py --report                 # the table of both
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from app_latency import client_for, free_port, start_app  # noqa: E402
from worktree import checkout  # noqa: E402

OUT = ROOT / "benchmarks" / "out" / "app_load"


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, nargs="+", default=[1, 8, 32, 128])
    parser.add_argument("--length", type=int, default=1000, help="characters per generation (default 1000)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a request may take (default 120)")
    parser.add_argument("--model", default="shakespeare")
    parser.add_argument("--code", default="now", help="a git revision whose app to run (default: this tree's)")
    parser.add_argument("--report", action="store_true", help="only print the results so far")
    parser.add_argument("--out", type=Path, default=OUT, help="folder of results and checkouts (default %(default)s)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "results.jsonl"
    if not args.report:
        root = ROOT if args.code == "now" else checkout(args.code, args.out / f"code-{args.code}")
        port = free_port()
        server, _ = start_app(port, ROOT / "models", root)
        url = f"http://127.0.0.1:{port}/"
        try:
            client_for(url).predict(args.model, "", 20, 0.8, 0, 1.0, 0, 1, api_name="/generate")  # load the model
            for users in args.users:
                row = load_round(url, server.pid, users, args.length, args.timeout, args.model)
                row.update(code=args.code, after=still_serves(url, args.model))
                print(json.dumps(row), flush=True)
                with open(results, "a") as f:
                    f.write(json.dumps(row) + "\n")
        finally:
            server.terminate()
            server.wait(timeout=30)
    rows = [json.loads(line) for line in results.read_text().splitlines()] if results.exists() else []
    print(report(rows))


if __name__ == "__main__":
    main()
