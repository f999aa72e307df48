"""``python -m bench.plots``: the one-page-site figures of docs/benchmarks.md, drawn from
the run's own tables in bench/RESULTS.md.

Two SVGs, written to docs/images/:

- ``bench-sites-pages.svg``: pages/s against the number of sites for Scrapy's in-memory
  scheduler, scrapy-redis and streams-sched (the summary table's pages/s columns);
- ``bench-sites-redis-bytes.svg``: Redis bytes per queued site, streams-sched (the
  summary table's column) and scrapy-redis (its ``LPUSH start URLs`` row of the seeding
  table: a JSON URL in its start-URL list, not yet read by its spider).

The run is a section of bench/RESULTS.md, named by its ``##`` heading and the ``###``
heading under it (``--section``, ``--part``); the default is the whole default run of
``./scripts/bench.sh sites`` that docs/benchmarks.md tabulates as "2026-12-04, evening".
Each plotted point carries its number twice in the SVG: as the label printed beside it
and in its group's id (``point__KIND__SITES__VALUE``), so tests/test_bench_plots.py checks
the figures against the tables without drawing anything. Reading the tables needs only the
standard library; drawing needs matplotlib (the bench extra).
"""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "RESULTS.md"
OUT = ROOT / "docs" / "images"
COMMAND = "python -m bench.plots"

#: the run the docs plot: (## heading, ### heading) in bench/RESULTS.md
DEFAULT_SECTION = "New sites in a list per shard, not the ready ZSET (2026-12-04, evening)"
DEFAULT_PART = "The whole default run"

#: the schedulers, as the figures name them, and their summary-table pages/s columns
PAGES_COLUMNS = {
    "streams-sched": "streams-sched pages/s",
    "Scrapy in-memory": "Scrapy in-memory pages/s",
    "scrapy-redis": "scrapy-redis pages/s",
}
BYTES_COLUMN = "Redis B per queued site"
COLORS = {"streams-sched": "#c0392b", "Scrapy in-memory": "#2c3e50", "scrapy-redis": "#2980b9"}
MARKERS = {"streams-sched": "o", "Scrapy in-memory": "s", "scrapy-redis": "^"}
#: where a point's label goes, in points from it: streams-sched's below, so that it never
#: covers the in-memory scheduler's when the two are close
LABEL_OFFSETS = {"streams-sched": (0, -14), "Scrapy in-memory": (0, 7), "scrapy-redis": (0, 7)}

PAGES_SVG = "bench-sites-pages.svg"
BYTES_SVG = "bench-sites-redis-bytes.svg"


@dataclass
class SitesRun:
    """What the figures show of one ``bench sites`` run."""

    section: str
    part: str
    command: str
    sites: list[int]
    #: scheduler -> pages/s per row of ``sites`` (None: not in this run)
    pages_per_s: dict[str, list[float | None]] = field(default_factory=dict)
    #: scheduler -> Redis bytes per queued site per row of ``sites``
    bytes_per_site: dict[str, list[float | None]] = field(default_factory=dict)


def number(cell: str) -> float | None:
    """A table cell's number: ``1,600 (all)`` -> 1600.0, ``33.8`` -> 33.8, ``-`` -> None."""
    m = re.match(r"\s*([0-9][0-9,]*(?:\.[0-9]+)?)", cell)
    return float(m.group(1).replace(",", "")) if m else None


def tables(text: str) -> list[list[dict[str, str]]]:
    """The Markdown tables of ``text``, each a list of rows keyed by its header cells."""
    found: list[list[dict[str, str]]] = []
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|[-:| ]+\|$", lines[i + 1]):
            header = [c.strip() for c in lines[i].strip("|").split("|")]
            rows = []
            i += 2
            while i < len(lines) and lines[i].startswith("|"):
                rows.append(dict(zip(header, (c.strip() for c in lines[i].strip("|").split("|")), strict=True)))
                i += 1
            found.append(rows)
        else:
            i += 1
    return found


def section_text(text: str, section: str, part: str) -> str:
    """The text under ``## section`` / ``### part``, up to the next heading of either level."""
    m = re.search(rf"^## {re.escape(section)}\n(.*?)(?=^## |\Z)", text, re.M | re.S)
    if not m:
        raise SystemExit(f"no section '## {section}' in the results")
    sub = re.search(rf"^### {re.escape(part)}\n(.*?)(?=^##+ |\Z)", m.group(1), re.M | re.S)
    if not sub:
        raise SystemExit(f"no part '### {part}' under '## {section}' in the results")
    return sub.group(1)


