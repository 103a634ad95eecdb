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
_TRIM = "_TRIM_PIXELS = 1 << 20  # decodes this large leave buffers worth handing back to the OS#0"
_TRIM_WHY = (
    "changes only after which decodes freed memory is handed back to the OS (malloc_trim); no result, "
    "error or wait changes"
)
_FALLBACK = "return ErrorKind.MALFORMED if 400 <= status < 500 else ErrorKind.BACKEND_FAILURE#0"
_FALLBACK_WHY = (
    "moves the 400/500 boundary of the fallback, but 400 and 500 are in HTTP_STATUS and return from the loop "
    "above: the fallback never sees them"
)
EQUIVALENT: dict[str, str] = {
    "server.batcher:_Entry:False -> True:@dataclass(eq=False)#0": (
        "entries are compared only by id() (the taken and gone sets); no ==, no hashing of an _Entry"
    ),
    "server.batcher:Batcher._expire:return x -> return None:return False#0": (
        "the only caller tests the result for truth (`if self._expire(batch)`): None and False are alike"
    ),
    f"server.preprocess:<module>:1 -> 2:{_TRIM}": _TRIM_WHY,
    f"server.preprocess:<module>:1 -> 0:{_TRIM}": _TRIM_WHY,
    f"server.preprocess:<module>:20 -> 21:{_TRIM}": _TRIM_WHY,
    "server.preprocess:_malloc_trim:return x -> return None:"
    'return ctypes.CDLL("libc.so.6").malloc_trim  # type: ignore[no-any-return]#0': _TRIM_WHY,
    "server.preprocess:image_item:0 -> 1:held = budget.acquire(width * height) if budget is not None else 0#0": (
        "`held` is used only by budget.release, which runs only when there is a budget"
    ),
    "server.preprocess:image_item:0 -> -1:held = budget.acquire(width * height) if budget is not None else 0#0": (
        "`held` is used only by budget.release, which runs only when there is a budget"
    ),
    "server.v2_codec:_from_json:Raise -> pass:"
    'raise invalid(f"input {name!r}: BYTES strings must be valid Unicode") from None#0': (
        "unreachable: the JSON parser (schemas.parse_body) already refuses lone surrogates, the only strings "
        "that cannot be encoded as UTF-8"
    ),
    "clients.loadtest.report:Cell:False -> True:latencies_ms: list[float] = field(default_factory=list, "
    "repr=False)  # for CDF plots; not serialized#0": (
        "changes only repr(Cell), which the load tester never prints or writes (reports use to_dict)"
    ),
    f"server.errors:kind_for_status:<= -> <:{_FALLBACK}": _FALLBACK_WHY,
    f"server.errors:kind_for_status:< -> <=:{_FALLBACK}": _FALLBACK_WHY,
    f"server.errors:kind_for_status:400 -> 401:{_FALLBACK}": _FALLBACK_WHY,
    f"server.errors:kind_for_status:500 -> 501:{_FALLBACK}": _FALLBACK_WHY,
}
