"""The docs' pictures of the app, as a visitor sees it in Chromium: the Generate tab (the
shipped Shakespeare model, an example prime clicked and generated from with seed 3) and the
Train tab after a training with the tab's defaults, untouched (Shakespeare, auto size,
60 s), its curve and samples.

    python -m benchmarks.screenshots            # ~2 min on 2 cores; writes docs/app-*.png
    python -m benchmarks.screenshots --out DIR

It starts ``python app.py`` on loopback with the shipped models and a runs folder of its
own, and needs Debian's chromium and the playwright package (``pip install -e '.[test]'``).
Run it with nothing else on the CPU: the auto size is chosen by a speed test. The browser
test (tests/test_app.py) drives the same steps, with the training stopped early.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

from benchmarks.common import ROOT, chromium, command_line, running_app

EXAMPLE = "KING HENRY:\nOnce more"  # (one of the shipped model's example primes)


@contextlib.contextmanager
def browser_page(width: int = 1200, height: int = 1000) -> Iterator:
    """A page of headless Chromium (Debian's), closed however the block ends."""
    from playwright.sync_api import sync_playwright

    browser_path = chromium()
    if browser_path is None:
        raise SystemExit("needs Chromium: apt-get install chromium")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=browser_path, args=["--no-sandbox"])
        try:
            yield browser.new_page(viewport={"width": width, "height": height})
        finally:
            browser.close()


def generate_tab(page, url: str, out: Path) -> None:
    """An example row clicked (it fills model and prime), then Generate: out/app-generate.png."""
    from playwright.sync_api import expect

    page.goto(url)
    page.get_by_text(EXAMPLE.replace("\n", " ")).click()
    expect(page.get_by_label("prime")).to_have_value(EXAMPLE)
    page.get_by_label("seed (-1: random)").fill("3")
    page.get_by_role("button", name="Generate", exact=True).click()
    output = page.locator("#output textarea")
    expect(output).to_have_value(re.compile(re.escape(EXAMPLE) + ".{500}", re.S), timeout=30_000)
    page.screenshot(path=str(out / "app-generate.png"), full_page=True)


def train_tab(page, out: Path, stop_after_progress: bool = False) -> None:
    """The Train tab as a visitor finds it (its defaults checked), Start training, and the
    page when the run has ended: out/app-train.png. ``stop_after_progress``: Stop and save
    once the curve has a few points, instead of waiting out the budget."""
    from playwright.sync_api import expect

    page.get_by_role("tab", name="Train").click()
    expect(page.get_by_label("auto (fits the time)")).to_be_checked()
    expect(page.get_by_label("number input for time budget (seconds)")).to_have_value("60")
    page.get_by_role("button", name="Start training").click()
    if stop_after_progress:
        expect(page.get_by_text(re.compile(r"step [\d,]+ of [\d,]+ · loss"))).to_be_visible(timeout=60_000)
        page.wait_for_timeout(3000)  # (a few more points)
        page.get_by_role("button", name="Stop and save").click()
        ended = re.compile(r"\) stopped at step [\d,]+; "
                           r"(not validated yet|(best )?validation \d\.\d{3} bits/char( on a sample)?)")
        expect(page.get_by_text(ended)).to_be_visible(timeout=60_000)
    else:
        ended = re.compile(r"reached its time budget at step [\d,]+; best validation \d\.\d{3} bits/char")
        expect(page.get_by_text(ended)).to_be_visible(timeout=150_000)
        scored = re.compile(r"^step [\d,]+ \(validation \d\.\d{3} bits/char\):")
        expect(page.locator("#samples textarea")).to_have_value(scored)
    titled = page.get_by_role("img").filter(has_text="training time (seconds)").filter(has_text="(bits per character)")
    expect(titled).to_be_visible()  # (the curve, both axes titled)
    page.wait_for_timeout(1000)  # (the last curve point is drawn)
    page.screenshot(path=str(out / "app-train.png"), full_page=True)


def main() -> None:
    parser = command_line(__doc__, __spec__.name)
    parser.add_argument("--out", type=Path, default=ROOT / "docs", help="where the two pictures go (default docs/)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as runs, \
            running_app(["--models", str(ROOT / "models"), "--runs", runs], cwd=Path(runs)) as app, \
            browser_page() as page:
        generate_tab(page, app.url, args.out)
        train_tab(page, args.out)
    print(f"wrote {args.out / 'app-generate.png'} and {args.out / 'app-train.png'}")


if __name__ == "__main__":
    main()
