"""docs/mutation.md from the results JSON: scores per module and run label, every survivor, every
mutant excluded as equivalent with its reason."""

from __future__ import annotations

from pathlib import Path
from typing import Any

_HEAD = """# Mutation testing

Each mutant is a core module with one small change (operators in `benchmarks/mutation/operators.py`:
comparison flips, arithmetic swaps, constants +-1, boolean negation, `continue`/`break`, a raise, call or
assignment deleted, a returned value dropped). It runs against the tests that cover that module
(`COVERING_TESTS` in `benchmarks/mutation/config.py`), in a scratch copy of the project, with `-x` and a
per-mutant timeout. *Killed*: a test failed or the run timed out. *Survived*: every test passed.
Equivalent mutants (no caller can observe the change) are listed by hand in `EQUIVALENT` in `config.py`,
with the reason, and left out of the score. Wording (strings, f-strings), docstrings, annotations and the
module logger are never mutated.

Rerun: `make mutate` (every module, every mutant: hours on 2 cores), or one module and a fixed subset (the
same mutants every time, chosen by a hash of their names):
`python -m benchmarks.mutation --module server/batcher.py --limit 60 --label after`.
This file and `benchmarks/results/mutation.json` are written by that command.
"""


def write_markdown(data: dict[str, Any], path: Path) -> None:
    runs: dict[str, dict[str, Any]] = data["runs"]
    labels = list(runs)
    modules = sorted({m for run in runs.values() for m in run})
    lines = [_HEAD, "## Scores", "", "Killed of the behaviour-changing mutants run (equivalent ones excluded).", "",
             "| module | mutants run (of all) | " + " | ".join(labels) + " | covering tests |",
             "|---|---|" + "---|" * len(labels) + "---|"]  # fmt: skip
    for module in modules:
        results = [runs[label].get(module) for label in labels]
        latest = next(r for r in reversed(results) if r is not None)
        cells = [_score(r) for r in results]
        tests = ", ".join(f"`{t}`" for t in latest["tests"])
        lines.append(f"| `{module}` | {latest['mutants_run']} ({latest['mutants_total']}) | {' | '.join(cells)} | "
                     f"{tests} |")  # fmt: skip
    if data.get("notes"):
        lines += ["", "Notes on these runs:", ""] + [f"- {note}" for note in data["notes"]]
    last = runs[labels[-1]] if labels else {}
    lines += ["", f"## Surviving mutants ({labels[-1] if labels else 'none'})", ""]
    for module, result in sorted(last.items()):
        survivors = [m for m in result["mutants"] if m["status"] == "survived"]
        lines += [f"### `{module}`: {len(survivors)} survived", ""]
        if survivors:
            lines += ["| line | function | change | source |", "|---|---|---|---|"]
            lines += [f"| {m['line']} | `{m['function']}` | `{m['change']}` | `{_cell(m['source_line'])}` |"
                      for m in survivors]  # fmt: skip
            lines.append("")
    lines += ["## Equivalent mutants (excluded by hand)", ""]
    for module, result in sorted(last.items()):
        for m in result["mutants"]:
            if m["status"] == "equivalent":
                lines.append(f"- `{module}` line {m['line']}, `{m['change']}` in `{m['function']}` "
                             f"(`{_cell(m['source_line'])}`): {m['detail']}")  # fmt: skip
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines).rstrip() + "\n")


def _score(result: dict[str, Any] | None) -> str:
    if result is None:
        return "-"
    if result["score"] is None:
        return "n/a"
    total = result["killed"] + result["survived"]
    timeouts = sum(m["status"] == "timeout" for m in result["mutants"])
    return f"{result['killed']}/{total} = {100 * result['score']:.0f}%" + (
        f" ({timeouts} by timeout)" if timeouts else ""
    )


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("`", "'")[:100]
