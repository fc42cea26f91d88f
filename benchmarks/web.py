"""The exported page (``chargen export --web``) in headless Chromium, next to the Python
samplers, in one run:

- chars/s in the page for 1 and 8 samples of the shipped Shakespeare model (fp32 and fp16
  weights; the WebAssembly kernel, and the JavaScript fallback for 1 sample), the median of
  ``--rounds`` page loads each, the rows alternated;
- the first character's time after navigation starts (weights fetched from loopback);
- a step's parts, timed in the page: the step, its recurrent product, its cell;
- in-process Python: the default sampler (``Sampler``) and ``--rng portable``;
- how often fp16 weights change the text: ``--texts`` samples drawn by the portable
  arithmetic with the fp32 weights and with the weights rounded through fp16 (exactly the
  page's numbers), for the Shakespeare and names models: how many come out the same, and
  where the others first differ.

    python -m benchmarks.web              # ~4 min on 2 cores; needs chromium and playwright
    python -m benchmarks.web --against REV  # and the page with REV's chargen.js, alternated

It writes benchmarks/out/web/results.json and prints markdown tables.
"""

from __future__ import annotations

import statistics
import subprocess
import time

import torch

import chargen
from benchmarks import common
from benchmarks.common import ROOT, command_line, cpu_name, static_server, write_json
from chargen.export import export_web
from chargen.portable import PortableModel, PortableSampler

OUT = common.OUT / "web"


def page_run(browser, url: str) -> dict:
    """One fresh page load (a new context: nothing cached), to the end of its text."""
    context = browser.new_context(bypass_csp=True)
    page = context.new_page()
    page.goto(url)
    page.wait_for_function("window.chargenTimings && window.chargenTimings.runs >= 1", timeout=300_000)
    run = page.evaluate("() => ({...window.chargenTimings, kernel: document.querySelector('#about')"
                        ".textContent.split(', ').pop()})")
    context.close()
    return run


def statistics_of(parts: list[dict]) -> dict:
    return {name: statistics.median(p[name] for p in parts) for name in parts[0]}


def summary(runs: list[dict]) -> dict:
    return {"chars_per_s": statistics.median(r["rate"] for r in runs),
            "first_char_ms": statistics.median(r["firstChar"] for r in runs),
            "loaded_ms": statistics.median(r["loaded"] for r in runs), "kernel": runs[0]["kernel"],
            "rounds": [round(r["rate"]) for r in runs]}


# A step's parts, timed inside the page on the loaded model (µs per step, one sample).
PARTS_JS = """async () => {
  const m = await chargen.loadModel("."), state = m.initialState(1), G = 4 * m.hidden;
  for (let i = 0; i < 300; i++) m.step([10], state);
  const time = (f, n = 2000) => {
    const t = performance.now();
    for (let i = 0; i < n; i++) f();
    return (performance.now() - t) / n * 1000;
  };
  return {
    step: time(() => m.step([10], state)),
    recurrent_product: time(() => m.matvec(m.t["lstm.weight_hh_l0"], m.h[0], m.t["lstm.bias_hh_l0"], m.gates, G,
                                           m.width, 1)),
    cell: time(() => m.cell(m.input, m.gates, m.c[0], m.h[0], 1)),
  };
}"""


def step_parts(browser, url: str) -> dict:
    context = browser.new_context(bypass_csp=True)
    page = context.new_page()
    page.goto(url + "/fp32/index.html?autostart=0")
    parts = page.evaluate(PARTS_JS)
    context.close()
    return parts


def python_speed(model: chargen.TrainedModel, samples: int, length: int, portable: bool) -> float:
    sampler = model.sampler("", num_samples=samples, seed=1, rng="portable" if portable else "torch")
    list(sampler.pieces(20))  # (the prime and the first steps)
    start = time.perf_counter()
    steps = sum(1 for _ in sampler.pieces(length))
    return steps * samples / (time.perf_counter() - start)


