"""The benchmark figures (docs/images/bench-sites-*.svg, drawn by bench/plots.py) show the
numbers of the tables they come from: bench/RESULTS.md and the table of docs/benchmarks.md."""

from __future__ import annotations

import importlib
import re
import sys
import xml.etree.ElementTree as ET
from itertools import combinations
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ROOT / "docs" / "benchmarks.md"
#: the docs table's name for the run the figures draw (its first column)
DOCS_RUN = "2026-12-04, evening"
SVG = "{http://www.w3.org/2000/svg}"


def plots() -> ModuleType:
    """bench/plots.py (bench is not an installed package: it runs from the repository)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("bench.plots")


def docs_rows() -> dict[int, dict[str, str]]:
    """The docs table's rows of DOCS_RUN, by number of sites."""
    (table,) = [t for t in plots().tables(BENCHMARKS.read_text(encoding="utf-8"))
                if t and "run" in t[0] and "Redis B per queued site" in t[0]]
    rows = {int(plots().number(r["sites"]) or 0): r for r in table if r["run"] == DOCS_RUN}
    assert rows, f"no row of {DOCS_RUN!r} in the docs table"
    return rows


def scrapy_redis_bytes(results: Path, section: str, part: str) -> dict[int, float]:
    """Read apart from bench/plots.py: scrapy-redis's first LPUSH row per number of sites in the run's seeding table."""
    text = plots().section_text(results.read_text(encoding="utf-8"), section, part)
    found: dict[int, float] = {}
    for sites, value in re.findall(r"^\| ([\d,]+) \| scrapy-redis \| LPUSH start URLs \|.*\| ([\d.]+) \|$", text, re.M):
        found.setdefault(int(sites.replace(",", "")), float(value))
    return found


def points(svg: Path) -> dict[tuple[str, int], tuple[float, str, float, float]]:
    """(kind, sites) -> (the value in the point's id, its printed label, label x, label y)."""
    found = {}
    for g in ET.parse(svg).getroot().iter(f"{SVG}g"):
        m = re.fullmatch(r"point__(.+)__(\d+)__([\d.]+)", g.get("id", ""))
        if m:
            (text,) = g.iter(f"{SVG}text")
            found[(m.group(1), int(m.group(2)))] = (float(m.group(3)), text.text or "", float(text.get("x", "nan")),
                                                    float(text.get("y", "nan")))
    return found


def test_the_plotted_run_is_the_docs_tables_row_and_the_results_log() -> None:
    """What bench/plots.py reads from bench/RESULTS.md is, number for number, the docs table's row for the run, and scrapy-redis's seeding bytes."""
    p = plots()
    run = p.read_run()
    rows = docs_rows()
    assert run.sites == sorted(rows) == [10_000, 100_000, 1_000_000]
    for kind, column in p.PAGES_COLUMNS.items():
        assert run.pages_per_s[kind] == [p.number(rows[n][column]) for n in run.sites], kind
    assert run.bytes_per_site["streams-sched"] == [p.number(rows[n]["Redis B per queued site"]) for n in run.sites]
    lpush = scrapy_redis_bytes(p.RESULTS, run.section, run.part)
    assert run.bytes_per_site["scrapy-redis"] == [lpush[n] for n in run.sites]
    assert all(v is not None for vs in (*run.pages_per_s.values(), *run.bytes_per_site.values()) for v in vs)


@pytest.mark.parametrize("name, series", [("PAGES_SVG", "pages_per_s"), ("BYTES_SVG", "bytes_per_site")])
def test_each_figure_draws_the_runs_numbers_where_its_labels_say(name: str, series: str) -> None:
    """Each committed SVG has one labelled point per number of the run, labelled with that number, at a height proportional to it, and names the run it came from."""
    p = plots()
    run = p.read_run()
    svg = p.OUT / getattr(p, name)
    drawn = points(svg)
    want = {(kind.replace(" ", "-"), n): v for kind, values in getattr(run, series).items()
            for n, v in zip(run.sites, values, strict=True)}
    assert {k: d[0] for k, d in drawn.items()} == want, f"{svg.name} is out of date: run `{p.COMMAND}`"
    assert all(label == p.label(value) for value, label, _, _ in drawn.values()), drawn
    # one scale for every point: label heights differ by the same factor of their values' difference
    # (a label sits a fixed offset from its point, the same for all points of one kind)
    slopes = [(a[3] - b[3]) / (a[0] - b[0]) for (ka, a), (kb, b) in combinations(drawn.items(), 2)
              if ka[0] == kb[0] and a[0] != b[0]]
    assert slopes and all(s < 0 for s in slopes)  # higher values are drawn higher up
    assert max(slopes) == pytest.approx(min(slopes), rel=1e-3), slopes
    for n in run.sites:  # the kinds' points of one row are on one vertical
        assert len({round(d[2], 2) for (_, sites), d in drawn.items() if sites == n}) == 1, n
    text = svg.read_text(encoding="utf-8")
    assert run.section in text and run.part in text and p.COMMAND in text


def test_the_benchmarks_page_shows_both_figures_and_the_command_that_draws_them() -> None:
    """docs/benchmarks.md embeds both SVGs and gives the command that redraws them."""
    p = plots()
    page = BENCHMARKS.read_text(encoding="utf-8")
    for name in (p.PAGES_SVG, p.BYTES_SVG):
        assert f"](images/{name})" in page and (p.OUT / name).is_file()
    assert p.OUT == ROOT / "docs" / "images" and p.COMMAND in page
