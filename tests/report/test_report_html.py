"""report.html as a reader sees it: opened in headless Chromium at 1,280 pixels it has a cost section and no
horizontal scrollbar (the per-point table's every column is in a closed <details>), and its glossary is rendered."""

from __future__ import annotations

import re
import struct

import pytest

from conftest import headless_chromium
from golden_run import FULL, HIER, copy_run
from kvbench.analysis.points import point_table
from kvbench.report.cost_section import cost_section
from kvbench.report.write import write_report
from kvbench.results.load import load_results

WIDTH = 1280

#: Per main table (not inside a <details>): its width and the width it would need; the page's, and the cost section.
LAYOUT = """const shown = Array.from(document.querySelectorAll('div.table')).filter(d => !d.closest('details'));
const cost = document.querySelector('section.cost');
return {page: [document.documentElement.scrollWidth, document.documentElement.clientWidth],
        tables: shown.map(d => [d.scrollWidth, d.clientWidth]),
        details: Array.from(document.querySelectorAll('details')).map(d => d.open),
        cost: cost && [cost.getBoundingClientRect().width, cost.innerText]};"""


def quiet_run(tmp_path, edit=None):
    """The golden run as if its load had been recorded quiet (it predates load recording): its verdicts decide."""
    def quiet(r):
        r = dict(r, machine_busy=False)
        return edit(r) if edit else r

    return copy_run(tmp_path, "quiet", edit=quiet)


@pytest.fixture
def browser(tmp_path):
    """Headless Chromium with a viewport of exactly WIDTH CSS pixels (as tests/report/test_report.py opens it)."""
    b = headless_chromium(tmp_path / "p", "--force-device-scale-factor=1", f"--window-size={WIDTH},900")
    b.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",
                      {"width": WIDTH, "height": 900, "deviceScaleFactor": 1, "mobile": False})
    yield b
    b.quit()


@pytest.mark.browser
def test_report_html_at_1280_pixels_shows_the_cost_section_and_no_horizontal_scrollbar(tmp_path, browser):
    """From the issue: report.html had no cost section, and its tables sat behind a horizontal scrollbar even on a
    2,600-pixel window. At 1,280 pixels the page and every main table fit; the screenshot shows the cost section."""
    rep = write_report(load_results([quiet_run(tmp_path)]), tmp_path / "report")
    browser.get(rep.files["report.html"].resolve().as_uri())
    got = browser.execute_script(LAYOUT)
    assert got["page"][0] <= got["page"][1] <= WIDTH, got["page"]
    assert len(got["tables"]) == 2 and all(need <= width for need, width in got["tables"]), got["tables"]
    assert got["details"] == [False]  # every column of the per-point table: there, closed
    assert got["cost"] is not None and got["cost"][0] <= WIDTH
    text = got["cost"][1]
    assert "Cost: saving against the baseline" in text and "GPU-h/1M" in text
    assert f"at 32 tokens {HIER} vs none: −23.6% [−75.8%, −10.3%], 5 pairs (batch 2 vs none's 2): raises cost" in text
    section = browser.find_element("css selector", "section.cost")
    browser.execute_script("arguments[0].scrollIntoView()", section)
    shot = section.screenshot_as_png
    (tmp_path / "cost-section-1280.png").write_bytes(shot)
    width, height = struct.unpack(">II", shot[16:24])
    assert 600 < width <= WIDTH and height > 200, (width, height)


def test_the_cost_section_gives_each_modes_saving_pairs_and_verdict(tmp_path):
    results = load_results([quiet_run(tmp_path)])
    sec = cost_section(results, point_table(results.trials))
    cells = sec.offload["golden"]
    rows = {(r["prompt (tokens)"], r["mode"]): r for r in cells.to_dict("records")}
    assert rows[("32", FULL)]["saving vs none"] == "−12.0% [−176.8%, −6.0%]"
    assert (rows[("32", FULL)]["pairs"], rows[("32", FULL)]["verdict"]) == ("5", "raises cost")
    assert rows[("32", "none")]["verdict"] == "ref" and rows[("96", "none")]["saving vs none"] == (
        "over the budget at every batch size")
    assert rows[("96", FULL)]["saving vs none"] == "n/a"  # no `none` to compare with at 96 tokens
    # decided savings first: the two decided (raises cost) before the two whose interval includes 0
    assert [x.split(" vs none")[0] for x in sec.lines["golden"]] == [
        f"at 32 tokens `{m}`" for m in (FULL, HIER, "hierarchical(window=16,host_max_tokens=16)",
                                        "dynamic(min_window=16,max_window=48)")]
    assert sec.lines["golden"][2].endswith(": inconclusive: the interval includes no change")
    assert sec.reuse == {}


def test_the_glossary_is_rendered_and_file_text_stays_escaped(tmp_path):
    """From the issue: the Columns section showed raw Markdown (**paired**, `none`)."""
    evil = "<img src=https://evil/x.png> **b** `c`"
    run = quiet_run(tmp_path, edit=lambda r: dict(r, mode_label=f"full {evil}") if r["mode_label"] == FULL else r)
    rep = write_report(load_results([run]), tmp_path / "report")
    page = rep.files["report.html"].read_text()
    columns = page[page.index("<h2>Columns</h2>"):]
    assert "are <b>paired</b>: repeat r of a mode next to repeat r of <code>none</code>" in columns
    assert "**" not in columns and "`" not in columns
    assert "<img src=https" not in page and "full &lt;img src=https://evil/x.png&gt; **b** `c`" in page
    assert len(re.findall(r"<img ", page)) == len(rep.charts)
    md = rep.files["report.md"].read_text()
    assert md.index("## Cost: saving against the baseline") < md.index("## Columns")
    assert "full \\<img src=https\\://evil/x.png\\> \\*\\*b\\*\\* \\`c\\`" in md
