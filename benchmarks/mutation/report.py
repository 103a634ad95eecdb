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

A module may be mutated in part (`SCOPE` in `config.py`: the functions named there), and a covering
test may be a pytest node id where its file also holds slow tests that never reach the module.

Rerun: `make mutate` (every module, every mutant: hours on 2 cores), or one module and a fixed subset (the
same mutants every time, chosen by a hash of their names), e.g.
`make mutate MUTATE_ARGS="--module server/batcher.py --limit 60 --label after"`; each row below gives its
command. `--recheck-survivors` (or `--recheck-timeouts`) reruns only those mutants of a stored run, after a
test was added for them. This file and `benchmarks/results/mutation.json` are written by these commands.
"""


def write_markdown(data: dict[str, Any], path: Path) -> None:
    runs: dict[str, dict[str, Any]] = data["runs"]
    labels = list(runs)
    modules = sorted({m for run in runs.values() for m in run})
    lines = [_HEAD, "## Scores", "",
             "The latest run of each module: killed of the behaviour-changing mutants run (timeouts count as kills; "
             "equivalent ones excluded).", "",
             "| module | mutants run (in scope) | killed | equivalent | survived | score | command |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for module in modules:
        label = next(lb for lb in reversed(labels) if module in runs[lb])
        r = runs[label][module]
        timeouts = sum(m["status"] == "timeout" for m in r["mutants"])
        score = "n/a" if r["score"] is None else f"{100 * r['score']:.0f}%"
        lines.append(f"| `{module}` | {r['mutants_run']} ({r['mutants_total']}) | {r['killed']}"
                     + (f" ({timeouts} by timeout)" if timeouts else "")
                     + f" | {r['equivalent']} | {r['survived']} | {score} | `{command(module, r['limit'], label)}` |")  # fmt: skip
    lines += ["", "Per run label (the same mutants in each column of a row); covering tests of the latest run:", "",
              "| module | " + " | ".join(labels) + " | covering tests |",
              "|---|" + "---|" * len(labels) + "---|"]  # fmt: skip
    for module in modules:
        results = [runs[label].get(module) for label in labels]
        latest = next(r for r in reversed(results) if r is not None)
        cells = [_score(r) for r in results]
        tests = ", ".join(f"`{t}`" for t in latest["tests"])
        lines.append(f"| `{module}` | {' | '.join(cells)} | {tests} |")
    if data.get("notes"):
        lines += ["", "Notes on these runs:", ""] + [f"- {note}" for note in data["notes"]]
    last = {module: runs[next(lb for lb in reversed(labels) if module in runs[lb])][module] for module in modules}
    lines += ["", "## Surviving mutants (latest run of each module)", ""]
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


def command(path: str, limit: int | None, label: str) -> str:
    """The command that reruns one module's stored run (the same hash-chosen subset)."""
    return (
        f"python -m benchmarks.mutation --module {path}" + (f" --limit {limit}" if limit else "") + f" --label {label}"
    )


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