def read_run(results: Path = RESULTS, section: str = DEFAULT_SECTION, part: str = DEFAULT_PART) -> SitesRun:
    """The run's summary and seeding tables, as the bench wrote them (bench/sites.py ``render``)."""
    text = section_text(results.read_text(encoding="utf-8"), section, part)
    command = re.search(r"^`([^`]+)`", text, re.M)
    found = tables(text)
    summary = next(t for t in found if t and BYTES_COLUMN in t[0] and "streams-sched pages/s" in t[0])
    seeding = next(t for t in found if t and "how" in t[0] and BYTES_COLUMN in t[0])
    sites = [int(number(row["sites"]) or 0) for row in summary]
    run = SitesRun(section, part, command.group(1) if command else "", sites)
    for name, column in PAGES_COLUMNS.items():
        run.pages_per_s[name] = [number(row[column]) for row in summary]
    run.bytes_per_site["streams-sched"] = [number(row[BYTES_COLUMN]) for row in summary]
    lpush = {}
    for row in seeding:  # the first push of each row, as the summary takes streams-sched's
        if row["kind"] == "scrapy-redis" and row["how"] == "LPUSH start URLs":
            lpush.setdefault(int(number(row["sites"]) or 0), number(row[BYTES_COLUMN]))
    run.bytes_per_site["scrapy-redis"] = [lpush.get(n) for n in sites]
    return run


def point_id(kind: str, sites: int, value: float) -> str:
    """The SVG id of a plotted point: its scheduler, its x and its y."""
    return f"point__{kind.replace(' ', '-')}__{sites}__{value:g}"


def label(value: float) -> str:
    return f"{value:,.0f}" if value >= 100 else f"{value:,.1f}"


def _figure(
    run: SitesRun, series: dict[str, list[float | None]], ylabel: str, title: str, legend_at: str, path: Path
) -> None:
    import matplotlib

    matplotlib.use("svg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    matplotlib.rcParams.update({"svg.fonttype": "none", "svg.hashsalt": "streams-sched", "font.size": 10})
    fig, ax = plt.subplots(figsize=(6.4, 3.8))
    for kind, values in series.items():
        xs = [n for n, v in zip(run.sites, values, strict=True) if v is not None]
        ys = [v for v in values if v is not None]
        if not ys:
            continue
        ax.plot(xs, ys, color=COLORS[kind], marker=MARKERS[kind], label=kind, linewidth=1.6)
        for x, y in zip(xs, ys, strict=True):
            ax.annotate(label(y), (x, y), textcoords="offset points", xytext=LABEL_OFFSETS[kind], ha="center",
                        fontsize=8, color=COLORS[kind], gid=point_id(kind, x, y))
    ax.set_xscale("log")
    ax.set_xticks(run.sites)
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:,.0f}"))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
    ax.set_xlim(run.sites[0] / 1.6, run.sites[-1] * 1.6)
    ax.set_ylim(0, max(v for vs in series.values() for v in vs if v is not None) * 1.18)
    ax.set_xlabel("sites (one queued URL each)")
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    ax.grid(True, axis="y", color="#dddddd")
    ax.spines[["top", "right"]].set_visible(False)
    ax.legend(frameon=False, fontsize=9, loc=legend_at)
    fig.tight_layout()
    metadata: dict[str, Any] = {
        "Title": title,
        "Description": f"Made by `{COMMAND}` from bench/RESULTS.md, '## {run.section}' / '### {run.part}'"
                       f" (the bench command: {run.command}).",
        "Date": None,
        "Creator": COMMAND,
    }
    fig.savefig(path, format="svg", metadata=metadata)
    plt.close(fig)


def draw(run: SitesRun, out: Path = OUT) -> list[Path]:
    """Write the two figures of ``run`` into ``out``; returns their paths."""
    out.mkdir(parents=True, exist_ok=True)
    pages, size = out / PAGES_SVG, out / BYTES_SVG
    _figure(run, run.pages_per_s, "pages/s, one worker",
            "One-page sites, one worker: pages/s (60 s windows)", "lower right", pages)
    _figure(run, run.bytes_per_site, "Redis bytes per queued site",
            "Redis memory per queued site, after seeding", "center right", size)
    return [pages, size]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--results", type=Path, default=RESULTS, help="the results log (default: bench/RESULTS.md)")
    parser.add_argument("--section", default=DEFAULT_SECTION, help="its '## ' heading of the run")
    parser.add_argument("--part", default=DEFAULT_PART, help="the '### ' heading under it")
    parser.add_argument("--out", type=Path, default=OUT, help="where the SVGs go (default: docs/images)")
    args = parser.parse_args(argv)
    for path in draw(read_run(args.results, args.section, args.part), args.out):
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
