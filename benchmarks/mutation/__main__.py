"""`python -m benchmarks.mutation [--module server/batcher.py] [--limit N] [--label after]` (`make mutate`).

Writes benchmarks/results/mutation.json (per label of a run and module: every mutant's outcome and the
score) and docs/mutation.md (the scores side by side, the surviving and the equivalent mutants). Running
one module under a label replaces that entry and keeps the others.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any

from benchmarks.mutation.config import COVERING_TESTS, EQUIVALENT, SCOPE
from benchmarks.mutation.operators import Mutant, mutants
from benchmarks.mutation.report import write_markdown
from benchmarks.mutation.run import Outcome, run_mutant, run_tests, scratch_copy

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "benchmarks" / "results" / "mutation.json"
DOC = ROOT / "docs" / "mutation.md"


def sample(found: list[Mutant], limit: int | None) -> list[Mutant]:
    """A fixed subset (by a hash of each key, so the same mutants are picked before and after a change)."""
    if limit is None or len(found) <= limit:
        return found
    ranked = sorted(found, key=lambda m: hashlib.sha256(m.key.encode()).hexdigest())
    chosen = {m.key for m in ranked[:limit]}
    return [m for m in found if m.key in chosen]


def in_scope(path: str, found: list[Mutant]) -> list[Mutant]:
    """The mutants inside the functions SCOPE names for the module (all of them when it names none)."""
    prefixes = SCOPE.get(path)
    if prefixes is None:
        return found
    return [m for m in found if any(m.function == p or m.function.startswith(p + ".") for p in prefixes)]


def mutate_module(
    path: str, root: Path, limit: int | None, timeout_s: float | None, verbose: bool, only: set[str] | None = None
) -> dict[str, Any]:
    """Run the chosen mutants of one module (`only`: just these keys, e.g. to recheck timeouts)."""
    module = path.removesuffix(".py").replace("/", ".")
    original = (root / path).read_text()
    all_found = in_scope(path, mutants(module, original))
    chosen = [m for m in sample(all_found, limit) if only is None or m.key in only]
    tests = [t for t in COVERING_TESTS[path] if (root / t.split("::")[0]).exists()]
    # The fused onnxruntime kernel is compiled once and cached by its sources AND flags: the include path
    # of the project's headers keeps the flags (so the cached build) the same in every scratch copy.
    os.environ.setdefault("LARA_ORT_HEADERS", str(root / "data_cache" / "onnxruntime-headers"))
    with scratch_copy(root) as work:
        code, base_s, tail = run_tests(work, tests, 900)
        if code != 0:  # once more: a timing test may fail on a loaded machine
            code, base_s, tail = run_tests(work, tests, 900)
        if code != 0:
            raise SystemExit(f"the tests of {path} fail without any mutant:\n{tail}")
        per_mutant = timeout_s or max(30.0, 3 * base_s)
        rows = []
        for i, m in enumerate(chosen, 1):
            if m.key in EQUIVALENT:
                outcome = Outcome("equivalent", 0.0, EQUIVALENT[m.key])
            else:
                outcome = run_mutant(work, path, original, m, tests, per_mutant)
            if verbose:
                print(f"[{i}/{len(chosen)}] {outcome.status:9s} {outcome.seconds:5.1f}s {m.line}: {m.change} | "
                      f"{m.source_line[:80]}", flush=True)  # fmt: skip
            rows.append({"key": m.key, "line": m.line, "function": m.function, "operator": m.operator,
                         "change": m.change, "source_line": m.source_line, "status": outcome.status,
                         "seconds": round(outcome.seconds, 2), "detail": outcome.detail})  # fmt: skip
    result = {
        "module": module,
        "tests": tests,
        "mutants_total": len(all_found),
        "mutants_run": len(chosen),
        "limit": limit,
        "scope": list(SCOPE.get(path, ())),
        "date": time.strftime("%Y-%m-%d"),
        "baseline_test_s": round(base_s, 1),
        "per_mutant_timeout_s": round(per_mutant, 1),
        "mutants": rows,
    }
    return rescore(result)


def rescore(result: dict[str, Any]) -> dict[str, Any]:
    """Counts and score from the rows, with the hand-made EQUIVALENT list as it is now (a mutant listed
    after its run is excluded from the score too)."""
    for row in result["mutants"]:
        if row["key"] in EQUIVALENT:
            row["status"], row["detail"] = "equivalent", EQUIVALENT[row["key"]]
    counted = [r for r in result["mutants"] if r["status"] != "equivalent"]
    killed = sum(r["status"] in ("killed", "timeout") for r in counted)
    result.update(
        equivalent=len(result["mutants"]) - len(counted),
        killed=killed,
        survived=len(counted) - killed,
        score=round(killed / len(counted), 4) if counted else None,
    )
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.mutation", description=__doc__)
    parser.add_argument("--module", action="append", choices=sorted(COVERING_TESTS),
                        help="module file to mutate (repeatable; default: all core modules)")  # fmt: skip
    parser.add_argument("--limit", type=int, help="at most this many mutants per module (a fixed hash-chosen subset)")
    parser.add_argument("--timeout", type=float, help="seconds per mutant (default: 3x the clean test run, >= 30)")
    parser.add_argument("--label", default="latest", help="name of this run in the report (e.g. before, after)")
    parser.add_argument("--root", type=Path, default=ROOT, help="project tree to mutate (default: this one)")
    parser.add_argument("--results", type=Path, default=RESULTS)
    parser.add_argument("--doc", type=Path, default=DOC)
    parser.add_argument("--rescore", action="store_true", help="only recount the stored runs with the current "
                        "EQUIVALENT list and rewrite the report")  # fmt: skip
    parser.add_argument("--recheck-timeouts", action="store_true", help="run again, with --timeout, only the "
                        "mutants of the stored --label run that timed out (a loaded machine can time out a survivor)")  # fmt: skip
    parser.add_argument("--recheck-survivors", action="store_true", help="run again only the mutants of the stored "
                        "--label run that survived (after adding tests that should kill them)")  # fmt: skip
    parser.add_argument("-q", "--quiet", action="store_true")
    args = parser.parse_args(argv)
    data = json.loads(args.results.read_text()) if args.results.exists() else {"runs": {}}
    if args.rescore:
        for run in data["runs"].values():
            for result in run.values():
                rescore(result)
    elif args.recheck_timeouts or args.recheck_survivors:
        status = "timeout" if args.recheck_timeouts else "survived"
        for path in args.module or sorted(COVERING_TESTS):
            stored = data["runs"][args.label][path]
            again = {m["key"] for m in stored["mutants"] if m["status"] == status}
            if not again:
                continue
            fresh = mutate_module(path, args.root, stored["limit"], args.timeout, not args.quiet, only=again)
            redone = {m["key"]: m for m in fresh["mutants"]}
            stored["mutants"] = [redone.get(m["key"], m) for m in stored["mutants"]]
            stored[f"rechecked_{status}"] = {"tests": fresh["tests"], "date": fresh["date"]}
            stored["tests"] = fresh["tests"]  # the rechecked survivors ran against these
            rescore(stored)
            _save(data, args.results, args.doc)
    else:
        for path in args.module or sorted(COVERING_TESTS):
            result = mutate_module(path, args.root, args.limit, args.timeout, not args.quiet)
            data["runs"].setdefault(args.label, {})[path] = result
            print(f"{path}: {result['killed']} of {result['killed'] + result['survived']} killed "
                  f"(score {result['score']}), {result['equivalent']} equivalent", flush=True)  # fmt: skip
            _save(data, args.results, args.doc)
    _save(data, args.results, args.doc)
    return 0


def _save(data: dict[str, Any], results: Path, doc: Path) -> None:
    results.parent.mkdir(parents=True, exist_ok=True)
    results.write_text(json.dumps(data, indent=1) + "\n")
    write_markdown(data, doc)


if __name__ == "__main__":
    raise SystemExit(main())
