"""The documentation's images: scripts/docs_images.py makes them from the committed golden run in headless Chromium,
and every `images/NAME.png` a page of docs/ shows is in docs/images."""

from __future__ import annotations

import os
import re
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import require_chromium

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SCRIPT = ROOT / "scripts" / "docs_images.py"
WIDTH = 1280  # the script's viewport
IMAGES = ["chart-bytes-per-token.png", "chart-saving-overhead.png", "chart-throughput-batch.png",
          "chart-timelines.png", "report-table.png", "report-top.png"]


def png_size(data: bytes) -> tuple[int, int]:
    """Width and height from a PNG's IHDR chunk (the first, right after the 8-byte signature)."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR", data[:16]
    return struct.unpack(">II", data[16:24])


@pytest.mark.browser
def test_the_script_makes_every_image_in_headless_chromium(tmp_path):
    require_chromium()
    out = tmp_path / "images"
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert sorted(p.name for p in out.iterdir()) == IMAGES
    for name in IMAGES:
        data = (out / name).read_bytes()
        assert f"{out / name}  {len(data):,} bytes" in r.stdout
        w, h = png_size(data)
        assert 300 < w <= WIDTH and h > 200, (name, w, h)
        assert len(data) < 300_000, (name, len(data))
    assert png_size((out / "report-top.png").read_bytes())[0] == WIDTH


def test_without_a_browser_the_script_exits_2_and_says_what_to_install(tmp_path):
    r = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "images")], capture_output=True,
                       text=True, timeout=60, env={**os.environ, "PATH": str(tmp_path / "empty")})
    assert r.returncode == 2 and "apt-get install chromium chromium-driver" in r.stderr, r.stdout + r.stderr
    assert not (tmp_path / "images").exists()


def test_every_image_the_docs_show_is_committed():
    refs = {(page.name, m) for page in DOCS.glob("**/*.md")
            for m in re.findall(r"images/([\w.-]+\.png)", page.read_text(encoding="utf-8"))}
    missing = sorted(f"{page}: images/{name}" for page, name in refs if not (DOCS / "images" / name).is_file())
    assert missing == [], f"run `.venv/bin/python scripts/docs_images.py`, or fix the reference: {missing}"
