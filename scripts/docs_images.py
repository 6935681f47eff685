"""Make the documentation's images from the committed golden run, in headless Chromium: never by hand.

    .venv/bin/python scripts/docs_images.py [--out docs/images]

Writes `kvbench report` of tests/data/golden (a real `kvbench run tests/data/golden.yaml`) into a temporary folder,
opens its report.html in headless Chromium (selenium, a 1280 px wide viewport, device scale 1) and saves into --out:

- report-top.png: the top of the page (title, recommendation, findings, diagnoses, the run's machine), cut just
  above the results table;
- report-table.png: the results table (one row per prompt length × batch × mode), its left part: the table
  scrolls sideways in the page, so the image ends after the last column that fits 1280 px whole (prompt, batch,
  mode, trials, TTFT, TPOT, TPOT interval, e2e);
- chart-saving-overhead.png, chart-throughput-batch.png, chart-bytes-per-token.png, chart-timelines.png: the
  report's own chart PNGs, copied under stable names.

No map heatmap: the only committed shared-prefix data (tests/data/peers/map, GuideLLM and AIPerf files) maps to a
table, and `kvbench map` draws heatmaps for kvbench's own shared_prefix runs only, none of which is committed.

Needs Debian's chromium and chromedriver (apt-get install chromium chromium-driver) and selenium (the test extra);
without them it exits 2 and says so. The temporary folder (report, browser profile) is removed on every exit path.
"""

from __future__ import annotations

import argparse
import base64
import io
import shutil
import signal
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = ROOT / "tests" / "data" / "golden"
WIDTH, HEIGHT = 1280, 900  # the viewport, CSS pixels at device scale 1
MAX_BYTES = 300_000  # a PNG above this is re-encoded smaller (palette, then halved) when Pillow is there
#: The report's chart file (its name up to `_<scenario>.png`) -> the name it gets in the docs.
CHARTS = {"saving_overhead": "chart-saving-overhead.png", "throughput_batch": "chart-throughput-batch.png",
          "bytes_per_token": "chart-bytes-per-token.png", "timelines": "chart-timelines.png"}
INSTALL = "apt-get install chromium chromium-driver"


class Missing(Exception):
    """Something the script needs is not installed: exit 2 with this message."""


def golden_run() -> Path:
    runs = sorted(p for p in GOLDEN.iterdir() if (p / "run.json").is_file()) if GOLDEN.is_dir() else []
    if not runs:
        raise Missing(f"no committed golden run under {GOLDEN}")
    return runs[0]


def browser_paths() -> tuple[str, str]:
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not (chromium and driver):
        missing = " and ".join(n for n, p in (("chromium", chromium), ("chromedriver", driver)) if not p)
        raise Missing(f"{missing} not found on PATH: {INSTALL}")
    try:
        import selenium  # noqa: F401
    except ImportError:
        raise Missing("selenium is not installed: .venv/bin/pip install -e '.[test]'") from None
    return chromium, driver


def write_golden_report(out: Path) -> list[tuple[str, Path]]:
    import kvbench

    rep = kvbench.write_report(kvbench.load_results([golden_run()]), out)
    return list(rep.charts)


def small_png(data: bytes) -> bytes:
    """``data`` re-encoded under MAX_BYTES when it is above (optimised, then a 256-colour palette, then halved)."""
    if len(data) <= MAX_BYTES:
        return data
    try:
        from PIL import Image
    except ImportError:
        return data
    img = Image.open(io.BytesIO(data)).convert("RGB")
    for step in ("optimize", "palette", "half"):
        if step == "palette":
            img = img.quantize(colors=256, method=Image.Quantize.MEDIANCUT, dither=Image.Dither.NONE)
        elif step == "half":
            img = img.resize((img.width // 2, img.height // 2), Image.Resampling.LANCZOS)
        buf = io.BytesIO()
        img.save(buf, format="PNG", optimize=True)
        data = buf.getvalue()
        if len(data) <= MAX_BYTES:
            break
    return data


#: The results table's box in page pixels (x, y, width, height), its width cut after the last whole visible column.
TABLE_BOX = """const div = arguments[0], box = div.getBoundingClientRect();
const right = Math.max(...Array.from(div.querySelectorAll('thead th')).map(th => th.getBoundingClientRect().right)
                                .filter(r => r <= box.right + 0.5));
return [Math.floor(box.left + scrollX), Math.floor(box.top + scrollY), Math.ceil(right - box.left) + 1,
        Math.ceil(box.height)];"""


def clip(browser, x: int, y: int, width: int, height: int) -> bytes:
    """A PNG of that rectangle of the page (page pixels, scale 1), wherever the page is scrolled."""
    shot = browser.execute_cdp_cmd("Page.captureScreenshot", {
        "format": "png", "captureBeyondViewport": True,
        "clip": {"x": x, "y": y, "width": width, "height": height, "scale": 1}})
    return base64.b64decode(shot["data"])


def screenshots(html: Path, profile: Path, chromium: str, driver: str) -> dict[str, bytes]:
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    opts = webdriver.ChromeOptions()
    opts.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--hide-scrollbars", "--force-device-scale-factor=1", f"--window-size={WIDTH},{HEIGHT}",
                f"--user-data-dir={profile}"):
        opts.add_argument(arg)
    browser = webdriver.Chrome(service=Service(driver), options=opts)
    try:
        # The viewport itself, not the window: exactly WIDTH × HEIGHT CSS pixels at scale 1.
        browser.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                                {"width": WIDTH, "height": HEIGHT, "deviceScaleFactor": 1, "mobile": False})
        browser.get(html.resolve().as_uri())
        WebDriverWait(browser, 30).until(lambda b: b.execute_script(
            "return document.readyState === 'complete' && Array.from(document.images).every("
            "i => i.complete && i.naturalWidth > 0)"))
        table = browser.find_element(By.CSS_SELECTOR, "div.table")
        x, y, w, h = browser.execute_script(TABLE_BOX, table)
        # The top, cut just above the results table (so no row is cut in half), at most one viewport high.
        out = {"report-top.png": clip(browser, 0, 0, WIDTH, max(200, min(HEIGHT, y - 8)))}
        # The results table scrolls sideways (19 columns, about 3,200 px): its left part, up to the last column
        # that fits the page's width whole, every row.
        out["report-table.png"] = clip(browser, x, y, w, h)
        return out
    finally:
        browser.quit()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, default=ROOT / "docs" / "images", help="where the PNGs go (docs/images)")
    args = ap.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the temporary folder and the browser go on that path too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        chromium, driver = browser_paths()
        golden_run()
    except Missing as e:
        print(f"docs_images: {e}", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="kvbench-docs-images-") as tmp:
        tmp = Path(tmp)
        charts = write_golden_report(tmp / "report")
        images: dict[str, bytes] = {}
        for _, png in charts:
            stem = png.stem.rsplit("_", 1)[0]  # saving_overhead_golden -> saving_overhead
            if stem in CHARTS:
                images[CHARTS[stem]] = png.read_bytes()
        if lost := sorted(set(CHARTS.values()) - set(images)):
            print(f"docs_images: the golden report drew no {', '.join(lost)} (charts: "
                  f"{', '.join(p.name for _, p in charts) or 'none'})", file=sys.stderr)
            return 1
        images.update(screenshots(tmp / "report" / "report.html", tmp / "profile", chromium, driver))
        # Everything made first, then written: a failure above leaves --out as it was.
        args.out.mkdir(parents=True, exist_ok=True)
        for name in sorted(images):
            data = small_png(images[name])
            (args.out / name).write_bytes(data)
            print(f"{args.out / name}  {len(data):,} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main())
