"""docs/mutation.md from the results JSON: the score per module, the history of runs, every survivor."""

from __future__ import annotations

from pathlib import Path
from typing import Any

_HEAD = """# Mutation testing

Each mutant is a core module with one small change (operators in `benchmarks/mutation/operators.py`); it
runs against the tests that cover that module (`benchmarks/mutation/config.py`), in a scratch copy of the
project. A mutant is *killed* when a test fails (or the run times out), *survived* when all pass.
Equivalent mutants (no caller can observe the change) are listed by hand in `config.py` with the reason and
left out of the score. Rerun with `make mutate` (all core modules, a few hours on 2 cores) or one module:
`python -m benchmarks.mutation --module server/batcher.py --limit 60 --label after`.
This file and `benchmarks/results/mutation.json` are written by that command.
"""


def write_markdown(data: dict[str, Any], path: Path) -> None:
    lines = [_HEAD, "## Scores (latest run per module)", "",
             "| module | mutants (run of total) | killed | survived | equivalent | score | tests |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for result in data["modules"].values():
        score = "n/a" if result["score"] is None else f"{100 * result['score']:.1f}%"
        lines.append(
            f"| `{result['module']}` | {result['mutants_run']} of {result['mutants_total']} | {result['killed']} | "
            f"{result['survived']} | {result['equivalent']} | {score} | {', '.join(result['tests'])} |"
        )
    lines += ["", "## History", "", "| date | label | module | mutants run | killed | survived | score |",
              "|---|---|---|---|---|---|---|"]  # fmt: skip
    for h in data["history"]:
        score = "n/a" if h["score"] is None else f"{100 * h['score']:.1f}%"
        lines.append(f"| {h['date']} | {h['label']} | `{h['module']}` | {h['mutants_run']} | {h['killed']} | "
                     f"{h['survived']} | {score} |")  # fmt: skip
    lines += ["", "## Surviving mutants", ""]
    for result in data["modules"].values():
        survivors = [m for m in result["mutants"] if m["status"] == "survived"]
        lines += [f"### `{result['module']}`: {len(survivors)} survived", ""]
        if survivors:
            lines += ["| line | function | change | source |", "|---|---|---|---|"]
            lines += [f"| {m['line']} | `{m['function']}` | `{m['change']}` | `{_cell(m['source_line'])}` |"
                      for m in survivors]  # fmt: skip
            lines.append("")
    lines += ["## Equivalent mutants (excluded by hand)", ""]
    for result in data["modules"].values():
        for m in result["mutants"]:
            if m["status"] == "equivalent":
                lines.append(f"- `{result['module']}` line {m['line']}, `{m['change']}` in `{m['function']}`: "
                             f"{m['detail']}")  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines).rstrip() + "\n")


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")[:100]
