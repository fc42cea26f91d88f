"""The web app under load: many gradio_client streams at once against ``python app.py``.

Starts the app on loopback (the shipped models), then opens ``--users`` clients at once,
each asking for one generation of ``--length`` characters, with a per-request timeout. The
run is bounded in count and time and stops by itself. Every request must complete or be
turned away with the queue-full message; none may hang past its timeout. It prints the
outcomes, time to first text (p50/p95), chars/s per completed stream, the server's resident
memory before and after, and checks that the server still serves (a normal request, and a
malformed one that must get a clear error).

    python benchmarks/app_load.py                   # 32 users, ~1 min on 2 cores
    python benchmarks/app_load.py --users 48        # more than the queue holds
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

from app_latency import client_for, free_port, start_app  # noqa: E402


def resident_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def one_user(url: str, model: str, length: int, seed: int, timeout: float, results: list[dict]) -> None:
    start = time.perf_counter()
    first = None
    try:
        job = client_for(url).submit(model, "", length, 0.8, 0, 1.0, seed, 1, api_name="/generate")
        # Polled rather than iterated: gradio_client's iterator waits forever on a job the
        # server turned away.
        while not job.done():
            if first is None and job.outputs():
                first = time.perf_counter() - start
            if time.perf_counter() - start > timeout:
                job.cancel()
                results.append({"outcome": "timed out"})
                return
            time.sleep(0.005)
        text = job.result()
        total = time.perf_counter() - start
        first = first or total
        results.append({"outcome": "completed", "first": first, "total": total,
                        "chars_per_s": len(text) / max(1e-9, total - first), "chars": len(text)})
    except Exception as e:  # the client's way of reporting a refusal
        message = str(e)
        results.append({"outcome": "queue full" if "full" in message.lower() else f"error: {message[:80]}"})


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=32)
    parser.add_argument("--length", type=int, default=1000, help="characters per generation (default 1000)")
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds a request may take (default 120)")
    parser.add_argument("--model", default="shakespeare")
    args = parser.parse_args()

    port = free_port()
    server, _ = start_app(port, ROOT / "models")
    url = f"http://127.0.0.1:{port}/"
    try:
        client_for(url).predict(args.model, "", 20, 0.8, 0, 1.0, 0, 1, api_name="/generate")  # load the model
        before = resident_mb(server.pid)
        results: list[dict] = []
        threads = [threading.Thread(target=one_user, args=(url, args.model, args.length, i, args.timeout, results),
                                    daemon=True) for i in range(args.users)]
        wall = time.perf_counter()
        for t in threads:
            t.start()
        deadline = time.perf_counter() + args.timeout + 30
        for t in threads:
            t.join(timeout=max(0.0, deadline - time.perf_counter()))
        wall = time.perf_counter() - wall
        hung = sum(t.is_alive() for t in threads)
        after = resident_mb(server.pid)
        # Still serving: a normal request, and a malformed one that gets a clear error.
        still = len(client_for(url).predict(args.model, "", 50, 0.8, 0, 1.0, 1, 1, api_name="/generate")) == 50
        try:
            client_for(url).predict("no such model", "", 50, 0.8, 0, 1.0, 1, 1, api_name="/generate")
            malformed = "accepted (wrong)"
        except Exception as e:
            malformed = f"refused: {str(e)[:60]}"
    finally:
        server.terminate()
        server.wait(timeout=30)

    outcomes: dict[str, int] = {}
    for r in results:
        outcomes[r["outcome"]] = outcomes.get(r["outcome"], 0) + 1
    done = [r for r in results if r["outcome"] == "completed"]
    print(f"\n{args.users} users at once, {args.length} characters each, model {args.model}; "
          f"{wall:.0f} s in all; queue: 4 at a time, at most 32 waiting\n")
    print("| measure | value |")
    print("| --- | ---: |")
    for outcome, count in sorted(outcomes.items()):
        print(f"| {outcome} | {count} |")
    print(f"| hung past the timeout | {hung} |")
    if done:
        firsts = [r["first"] for r in done]
        speeds = [r["chars_per_s"] for r in done]
        print(f"| time to first text, p50 / p95 | {percentile(firsts, 50):.2f} s / {percentile(firsts, 95):.2f} s |")
        print(f"| chars/s per stream once started, p50 / p5 | {statistics.median(speeds):,.0f} / "
              f"{percentile(speeds, 5):,.0f} |")
        print(f"| all completed streams together | {sum(r['chars'] for r in done) / wall:,.0f} chars/s |")
    print(f"| server memory before / after | {before:,.0f} MB / {after:,.0f} MB |")
    print(f"| afterwards: a normal request | {'served' if still else 'FAILED'} |")
    print(f"| afterwards: an unknown model name | {malformed} |")


if __name__ == "__main__":
    main()
