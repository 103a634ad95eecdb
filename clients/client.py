"""A small typed client over httpx for the v1 (predict, classify) and v2 (infer) routes."""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self

import httpx
import numpy as np

_HEADER_LENGTH = "Inference-Header-Content-Length"


class LaraError(RuntimeError):
    """A non-2xx answer; `status` and the server's `error` message."""

    def __init__(self, status: int, message: str, retry_after: str | None = None) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status, self.message, self.retry_after = status, message, retry_after


@dataclass(frozen=True)
class LabelScore:
    label: str
    score: float


@dataclass(frozen=True)
class Prediction:
    label: str
    score: float
    top_k: list[LabelScore]
    truncated: bool = False  # the text was longer than the model's max_length and was cut
    # Models with an ood_score output: higher = less like the training data; in_distribution compares it
    # with the model's threshold. None for models without them (and from servers that predate them).
    ood_score: float | None = None
    in_distribution: bool | None = None

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Prediction:
        top = [LabelScore(t["label"], t["score"]) for t in data["top_k"]]
        return cls(data["label"], data["score"], top, bool(data.get("truncated", False)), data.get("ood_score"),
                   data.get("in_distribution"))  # fmt: skip


@dataclass(frozen=True)
class Passage:
    start: int  # byte range [start, end) of the UTF-8 text the model read (after truncation)
    end: int
    text: str
    contribution: float | None  # p(label | text) - p(label | text without this passage)


@dataclass(frozen=True)
class Explanation:
    prediction: Prediction
    passages: list[Passage]  # in document order; they cover the text the model read

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Explanation:
        passages = [Passage(p["start"], p["end"], p["text"], p["contribution"]) for p in data["passages"]]
        return cls(Prediction.from_json(data), passages)

    def top(self, n: int = 3) -> list[Passage]:
        """The n passages that most raised the predicted label's probability."""
        scored = [p for p in self.passages if p.contribution is not None]
        return sorted(scored, key=lambda p: -(p.contribution or 0.0))[:n]


@dataclass(frozen=True)
class V2Result:
    probabilities: np.ndarray  # [B, n_labels] float32
    labels: list[str]
    headers: dict[str, str]
    ood_scores: np.ndarray | None = None  # [B] float32, models with an ood_score output
    in_distribution: np.ndarray | None = None  # [B] bool


