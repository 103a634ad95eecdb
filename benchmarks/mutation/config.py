"""Which modules are mutated, which tests cover each, and the mutants known to change no behaviour."""

from __future__ import annotations

# module file -> the test files that cover it, fastest (unit) first so `-x` stops early on a kill. Files
# that do not exist (yet) are skipped, so the same map measures an older tree.
COVERING_TESTS: dict[str, list[str]] = {
    "server/batcher.py": [
        "tests/server/test_batcher_budget.py",
        "tests/server/test_batcher.py",
        "tests/server/test_cancellation.py",
    ],
    "server/preprocess.py": [
        "tests/server/test_preprocess_pinned.py",
        "tests/server/test_truncation.py",
        "tests/server/test_inputs.py",
        "tests/server/test_hardening.py",
        "tests/server/test_errors.py",
    ],
    "server/v2_codec.py": [
        "tests/server/test_v2_codec_binary.py",
        "tests/server/test_errors.py",
        "tests/server/test_hardening.py",
        "tests/server/test_triton_api.py",
    ],
    "server/errors.py": [
        "tests/server/test_error_kinds.py",
        "tests/server/test_errors.py",
        "tests/server/test_hardening.py",
    ],
    # The load tester's statistics: a silent slip here corrupts every figure the project publishes.
    "clients/loadtest/report.py": [
        "tests/clients/test_loadtest_stats.py",
        "tests/clients/test_loadtest_timing.py",
    ],
}

# Mutant key (see operators.Mutant.key) -> why the mutant cannot change what any caller observes. These
# are reported, not run, and left out of the score. Keep the reason specific: a reviewer checks each one.
EQUIVALENT: dict[str, str] = {}
