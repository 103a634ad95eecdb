"""Server settings: flags > environment variables (prefix `LARA_`) > defaults.

Each field's description states its trade-off; `python -m lara_serve.server --help` prints them. Impossible
combinations are refused when the settings are built, i.e. at start-up, not at the first request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal, Self

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

REPO_ROOT = Path(__file__).resolve().parent.parent
DEFAULT_MODEL_REPOSITORY = REPO_ROOT / "model_repository"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="LARA_", extra="ignore", frozen=True)

    host: str = Field("127.0.0.1", description="Interface to bind. Loopback by default; expose on purpose.")
    port: int = Field(8000, ge=1, le=65535, description="TCP port to listen on.")
    model_repository: Path = Field(
        DEFAULT_MODEL_REPOSITORY,
        description="Folder with <name>/config.json and <name>/<version>/model.onnx|model.safetensors.",
    )
    models: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated model names to load; empty loads every model in the repository.",
    )
    backend: Literal["onnxruntime", "torch"] = Field(
        "onnxruntime",
        description="onnxruntime runs model.onnx (lean, fast on CPU); torch runs the PyTorch model "
        "(needs model_export; uses the Triton attention kernels on GPU).",
    )
    model_backends: Annotated[dict[str, Literal["onnxruntime", "torch"]], NoDecode] = Field(
        default_factory=dict,
        description="Per-model backend as comma-separated name=backend pairs (e.g. `big-exact=torch`), like "
        "Triton's per-model `backend`; models not named use `backend`.",
    )
    device: Literal["cpu", "cuda"] = Field(
        "cpu", description="cuda needs a GPU build of the chosen backend; start-up fails if it is absent."
    )
    num_threads: int = Field(
        0, ge=0, le=256, description="Intra-op threads of the backend; 0 keeps the library default."
    )
    ort_spinning: bool = Field(
        False,
        description="onnxruntime: let idle intra-op threads busy-wait for the next parallel section. Off: "
        "a request's CPU time halves (12.8 -> 6.2 ms per lara-vit-fashion request here, "
        "docs/performance.md) at the same latency on an idle machine; on a shared or loaded machine the "
        "spinning only takes cores from the event loop and other work. On: maybe a little lower latency "
        "on cores nothing else uses.",
    )
    ort_shared_arena: bool = Field(
        True,
        description="onnxruntime on CPU: every model's session draws on one memory arena for the process. "
        "An arena keeps the size of the largest batch it ran: with one arena per model the process keeps the "
        "sum of every model's largest batch (the image's models after their largest batches: 1,175 MiB, 312 "
        "idle), with one shared arena about the largest run at one time (789 MiB; `python -m "
        "benchmarks.memory_one_mib --variants server,server_own_arenas`). Off: one arena per model, as "
        "before 2026-12-06.",
    )
    ort_long_via_torch: bool = Field(
        True,
        description="onnxruntime on CPU: text documents longer than 65,536 tokens run on the same model's "
        "torch forward over slices (lara_serve.model_export.models.long_forward) when the [train] extra (torch) is installed "
        "and the model has model.safetensors: ~1.7 KB of memory per byte instead of onnxruntime's ~7.6 "
        "(2.6 GB vs 8 GB above the idle server at 1 MiB, benchmarks.long_serving). Off, or without them: onnxruntime runs every length.",
    )
    ort_attention: Literal["auto", "fused", "body"] = Field(
        "auto",
        description="onnxruntime on CPU: how LaraAttention nodes run. fused: the compiled C++ kernel as an "
        "onnxruntime custom op (about 0.9x the body's latency, benchmarks/ort_kernel.py; needs g++ and "
        "onnxruntime's C API headers, which `make serve` installs), start-up fails without it; body: the "
        "node's ONNX function body; auto: fused when it can be built here, else body with a warning.",
    )
    keep_freed_memory: bool = Field(
        True,
        description="torch backend: glibc keeps freed memory for reuse (no mmap/munmap per large tensor); "
        "about 40% faster long documents, resident memory stays at its peak. onnxruntime has its own arena.",
    )
    max_batch_size: int = Field(
        32, ge=1, le=4096, description="Most items per batch. 1 disables batching (lowest latency alone)."
    )
    max_batch_tokens: int = Field(
        65536,
        ge=1,
        description="Token budget of a batch: padded length x items. Bounds memory and per-batch latency; "
        "an item longer than the budget still runs, alone.",
    )
    max_queue_delay_ms: float = Field(
        2.0,
        ge=0.0,
        le=10_000.0,
        description="Longest wait for a batch to fill. Higher raises throughput under load and adds "
        "latency at low load.",
    )
    max_queue_size: int = Field(1024, ge=1, description="Items waiting per model before requests are refused with 429.")
    max_queue_tokens: int = Field(
        1 << 24,
        ge=1,
        description="Tokens (bytes of text; an image counts 1) waiting per model before requests are refused "
        "with 429: bounds the queue's memory (each queued token holds its id and mask) where max_queue_size counts "
        "items. A request is always taken by an empty queue, however long.",
    )
    length_bucket_ratio: float = Field(
        2.0,
        gt=1.0,
        description="Items whose lengths are within this ratio of the batch's oldest item are batched "
        "first, so little compute is spent on padding.",
    )
    explain_passages: int = Field(
        16,
        ge=2,
        le=64,
        description=":explain splits a text into at most this many passages (a request may ask for 2-64); each "
        "passage costs one more model run of about the text's length.",
    )
    max_body_bytes: int = Field(16 * 1024 * 1024, ge=1024, description="Largest request body; larger ones get 413.")
    max_input_bytes: int = Field(
        0,
        ge=0,
        description="Largest input (one text or image file) in bytes, for every model; larger ones get 413 before "
        "decoding. A model's config.json may set its own max_input_bytes; the smaller applies. Bounds a long "
        "document's memory (onnxruntime holds several KB per byte of text: size a pod's memory limit with "
        "docs/deploy.md). 0: no server-wide cap (the body size and each model's max_length still apply).",
    )
    max_image_pixels: int = Field(
        4096 * 4096, ge=1, description="Largest decoded image (width x height); larger ones get 413."
    )
    request_timeout_s: float = Field(
        30.0,
        gt=0.0,
        description="Longest wait for a request's items to start computing (and for the batcher's estimate "
        "of their finish): items still queued then get 504 and are never computed; running ones finish.",
    )
    graceful_timeout_s: float = Field(
        30.0,
        ge=0.0,
        le=3600.0,
        description="On SIGTERM/SIGINT: readiness turns 503, new requests get 503, and accepted work may "
        "finish for this long; then what is still queued gets 503 and the server exits. Keep it below "
        "the orchestrator's grace period (Kubernetes: terminationGracePeriodSeconds minus preStop).",
    )
    max_connections: int = Field(
        1000,
        ge=1,
        description="Open client connections; beyond it a new connection gets 503 and is closed at once. "
        "Lowered at start-up to fit the process's open-file limit.",
    )
    keep_alive_timeout_s: float = Field(
        5.0, gt=0.0, le=3600.0, description="An idle keep-alive connection is closed after this long."
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0.0,
        le=3600.0,
        description="Time a client has to send a request's line and headers (slow-header clients get "
        "408 and are closed).",
    )
    body_timeout_s: float = Field(
        60.0,
        gt=0.0,
        le=3600.0,
        description="Time a client has to send a whole request body once its headers arrived (slow "
        "uploads get 408). Size it for max_body_bytes over the slowest client link you accept.",
    )
    max_decode_pixels: int = Field(
        2 * 4096 * 4096,
        ge=1,
        description="Pixels (width x height) of images being decoded at once, over all requests; more "
        "wait. Bounds the memory a burst of large images can take; must be >= max_image_pixels.",
    )
    max_decode_threads: int = Field(
        2,
        ge=1,
        le=64,
        description="Threads that decode images, over all requests; each request decodes one image at a time "
        "and stops when its client leaves. More decode faster on many cores and take CPU from inference.",
    )
    max_large_bodies: int = Field(
        8,
        ge=1,
        description="Requests with a body over large_body_bytes handled at once; more wait (unread) up to "
        "large_body_wait_s, then get 503 with Retry-After. A large body costs a few times its size in memory while it is "
        "parsed, so this bounds the memory of a burst: about max_large_bodies x 4 x max_body_bytes.",
    )
    large_body_bytes: int = Field(
        64 * 1024,
        ge=1024,
        description="Bodies over this size count against max_large_bodies and are parsed off the event loop. "
        "A 1 MB text costs tens of MB while it is handled: at 1 MiB, 100 concurrent 1,040,000-byte texts "
        "went around the gate and took 3.2 GB (docs/reliability.md).",
    )
    large_body_wait_s: float = Field(
        30.0,
        ge=0.0,
        le=600.0,
        description="How long a large body waits (unread) for one of max_large_bodies slots before 503. "
        "Longer queues a burst of uploads instead of refusing it; the memory bound holds either way.",
    )
    strict_models: bool = Field(
        False,
        description="true: any model that fails to load stops start-up (exit 1; an unusable config.json or "
        "version folder is found before loading: exit 2, docs/serving.md). false: it is reported "
        "(log, /v2/models/<name>/ready 503 with the reason, lara_model_ready 0) and the others serve.",
    )
    default_top_k: int = Field(5, ge=1, description="Labels returned in v1 `top_k` unless asked otherwise.")
    api_key: SecretStr | None = Field(
        None,
        description="If set, every route except health and docs needs `Authorization: Bearer <key>` "
        "or `X-API-Key: <key>`. A flag is visible to every user in `ps`: prefer the LARA_API_KEY "
        "environment variable or --api-key-file.",
    )
    api_key_file: Path | None = Field(
        None,
        description="Read api_key from this file (first line; e.g. a mounted Kubernetes secret), so the key "
        "is not on the command line. Exclusive with api_key.",
    )
    warmup: bool = Field(
        True,
        description="Run the shapes of a first request per model before reporting ready (slower start, "
        "no slow first request). A one-item output check runs at load either way.",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="uvicorn log level."
    )
    model_control: Literal["none", "explicit"] = Field(
        "none",
        description="explicit: POST /v2/repository/models/<name>/load|unload load and unload models at run "
        "time (behind api_key when one is set; Triton's --model-control-mode). none: the models loaded at "
        "start-up are fixed and those routes answer 400.",
    )
    metrics_auth: bool = Field(
        True,
        description="With api_key set, /metrics needs the key too. false serves /metrics without it (for a "
        "scraper on a trusted network); the inference routes still need the key.",
    )
    metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="If set, Prometheus metrics are also served on this port of the same host, without the "
        "key (Triton's --metrics-port): a scraper needs no access to the inference port. 0: off.",
    )
    grpc_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="If set, KServe v2 gRPC (Triton's GRPCInferenceService) on this port of the same host, "
        "beside HTTP, through the same batcher and limits (Triton uses 8001). 0: off, so the lean install "
        "needs no grpcio; the `grpc` extra installs it.",
    )
    grpc_max_message_bytes: int = Field(
        16 * 1024 * 1024,
        ge=1024,
        description="Largest gRPC message, each way; larger requests get RESOURCE_EXHAUSTED (the gRPC twin of "
        "max_body_bytes).",
    )
    grpc_max_connections: int = Field(
        1000,
        ge=1,
        description="Open gRPC connections; beyond it grpc closes a new one at once (clients see UNAVAILABLE "
        "and retry). Shares the process's open-file budget with max_connections: both are lowered at "
        "start-up to fit it, so idle connections cannot take the descriptors HTTP needs.",
    )
    grpc_max_concurrent_calls: int = Field(
        1000,
        ge=1,
        description="KServe gRPC calls in flight; more get UNAVAILABLE at once (retryable) before their message "
        "is parsed. Health and reflection calls are not counted.",
    )
    grpc_idle_timeout_s: float = Field(
        300.0,
        gt=0.0,
        le=86400.0,
        description="A gRPC connection with no call for this long is closed (GOAWAY); clients reconnect on "
        "their next call. The TLS/HTTP2 handshake must finish within header_timeout_s.",
    )
    tei_model: str | None = Field(
        None,
        description="Model that TEI's /predict, POST / and /invocations serve when the request names none "
        "(?model=), and /info's model_id. Unset: the first text model in repository (folder name) order that "
        "reads word pieces (a pretrained encoder, such as lara-text-news), else the first text model.",
    )
    ssl_certfile: Path | None = Field(
        None,
        description="PEM certificate (chain) to serve HTTPS and gRPC over TLS with; needs ssl_keyfile. Unset: "
        "plain HTTP and gRPC (terminate TLS in front, e.g. at an ingress, or on a trusted network).",
    )
    ssl_keyfile: Path | None = Field(None, description="PEM private key of ssl_certfile.")
    cors_allow_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="Comma-separated origins (e.g. `https://app.example.com`) whose browser pages may call the "
        "API; `*` allows any. Empty (default): no CORS headers, so browsers only allow same-origin pages.",
    )
    log_format: Literal["text", "json"] = Field(
        "text",
        description="text: lines for people. json: one JSON object per line (time, level, message, request_id; "
        "access lines add method, path, status, duration_ms) for a log pipeline.",
    )
    compress_responses: bool = Field(
        True,
        description="gzip responses of 1 KiB or more to clients that send `Accept-Encoding: gzip`: less "
        "network, a little CPU (level 5). Off: responses are never compressed.",
    )

    @model_validator(mode="before")
    @classmethod
    def _read_api_key_file(cls, data: object) -> object:
        if not isinstance(data, dict) or not data.get("api_key_file"):
            return data
        if data.get("api_key"):
            raise ValueError("set api_key or api_key_file, not both")
        path = Path(data["api_key_file"])
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"api_key_file {path.name!r} cannot be read ({type(exc).__name__})") from None
        key = lines[0].strip() if lines else ""
        if not key:
            raise ValueError(f"api_key_file {path.name!r} is empty")
        return {**data, "api_key": key}

    @field_validator("models", mode="before")
    @classmethod
    def _split_models(cls, value: object) -> object:
        if isinstance(value, str):
            return [name.strip() for name in value.split(",") if name.strip()]
        return value

    @field_validator("cors_allow_origins", mode="before")
    @classmethod
    def _split_origins(cls, value: object) -> object:
        if isinstance(value, str):
            return [origin.strip().rstrip("/") for origin in value.split(",") if origin.strip()]
        return value

    @field_validator("model_backends", mode="before")
    @classmethod
    def _split_model_backends(cls, value: object) -> object:
        if not isinstance(value, str):
            return value
        pairs: dict[str, str] = {}
        for part in filter(None, (p.strip() for p in value.split(","))):
            name, sep, backend = (x.strip() for x in part.partition("="))
            if not sep or not name or not backend:
                raise ValueError(f"model_backends entry {part!r} is not name=backend (backend: onnxruntime or torch)")
            pairs[name] = backend
        return pairs

    def backend_for(self, model: str) -> Literal["onnxruntime", "torch"]:
        """The backend that serves `model`: its model_backends entry, else `backend`."""
        return self.model_backends.get(model, self.backend)

    @field_validator("api_key")
    @classmethod
    def _key_not_trivial(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and len(value.get_secret_value()) < 8:
            raise ValueError("api_key must have at least 8 characters (or be unset to disable auth)")
        return value

    @model_validator(mode="after")
    def _refuse_impossible(self) -> Self:
        if not self.model_repository.is_dir():
            raise ValueError(f"model_repository {str(self.model_repository)!r} is not a directory")
        if self.max_queue_size < self.max_batch_size:
            raise ValueError(
                f"max_queue_size ({self.max_queue_size}) must be >= max_batch_size ({self.max_batch_size}):"
                " a full batch could never form"
            )
        if self.request_timeout_s * 1000.0 <= self.max_queue_delay_ms:
            raise ValueError(
                f"request_timeout_s ({self.request_timeout_s}) must exceed max_queue_delay_ms "
                f"({self.max_queue_delay_ms} ms): requests would time out while the batch fills"
            )
        if self.metrics_port and self.metrics_port == self.port:
            raise ValueError(f"metrics_port ({self.metrics_port}) must differ from port ({self.port})")
        if self.grpc_port and self.grpc_port in (self.port, self.metrics_port):
            raise ValueError(f"grpc_port ({self.grpc_port}) must differ from port and metrics_port")
        if (self.ssl_certfile is None) != (self.ssl_keyfile is None):
            raise ValueError(
                "set both ssl_certfile and ssl_keyfile (TLS needs the certificate and its key), or neither"
            )
        for tls_file in (self.ssl_certfile, self.ssl_keyfile):
            if tls_file is not None and not tls_file.is_file():
                raise ValueError(f"TLS file {tls_file.name!r} does not exist or is not a file")
        if self.max_decode_pixels < self.max_image_pixels:
            raise ValueError(
                f"max_decode_pixels ({self.max_decode_pixels}) must be >= max_image_pixels "
                f"({self.max_image_pixels}): the largest allowed image could never be decoded"
            )
        return self
