"""Which modules are mutated, which tests cover each, and the mutants known to change no behaviour."""

from __future__ import annotations

_DEADLINE_BATCHER = (
    "test_long_document_after_short_requests_is_computed",
    "test_refused_only_when_it_could_not_finish_even_alone",
    "test_estimate_recovers_after_a_slow_spell",
)
# The scripted (no server) window tests of test_loadtest_rigour.py; the rest of it runs a live server.
_RIGOUR_SCRIPTED = (
    "test_a_stable_cell_stops_after_three_windows",
    "test_an_unstable_cell_runs_to_the_maximum_and_says_so",
    "test_windows_settle_once_the_last_three_agree",
    "test_without_stability_a_cell_is_one_run",
    "test_stability_rules",
    "test_thin_percentiles_and_short_rates_are_named",
)
# module file -> the test files that cover it, fastest (unit) first so `-x` stops early on a kill. Files
# that do not exist (yet) are skipped, so the same map measures an older tree. An entry may be a pytest node
# id (`file.py::test_name`) where a file also holds slow live-server tests that do not reach the module.
COVERING_TESTS: dict[str, list[str]] = {
    "server/batcher.py": [
        "tests/server/test_batcher_budget.py",
        "tests/server/test_batcher.py",
        "tests/server/test_cancellation.py",
        # issue 36's deadline rule on a batcher with a linear-cost backend (the file's live-server tests excluded)
        *(f"tests/server/test_reliability_deadlines.py::{name}" for name in _DEADLINE_BATCHER),
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
    # The routes' request decoding: content types, charsets, image-vs-text sniffing, base64 elements.
    "server/inputs.py": [
        "tests/server/test_inputs_sniff.py",
        "tests/server/test_inputs.py",
        "tests/server/test_reliability_inputs.py",
    ],
    # gRPC request decoding and answers (the wire-specific half of the one v2 inference path).
    "server/grpc/convert.py": ["tests/server/test_grpc_convert.py"],
    # The load tester's statistics: a silent slip here corrupts every figure the project publishes.
    "clients/loadtest/report.py": [
        "tests/clients/test_loadtest_stats.py",
        "tests/clients/test_loadtest_timing.py",
    ],
    # Stability windows, thin-percentile and rate warnings (rigour) and the arrival schedule (rates).
    "clients/loadtest/rigour.py": [
        "tests/clients/test_loadtest_windows.py",
        *(f"tests/clients/test_loadtest_rigour.py::{name}" for name in _RIGOUR_SCRIPTED),
    ],
    "clients/loadtest/schedule.py": [
        "tests/clients/test_loadtest_windows.py",
        "tests/clients/test_loadtest_timing.py::test_arrival_offsets",
    ],
    # model_export's data loading: a slip here trains and evaluates every model on the wrong examples.
    "model_export/training/data.py": [
        "tests/model_export/test_data_batches.py",
        "tests/model_export/test_data.py",
    ],
    "model_export/training/tasks.py": [
        "tests/model_export/test_data_batches.py",
        "tests/model_export/test_image_augment.py",
    ],
    "model_export/your_data/loader.py": [
        "tests/model_export/test_userdata_edges.py",
        "tests/model_export/test_userdata.py",
    ],
}

# module file -> the functions or classes (qualified-name prefixes) that are mutated; modules not listed are
# mutated whole. tasks.py: the batching and splitting of examples; its dataset readers (`text_docs`,
# `load_task`) need the installed corpora and are covered by the slower k-fold and training tests.
SCOPE: dict[str, tuple[str, ...]] = {
    "model_export/training/tasks.py": (
        "_augment_images", "_rotate_images", "ImageTask", "SequenceTask", "fold_split", "is_train_split",
        "document_ids", "_subset",
    ),
}  # fmt: skip

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
_CSV_LIMIT = "_CSV_FIELD_LIMIT = min(sys.maxsize, 2**31 - 1)#0"
_CSV_LIMIT_WHY = (
    "moves csv's field-size limit around 2 GiB (2**31 - 1 is what a 32-bit C long holds; 64-bit Linux takes "
    "these too): only one field of about 2 GiB could tell, and the file is decoded into memory whole first"
)
_NO_ROTATION = "if self.rotate_deg > 0:#0"
_NO_ROTATION_WHY = (
    "with rotate_deg 0 the images are then rotated by exactly 0 degrees, the identity "
    "(test_zero_rotation_is_the_identity); only the extra draws from the generator differ, which changes which "
    "crops later batches draw, not how they are drawn"
)
_FROZEN_WHY = (
    "frozen only refuses assignment to a field and makes instances hashable; no code assigns to one, hashes one "
    "or uses one as a key (the sweep keeps them in lists; charts key by label strings)"
)
EQUIVALENT: dict[str, str] = {
    "server.batcher:_Entry:False -> True:@dataclass(eq=False)#0": (
        "entries are compared only by id() (the taken and gone sets); no ==, no hashing of an _Entry"
    ),
    "server.batcher:Batcher.stop:30.0 -> 60.0:async def stop(self, grace_s: float = 30.0) -> None:#0": (
        "the default is never used by the server: ServedModel.stop, its only caller there, always passes grace_s"
    ),
    "server.batcher:Batcher.stop:True -> False:await asyncio.to_thread(self._executor.shutdown, True)#0": (
        "this branch runs only when the worker finished, so the batch thread is idle: it exits at once whether "
        "shutdown waits for it or not; busy() and every answer are the same"
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
    "clients.loadtest.rigour:WindowStats:True -> False:@dataclass(frozen=True)#0": _FROZEN_WHY,
    "clients.loadtest.rigour:Stability:True -> False:@dataclass(frozen=True)#0": _FROZEN_WHY,
    "clients.loadtest.schedule:LoadPoint:True -> False:@dataclass(frozen=True)#0": _FROZEN_WHY,
    "model_export.training.tasks:_augment_images:< -> <=:flip = torch.rand(b, generator=g) < 0.5#0": (
        "torch.rand draws from a grid of 2**24 floats in [0, 1): exactly 0.5 comes once in 16 million images, so the "
        "chance of a flip stays one half"
    ),
    f"model_export.training.tasks:ImageTask.train_batches:> -> >=:{_NO_ROTATION}": _NO_ROTATION_WHY,
    f"model_export.training.tasks:ImageTask.train_batches:0 -> -1:{_NO_ROTATION}": _NO_ROTATION_WHY,
    **{
        f"model_export.your_data.loader:<module>:{change}:{_CSV_LIMIT}": _CSV_LIMIT_WHY
        for change in ("- -> +", "2 -> 3", "31 -> 32", "1 -> 2", "1 -> 0")
    },
    **{
        f'model_export.your_data.loader:fingerprint:{change}:for block in iter(lambda fh=fh: fh.read(1 << 20), b""):#0': (
            "changes only the size of the blocks fed to the one hash, in order: the digest is the same"
        )
        for change in ("1 -> 2", "20 -> 21")
    },
    "model_export.your_data.loader:image_shape:0 -> -1:return sides.most_common(1)[0][0], 3 if colour else 1#0": (
        "most_common(1) is a one-element list: its [-1] is its [0]"
    ),
}