def python_rows(model: chargen.TrainedModel, length: int) -> dict:
    rows = {}
    for samples in (1, 8):
        rows[f"default {samples}"] = python_speed(model, samples, length // 5, portable=False)
        rows[f"portable {samples}"] = python_speed(model, samples, length // 20, portable=True)
    return rows


def fp16_differences(model: chargen.TrainedModel, texts: int, length: int) -> dict:
    """Texts drawn by the portable arithmetic on the fp32 weights and on the fp16-rounded
    weights (the fp16 page's numbers), stream j of seed 0 for text j."""
    drawn = {}
    for dtype in ("float32", "float16"):
        sampler = PortableSampler(PortableModel(model.model, dtype), model.tokenizer, model.default_prime,
                                  num_samples=texts, seed=0, items=model.kind.items)
        for _ in sampler.pieces(length):
            pass
        drawn[dtype] = sampler.texts
    first = [next((i for i, (a, b) in enumerate(zip(x, y, strict=False)) if a != b), min(len(x), len(y)))
             for x, y in zip(drawn["float32"], drawn["float16"], strict=True)]
    differ = [f for f, x, y in zip(first, drawn["float32"], drawn["float16"], strict=True) if x != y]
    return {"texts": texts, "same": texts - len(differ), "chars": sum(map(len, drawn["float32"])),
            "first_difference_median": statistics.median(differ) if differ else None}


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--rounds", type=int, default=3, help="page loads per row (default 3; the median is shown)")
    parser.add_argument("--length", type=int, default=10_000, help="characters per sample for 1 sample")
    parser.add_argument("--texts", type=int, default=100, help="texts per model for the fp16 comparison")
    parser.add_argument("--against", metavar="REV",
                        help="also the page with chargen.js of git revision REV (1 and 8 samples), alternated with "
                        "this one's: before and after on one machine")
    parser.add_argument("--python-only", action="store_true",
                        help="only the Python samplers' rows (for ONEDNN_MAX_CPU_ISA=AVX2: the page uses no oneDNN)")
    args = parser.parse_args()
    model = chargen.load(ROOT / "models" / "shakespeare", device="cpu")
    if args.python_only:
        print({name: round(speed) for name, speed in python_rows(model, args.length).items()})
        return
    from playwright.sync_api import sync_playwright

    OUT.mkdir(parents=True, exist_ok=True)
    shipped = ROOT / "models" / "shakespeare"
    for dtype in ("fp32", "fp16"):
        export_web(shipped, OUT / dtype, web_dtype=dtype, force=True, card=False)
    if args.against:  # the same page with an earlier sampler
        export_web(shipped, OUT / "against", force=True, card=False)
        code = subprocess.run(["git", "show", f"{args.against}:chargen/page/chargen.js"], cwd=ROOT, check=True,
                              capture_output=True).stdout
        (OUT / "against" / "chargen.js").write_bytes(code)
    results: dict = {"machine": cpu_name(), "torch": torch.__version__,
                     "threads": torch.get_num_threads(), "page": {}, "python": {}}
    rows = [("fp32", 1, args.length, "auto"), ("fp32", 8, args.length // 4, "auto"), ("fp16", 1, args.length, "auto"),
            ("fp32", 1, args.length // 5, "js")]
    if args.against:
        rows += [("against", 1, args.length, "auto"), ("against", 8, args.length // 4, "auto")]
    runs: dict[tuple, list[dict]] = {row: [] for row in rows}
    with sync_playwright() as p, static_server(OUT) as url:
        browser = p.chromium.launch(executable_path=common.chromium(), args=["--no-sandbox"])
        results["chromium"] = browser.version
        for _ in range(args.rounds):  # (rows alternated, round by round: the machine's speed drifts)
            for row in rows:
                dtype, samples, length, kernel = row
                query = f"/{dtype}/index.html?seed=1&length={length}&samples={samples}&kernel={kernel}"
                runs[row].append(page_run(browser, url + query))
        results["parts_us"] = statistics_of([step_parts(browser, url) for _ in range(args.rounds)])
        browser.close()
    print("a step's parts in the page (µs):", {k: round(v) for k, v in results["parts_us"].items()})
    for (dtype, samples, _, _), row_runs in runs.items():
        row = summary(row_runs)
        results["page"][f"{dtype} {samples} {row['kernel']}"] = row
        print(f"page {dtype}, {samples} samples, {row['kernel']}: {row['chars_per_s']:,.0f} chars/s, first "
              f"character at {row['first_char_ms']:.0f} ms (rounds {row['rounds']})", flush=True)
    results["python"] = python_rows(model, args.length)
    print("python:", {k: round(v) for k, v in results["python"].items()}, flush=True)
    results["fp16"] = {"shakespeare": fp16_differences(model, args.texts, 500),
                       "names": fp16_differences(chargen.load(ROOT / "models" / "names", device="cpu"),
                                                 args.texts, 100)}
    write_json(OUT / "results.json", results, indent=1)
    report(results)


def report(results: dict) -> None:
    page, python = results["page"], results["python"]
    if "against 1 wasm-simd" in page:
        print("\n| page | 1 sample | 8 samples |\n| --- | ---: | ---: |")
        for name in ("against", "fp32"):
            print(f"| {name} | {page[name + ' 1 wasm-simd']['chars_per_s']:,.0f} | "
                  f"{page[name + ' 8 wasm-simd']['chars_per_s']:,.0f} |")
    print(f"\nChromium {results['chromium']}; torch {results['torch']}, {results['threads']} threads\n")
    print("| sampler | 1 sample (chars/s) | 8 samples (chars/s, all together) |")
    print("| --- | ---: | ---: |")
    print(f"| page, fp32 weights, WebAssembly | {page['fp32 1 wasm-simd']['chars_per_s']:,.0f} | "
          f"{page['fp32 8 wasm-simd']['chars_per_s']:,.0f} |")
    print(f"| page, fp16 weights, WebAssembly | {page['fp16 1 wasm-simd']['chars_per_s']:,.0f} | |")
    print(f"| page, fp32 weights, JavaScript fallback | {page['fp32 1 js']['chars_per_s']:,.0f} | |")
    print(f"| Python, default sampler | {python['default 1']:,.0f} | {python['default 8']:,.0f} |")
    print(f"| Python, --rng portable | {python['portable 1']:,.0f} | {python['portable 8']:,.0f} |")
    print("\n| weights | download | first character after navigation starts |")
    print("| --- | ---: | ---: |")
    for dtype in ("fp32", "fp16"):
        size = (OUT / dtype / "weights.bin").stat().st_size
        print(f"| {dtype} | {size / 1e6:.1f} MB | {page[f'{dtype} 1 wasm-simd']['first_char_ms']:.0f} ms |")
    print("\n| model | texts | same text with fp16 weights | median first difference (chars) |")
    print("| --- | ---: | ---: | ---: |")
    for name, row in results["fp16"].items():
        where = "" if row["first_difference_median"] is None else f"{row['first_difference_median']:.0f}"
        print(f"| {name} | {row['texts']} | {row['same']} | {where} |")


if __name__ == "__main__":
    main()
