"""report.html in a real headless Chromium, at 1400 and 800 px: images load, links land, nothing overflows the page.

Screenshots of the whole page are kept under pytest's tmp_path and, when RINGBENCH_ARTIFACTS names a folder,
copied there (e.g. for CI to upload). Skipped when chromium is not installed (apt-get install -y chromium).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from support.given import SimConfig, simulate_run

from ringbench.record.store import load_run
from ringbench.report import write_report

DATA = Path(__file__).parent / "data" / "analysis"
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
WIDTHS = (1400, 800)
MAX_HEIGHT = 16000
# Appended to a copy of the page (the report itself carries no script): what loaded, where links point, how wide.
CHECK = """<script>window.addEventListener("load", () => {
  const bad = [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).length;
  const dangling = [...document.querySelectorAll('a[href^="#"]')]
    .filter(a => !document.getElementById(decodeURIComponent(a.getAttribute("href").slice(1)))).length;
  const root = document.documentElement;
  const clipped = [...document.querySelectorAll(".scroll")].filter(d => d.scrollWidth > d.clientWidth + 1).length;
  const mark = document.createElement("div"); mark.id = "rb-check";
  mark.textContent = "images=" + document.images.length + " broken=" + bad + " dangling=" + dangling +
    " overflow=" + (root.scrollWidth - root.clientWidth) + " height=" + root.scrollHeight + " clipped=" + clipped;
  document.body.appendChild(mark);
  if (bad) console.error("broken images: " + bad);
});</script>"""

pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)")


def _chromium(profile: Path, *args: str) -> subprocess.CompletedProcess:
    command = [
        CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync", "--hide-scrollbars",
        f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0", "--virtual-time-budget=5000", *args,
    ]  # fmt: skip
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def _check(page: Path, width: int, profile: Path) -> dict[str, int]:
    done = _chromium(profile, f"--window-size={width},1000", "--dump-dom", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    console = [line for line in done.stderr.splitlines() if "CONSOLE" in line or "Uncaught" in line]
    assert console == []
    found = re.search(r'id="rb-check">([^<]*)<', done.stdout)
    assert found, done.stdout[-2000:]
    return {key: int(value) for key, value in re.findall(r"(\w+)=(-?\d+)", found.group(1))}


def _screenshot(page: Path, width: int, height: int, out: Path, profile: Path) -> Path:
    done = _chromium(profile, f"--window-size={width},{height}", f"--screenshot={out}", page.as_uri())
    assert done.returncode == 0 and out.exists(), done.stderr[-2000:]
    return out


def _keep(paths: list[Path]) -> None:
    target = os.environ.get("RINGBENCH_ARTIFACTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        for path in paths:
            shutil.copy2(path, Path(target) / path.name)


def _sweep(tmp_path: Path):
    configs = [
        SimConfig.of(world=4, mask="causal", layout=layout, buffer=buffer, iterations=6, jitter=0.03, seed=seed,
                  synthetic_errors=True, slow_rank=2 if (layout, buffer) == ("zigzag", "double") else None,
                  slow_factor=1.8)
        for seed, (layout, buffer) in enumerate((lay, buf) for lay in ("contiguous", "zigzag") for buf in ("sync", "double"))
    ]  # fmt: skip
    return simulate_run(configs, run_id="browser-sweep", path=tmp_path / "browser-sweep")


@pytest.mark.parametrize("source", ["sweep", pytest.param("real_w8_slow_link", marks=pytest.mark.slow)])
def test_report_renders_at_two_widths_with_screenshots(source, tmp_path):
    run = _sweep(tmp_path) if source == "sweep" else load_run(DATA / source)
    folder = write_report(run, tmp_path / "reports")
    html = (folder / "report.html").read_text()
    page = tmp_path / "page.html"
    page.write_text(html.replace("</body>", CHECK + "</body>"))
    images = html.count("<img ")
    shots = []
    for width in WIDTHS:
        seen = _check(page, width, tmp_path / f"profile-{width}")
        assert seen["images"] == images and seen["broken"] == 0 and seen["dangling"] == 0, seen
        assert seen["overflow"] <= 0, f"the page scrolls sideways at {width} px: {seen}"
        height = min(seen["height"] + 40, MAX_HEIGHT)
        shot = _screenshot(page, width, height, tmp_path / f"report-{source}-{width}.png", tmp_path / f"shot-{width}")
        image = Image.open(shot)
        assert image.size == (width, height)
        pixels = np.asarray(image.convert("L"), dtype=float)
        assert pixels.std() > 10  # a page, not a blank
        shots.append(shot)
    _keep(shots)
    if source == "real_w8_slow_link":
        assert "EMULATED compute" in html and "injected faults: slow-link:2:3:1.92" in html
        assert "Slow hop: 2 -&gt; 3 (link)" in html and "no rank blamed" in html
    else:
        assert "Straggler: rank 2 (compute)" in html


IMPORT_WIDTHS = (1400, 1000)
USER_RINGS = Path(__file__).parent / "data" / "kineto" / "user_rings"


@pytest.mark.parametrize(
    "program", ["w4_late_after_compute", pytest.param("w4_held_back_send", marks=pytest.mark.slow)]
)
def test_the_report_of_an_import_shows_its_culprit_and_fits(program, tmp_path):
    """An imported ring's report at 1,400 and 1,000 px: nothing overflows the page and every table fits its
    column (words wrap; no table needs a scroll bar); the screenshots are kept (docs/screenshots/)."""
    from ringbench.traces.importer import import_traces

    result = import_traces([USER_RINGS / program], out=tmp_path / "results")
    folder = write_report(load_run(result.run_dir), tmp_path / "reports")
    html = (folder / "report.html").read_text()
    page = tmp_path / "page.html"
    page.write_text(html.replace("</body>", CHECK + "</body>"))
    shots = []
    for width in IMPORT_WIDTHS:
        seen = _check(page, width, tmp_path / f"profile-{width}")
        assert seen["broken"] == 0 and seen["dangling"] == 0, seen
        assert seen["overflow"] <= 0 and seen["clipped"] == 0, f"{program} at {width} px: {seen}"
        height = min(seen["height"] + 40, MAX_HEIGHT)
        shots.append(_screenshot(page, width, height, tmp_path / f"import-{program}-{width}.png",
                                 tmp_path / f"shot-{width}"))  # fmt: skip
    _keep(shots)
    culprit = {"w4_late_after_compute": "rank 2 (compute)", "w4_held_back_send": "hop 1 → 2 (held back by rank 1"}
    assert culprit[program] in html, html[:2000]
    assert html.count('<tr class="flagged">') == 1  # only the verdict's culprit is red in the peers table