class LaraClient:
    """`LaraClient("http://127.0.0.1:8000", api_key=...)`; pass `http=` to reuse an httpx.Client."""

    def __init__(
        self,
        url: str = "http://127.0.0.1:8000",
        api_key: str | None = None,
        timeout_s: float = 60.0,
        http: httpx.Client | None = None,
    ) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._http = http or httpx.Client(base_url=url, timeout=timeout_s)
        self._http.headers.update(headers)
        self.last_headers: dict[str, str] = {}

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: type[BaseException] | BaseException | TracebackType | None) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        response = self._http.request(method, path, **kwargs)
        self.last_headers = dict(response.headers)
        if response.status_code >= 400:
            try:
                message = response.json()["error"]
            except (ValueError, KeyError, TypeError):
                message = response.text
            raise LaraError(response.status_code, message, response.headers.get("retry-after"))
        return response

    # -- health and metadata -------------------------------------------------------------------------

    def is_live(self) -> bool:
        return self._http.get("/v2/health/live").status_code == 200

    def is_ready(self) -> bool:
        return self._http.get("/v2/health/ready").status_code == 200

    def models(self) -> list[str]:
        return list(self._request("GET", "/v1/models").json()["models"])

    def model_info(self, model: str) -> dict[str, Any]:
        return dict(self._request("GET", f"/v1/models/{model}").json())

    def info(self) -> dict[str, Any]:
        """GET /info: the server's limits and one model card per served model."""
        return dict(self._request("GET", "/info").json())

    def metadata(self, model: str) -> dict[str, Any]:
        return dict(self._request("GET", f"/v2/models/{model}").json())

    # -- model repository (the server's --model-control explicit) -----------------------------------

    def repository_index(self) -> list[dict[str, Any]]:
        """Every model of the server's repository folder: name, state (READY/UNAVAILABLE), reason."""
        return list(self._request("POST", "/v2/repository/index", json={}).json())

    def load_model(self, name: str) -> None:
        """(Re)load `name` from the server's own model repository; the old instance serves until it is ready."""
        self._request("POST", f"/v2/repository/models/{name}/load", json={})

    def load_from_repository(self, name: str) -> str:
        """Load a model that lies in the server's repository folder; a clear LaraError when the server
        cannot see it (the server reads its own --model-repository, never a path sent to it)."""
        names = sorted(m["name"] for m in self.repository_index())
        if name not in names:
            raise LaraError(
                404,
                f"the server's model repository has no folder {name!r} (it has {names}); the server loads only "
                "from its own --model-repository: train with --out <that folder>/<name>, or copy the model "
                "folder there, then load it",
            )
        self.load_model(name)
        return name

    # -- v1 ------------------------------------------------------------------------------------------

    def predict(
        self, model: str, instances: list[str | bytes], truncate: bool | str | None = None, top_k: int | None = None
    ) -> list[Prediction]:
        """Texts as str; images (or raw bytes) as bytes, sent as {"b64": ...}. truncate None: the model's
        default (config.json's preprocessing.truncate; 413 if it has none)."""
        body = {
            "instances": [{"b64": base64.b64encode(i).decode()} if isinstance(i, bytes) else i for i in instances],
            "parameters": {**_truncate_field(truncate), **({"top_k": top_k} if top_k else {})},
        }
        data = self._request("POST", f"/v1/models/{model}:predict", json=body).json()
        return [Prediction.from_json(p) for p in data["predictions"]]

    def explain(
        self, model: str, texts: list[str], truncate: bool | str | None = None, max_passages: int | None = None
    ) -> list[Explanation]:
        """Text models: the prediction and each passage's contribution to it (occlusion), per text."""
        params: dict[str, Any] = {
            **_truncate_field(truncate),
            **({"max_passages": max_passages} if max_passages else {}),
        }
        data = self._request("POST", f"/v1/models/{model}:explain", json={"instances": texts, "parameters": params})
        return [Explanation.from_json(e) for e in data.json()["explanations"]]

    def classify(
        self,
        model: str,
        data: bytes | str,
        content_type: str | None = None,
        truncate: bool | str = False,
        top_k: int | None = None,
    ) -> Prediction:
        """One text (str, or bytes with `text/plain; charset=...`) or image file (image/png, ...). Bytes
        without a content type go as application/octet-stream: the server tells text and images apart.
        truncate: False (413 if too long), True/"head", "tail" or "head+tail"."""
        if isinstance(data, str):
            data, content_type = data.encode(), content_type or "text/plain; charset=utf-8"
        headers = {"Content-Type": content_type or "application/octet-stream"}
        params: dict[str, str | int] = {"truncate": _truncate_param(truncate)} if truncate else {}
        if top_k:
            params["top_k"] = top_k
        response = self._request("POST", f"/v1/models/{model}:classify", content=data, headers=headers,
                                 params=params)  # fmt: skip
        return Prediction.from_json(response.json())

    # -- v2 ------------------------------------------------------------------------------------------

    def infer(self, model: str, items: list[bytes], binary: bool = True, truncate: bool | None = None) -> V2Result:
        """v2 infer on the BYTES `raw` input; binary=True uses the binary tensor data extension."""
        params: dict[str, Any] = {**_truncate_field(truncate), "binary_data_output": binary}
        spec: dict[str, Any] = {"name": "raw", "datatype": "BYTES", "shape": [len(items)]}
        if binary:
            blob = b"".join(struct.pack("<I", len(i)) + i for i in items)
            head = json.dumps({"inputs": [{**spec, "parameters": {"binary_data_size": len(blob)}}],
                               "parameters": params}).encode()  # fmt: skip
            kwargs: dict[str, Any] = {"content": head + blob, "headers": {_HEADER_LENGTH: str(len(head))}}
        else:
            kwargs = {"json": {"inputs": [{**spec, "data": [i.decode() for i in items]}], "parameters": params}}
        response = self._request("POST", f"/v2/models/{model}/infer", **kwargs)
        return _decode_v2(response)


def _truncate_field(truncate: bool | str | None) -> dict[str, bool | str]:
    """The request's truncate parameter, left out when None so the model's default applies."""
    return {} if truncate is None else {"truncate": truncate}


def _truncate_param(truncate: bool | str) -> str:
    return "head" if truncate is True else str(truncate)


def _decode_v2(response: httpx.Response) -> V2Result:
    body = response.content
    split = int(response.headers.get(_HEADER_LENGTH, len(body)))
    header, blob, offset = json.loads(body[:split]), body[split:], 0
    out: dict[str, Any] = {}
    for output in header["outputs"]:
        size = (output.get("parameters") or {}).get("binary_data_size")
        if size is None:
            out[output["name"]] = output["data"]
            continue
        chunk, offset = blob[offset : offset + size], offset + size
        if output["datatype"] == "BYTES":
            values, pos = [], 0
            while pos < len(chunk):
                (n,) = struct.unpack_from("<I", chunk, pos)
                values.append(chunk[pos + 4 : pos + 4 + n].decode())
                pos += 4 + n
            out[output["name"]] = values
        else:
            out[output["name"]] = np.frombuffer(chunk, dtype=_NUMPY.get(output["datatype"], "<f4"))
    n_items = len(out["label"])
    probabilities = np.asarray(out["probabilities"], dtype=np.float32).reshape(n_items, -1)
    ood = np.asarray(out["ood_score"], dtype=np.float32) if "ood_score" in out else None
    inside = np.asarray(out["in_distribution"], dtype=bool) if "in_distribution" in out else None
    return V2Result(probabilities, list(out["label"]), dict(response.headers), ood, inside)


_NUMPY = {"FP32": "<f4", "BOOL": "|b1", "INT64": "<i8"}
