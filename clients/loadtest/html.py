"""report.html: the run on one page, beside the PNGs: settings, pass or fail, the table with its warnings,
and the charts (linked relatively, so the folder can be moved or served as it is). No JavaScript, no CDN."""

from __future__ import annotations

from html import escape
from pathlib import Path

from lara_serve.clients.loadtest.report import Cell, Report

_COLUMNS = [
    ("target", "target"), ("route", "route"), ("input", "input"), ("load", "load"), ("requests", "n"),
    ("errors", "errors"), ("offered_rps", "offered/s"), ("achieved_rps", "achieved/s"),
    ("throughput_rps", "ok/s"), ("p50_ms", "p50"), ("p90_ms", "p90"), ("p95_ms", "p95"), ("p99_ms", "p99"),
    ("max_ms", "max"), ("server_queue_ms_p50", "queue"), ("server_inference_ms_p50", "infer"),
    ("batch_size_mean", "batch"), ("windows", "windows"), ("stable", "stable"),
]  # fmt: skip

_STYLE = """body{font:14px system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
table{border-collapse:collapse;font-size:12px}td,th{border:1px solid #ccc;padding:3px 6px;text-align:right}
td.l,th.l{text-align:left}tr.warn td{background:#fff6e0}tr.skip td{color:#888}
.fail{color:#b00;font-weight:bold}.pass{color:#070;font-weight:bold}img{max-width:100%;margin:1em 0}
li{margin:2px 0}code{background:#f4f4f4;padding:1px 3px}"""


def _cell_text(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    return escape(str(value))


def _row(cell: Cell) -> str:
    css = "skip" if cell.skipped else ("warn" if cell.warnings else "")
    tds = "".join(
        f'<td class="l">{_cell_text(getattr(cell, key))}</td>'
        if i < 4
        else f"<td>{_cell_text(getattr(cell, key))}</td>"
        for i, (key, _) in enumerate(_COLUMNS)
    )
    return f'<tr class="{css}">{tds}</tr>'


def render(report: Report, charts: list[Path]) -> str:
    failures = report.failures
    verdict = (
        '<p class="pass">passed</p>'
        if not failures
        else '<p class="fail">failed</p><ul>' + "".join(f"<li>{escape(f)}</li>" for f in failures) + "</ul>"
    )
    head = "".join(f'<th class="{"l" if i < 4 else ""}">{escape(h)}</th>' for i, (_, h) in enumerate(_COLUMNS))
    notes = [f"skipped {c.target} {c.route} {c.input} {c.load}: {c.skipped}" for c in report.cells if c.skipped]
    notes += [f"{c.target} {c.route} {c.input} {c.load}: {w}" for c in report.cells for w in c.warnings]
    notes += report.notes
    images = "".join(f'<h3>{escape(p.stem)}</h3><img src="{escape(p.name)}" alt="{escape(p.stem)}">' for p in charts)
    if not charts:
        images = ("<p>No charts: matplotlib is not installed here. <code>pip install -e '.[loadtest]'</code> "
                  "and rerun to draw them.</p>")  # fmt: skip
    argv = " ".join(report.settings.get("argv", []))
    return (
        f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>LARA load test</title>'
        f"<style>{_STYLE}</style></head><body><h1>LARA load test</h1>"
        f"<p><code>python -m lara_serve.clients loadtest {escape(argv)}</code><br>started "
        f"{escape(str(report.settings.get('started_utc', '')))}; latency in ms "
        f"{escape(str(report.settings.get('latency', '')))}</p>{verdict}"
        f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(_row(c) for c in report.cells)}</tbody></table>"
        f"<h2>Warnings and notes</h2><ul>{''.join(f'<li>{escape(n)}</li>' for n in notes) or '<li>none</li>'}</ul>"
        f'<h2>Charts</h2>{images}<p>Data: <a href="report.json">report.json</a>, '
        f'<a href="report.csv">report.csv</a>.</p></body></html>\n'
    )


def write_html(report: Report, charts: list[Path], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render(report, charts), encoding="utf-8")
    return path
