"""JSON bodies of the v1 and v2 protocols (they also document the routes in /docs)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, StrictBool, ValidationError, field_validator

from lara_serve.server.errors import malformed

B = TypeVar("B", bound=BaseModel)
T = TypeVar("T")


def parse_body(model: type[B], raw: bytes, expected: str) -> B:
    """The one JSON body parser (v1, v2 JSON, v2 binary header): every bad body is a 400 (malformed).

    Not JSON, not UTF-8, nested deeper than the parser's limit (255 levels; Python's json would raise
    RecursionError instead), or the wrong shape: the message says what was expected and which fields
    failed, without echoing the body.
    """
    try:
        return model.model_validate_json(raw)
    except ValidationError as exc:
        raise malformed(f"{expected}: {short_errors(exc)}") from None


_parser: ThreadPoolExecutor | None = None
# JSON bodies larger than this are parsed in the parser thread: 64 KB of numbers take ~10 ms to parse into
# Python objects and check, 1 MB ~200 ms, which the event loop (health checks, small requests) must not wait.
OFF_LOOP_BYTES = 64 * 1024


async def run_parser(parse: Callable[..., T], *args: Any) -> T:
    """Run a large body's parse off the event loop, in ONE thread for the whole process. A JSON parser
    holds the GIL for the whole call (~0.1 s per 6 MB of numbers), so parallel parses would not be faster,
    only longer for the event loop to wait: one at a time, the loop waits for at most one parse."""
    global _parser
    if _parser is None:
        _parser = ThreadPoolExecutor(1, thread_name_prefix="lara-parse")
    return await asyncio.get_running_loop().run_in_executor(_parser, parse, *args)


async def run_sized(size: int, work: Callable[..., T], *args: Any) -> T:
    """`work(*args)` on the event loop for up to OFF_LOOP_BYTES of input, else in the parser thread."""
    if size > OFF_LOOP_BYTES:
        return await run_parser(work, *args)
    return work(*args)


async def parse_large(model: type[B], raw: bytes, expected: str) -> B:
    """`parse_body`, in the parser thread for bodies over OFF_LOOP_BYTES, so the event loop stays free."""
    return await run_sized(len(raw), parse_body, model, raw, expected)


def short_errors(exc: ValidationError) -> str:
    return "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors(include_url=False)[:5])


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


# -- KServe v2 / Open Inference Protocol -----------------------------------------------------------------


class V2Input(_Body):
    name: str
    shape: list[int] = Field(description="Dimensions, each >= 0")
    datatype: str = Field(description="BOOL, UINT8..UINT64, INT8..INT64, FP16, FP32, FP64 or BYTES")
    parameters: dict[str, Any] = Field(default_factory=dict)
    data: Any = Field(None, description="Row-major data, flat or nested; absent with binary_data_size")


class V2RequestedOutput(_Body):
    name: str
    parameters: dict[str, Any] = Field(default_factory=dict)


class V2InferRequest(_Body):
    id: str | None = None
    parameters: dict[str, Any] = Field(
        default_factory=dict,
        description="truncate: false | true | head | tail | head+tail (what a long text keeps), "
        "binary_data_output: bool",
    )
    inputs: list[V2Input] = Field(min_length=1)
    outputs: list[V2RequestedOutput] | None = None


class V2Output(_Body):
    name: str
    datatype: str
    shape: list[int]
    data: list[Any] | None = None
    parameters: dict[str, Any] | None = None


class V2InferResponse(_Body):
    model_name: str
    model_version: str
    id: str | None = None
    outputs: list[V2Output]


# -- KServe v1 ---------------------------------------------------------------------------------------


class B64Instance(_Body):
    model_config = ConfigDict(extra="forbid")
    b64: str = Field(description="Base64 of the raw bytes (an image file, or UTF-8 text)")


class V1Parameters(_Body):
    truncate: StrictBool | Literal["head", "tail", "head+tail"] | None = Field(
        None,
        description="Long texts: false = 413; true/head keeps the first max_length bytes, tail the last, "
        "head+tail half of each; absent: the model's default (config.json preprocessing.truncate, else false)",
    )
    top_k: int | None = Field(None, ge=1, description="Labels in top_k (default: server's default_top_k)")
    priority: int | None = Field(None, description="Not supported: a request that sets it is refused with 400")


class V1PredictRequest(_Body):
    instances: list[str | B64Instance] = Field(
        min_length=1, description="Texts as strings; images (or bytes) as {'b64': ...}"
    )
    parameters: V1Parameters = Field(default_factory=V1Parameters)


class LabelScore(BaseModel):
    label: str
    score: float


class Prediction(BaseModel):
    label: str
    score: float
    top_k: list[LabelScore]
    truncated: bool = Field(False, description="The text was longer than max_length and was cut")
    ood_score: float | None = Field(
        None, description="How unlike the training data the input is (higher = less alike); null if the model has none"
    )
    in_distribution: bool | None = Field(
        None, description="ood_score <= the model's threshold (set so 95% of held-out training-like items pass)"
    )


class V1PredictResponse(BaseModel):
    predictions: list[Prediction]


class ClassifiedFile(Prediction):
    filename: str | None = Field(None, description="The multipart part's filename; null for a raw body")


class ClassifyResponse(BaseModel):
    """:classify: `predictions` always (one per file); with one file, its fields also at the top level."""

    model_name: str
    model_version: str
    label: str | None = None
    score: float | None = None
    top_k: list[LabelScore] | None = None
    truncated: bool | None = None
    ood_score: float | None = None
    in_distribution: bool | None = None
    predictions: list[ClassifiedFile]


MAX_PASSAGES_RANGE = (2, 64)  # what an :explain request may ask for (lara_serve.server.explain)


class V1ExplainParameters(V1Parameters):
    max_passages: int | None = Field(
        None, description="Split each text into at most this many passages, 2-64 (default: the server's)"
    )

    @field_validator("max_passages", mode="before")
    @classmethod
    def _in_range(cls, value: object) -> object:
        low, high = MAX_PASSAGES_RANGE
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high):
            raise ValueError(f"max_passages must be an integer in [{low}, {high}], got {value!r}")
        return value


class V1ExplainRequest(_Body):
    instances: list[str | B64Instance] = Field(min_length=1, description="Texts as strings (or UTF-8 as b64)")
    parameters: V1ExplainParameters = Field(default_factory=V1ExplainParameters)


class PassageContribution(BaseModel):
    start: int = Field(description="Byte offset of the passage in the UTF-8 text the model read (after truncation)")
    end: int = Field(description="Byte offset just past the passage")
    text: str
    contribution: float | None = Field(
        description="p(label | text) - p(label | text without this passage); a model that reads in fixed windows "
        "(config model.window) reads the passage's pieces as padding in place instead; null if the text is one passage"
    )
    log_odds: float | None = Field(
        None,
        description="The same in log-odds of the label, log(p/(1-p)) with and without the passage: not saturated "
        "when p is near 1 (probabilities clipped to [1e-7, 1 - 1e-7]); null if the text is one passage",
    )
    score_without: float | None = Field(description="p(label | text without this passage, or with it padded in place)")


class Explanation(Prediction):
    method: Literal["occlusion"] = "occlusion"
    length: int = Field(description="Bytes the model read")
    passages: list[PassageContribution] = Field(description="In document order; together they cover the text")


class V1ExplainResponse(BaseModel):
    explanations: list[Explanation]


class ErrorBody(BaseModel):
    error: str = Field(description="What was wrong and what is allowed")
