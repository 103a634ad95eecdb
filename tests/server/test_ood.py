"""ood_score / in_distribution ("not mine") through the backends, v1, :classify, v2 and the model card, with
synthetic models that have the ood_score output; models without it keep answering as before."""

from __future__ import annotations

import io
import json
import math
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image
from server_helpers import serve

from lara_serve.server import Settings
from lara_serve.server.backends import BackendUnavailable, ModelOutputs, create_backend
from lara_serve.server.backends.pytorch import TorchBackend
from lara_serve.server.models import ServedModel, policy_from
from lara_serve.server.preprocess import collate, text_item
from lara_serve.server.repository import RepositoryError, read_config
from lara_serve.server.synthetic import ENGLISH, load_synthetic, make_image_model, make_text_model

TEXT, IMAGE, OLD = "ood-text", "ood-image", "old-text"
RANDOM = bytes(np.random.default_rng(3).integers(0, 256, 600, dtype=np.uint8)).decode("latin-1")
pytestmark = pytest.mark.anyio
OTHER_ENGLISH = "The council said the new bridge over the river would open to traffic later this year."


@pytest.fixture(scope="module")
def ood_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ood_repository")
    make_text_model(root, TEXT, max_length=4096, ood=True)
    make_image_model(root, IMAGE, ood=True)
    make_text_model(root, OLD, max_length=4096)
    return root


def png(pixels: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(pixels.astype(np.uint8), mode="L").save(buffer, format="PNG")
    return buffer.getvalue()


def test_backends_return_ood_score_and_agree(ood_repo: Path) -> None:
    config = read_config(ood_repo / TEXT)
    assert config.has_ood_output and config.ood_threshold is not None and config.ood_threshold > 0
    onnx = create_backend("onnxruntime", ood_repo / TEXT, config, "cpu")
    torch = TorchBackend(ood_repo / TEXT, config, "cpu", loader=load_synthetic)  # forward returns a tuple
    items = [text_item(t, config.preprocessing, None) for t in (ENGLISH[0], b"a", RANDOM.encode())]
    a, b = onnx.run_outputs(collate(items, config)), torch.run_outputs(collate(items, config))
    assert a.ood_score is not None and b.ood_score is not None and a.ood_score.shape == (3,)
    np.testing.assert_allclose(a.ood_score, b.ood_score, rtol=1e-4)
    np.testing.assert_allclose(a.logits, b.logits, atol=1e-4)
    np.testing.assert_array_equal(onnx.run(collate(items, config)), a.logits)  # run() is still the logits
    old = read_config(ood_repo / OLD)
    assert create_backend("onnxruntime", ood_repo / OLD, old, "cpu").run_outputs(collate(items, old)).ood_score is None


async def test_v1_predict_and_classify_carry_ood(ood_repo: Path) -> None:
    async with serve(Settings(model_repository=ood_repo)) as client:
        texts = [ENGLISH[0].decode(), OTHER_ENGLISH, "a", RANDOM]
        r = await client.post(f"/v1/models/{TEXT}:predict", json={"instances": texts})
        assert r.status_code == 200, r.text
        preds = r.json()["predictions"]
        assert [p["in_distribution"] for p in preds] == [True, True, False, False]
        threshold = read_config(ood_repo / TEXT).ood_threshold
        assert all(isinstance(p["ood_score"], float) and (p["ood_score"] <= threshold) == p["in_distribution"]
                   for p in preds)  # fmt: skip
        assert preds[2]["ood_score"] > 10 * threshold  # one byte is far from English
        one = await client.post(f"/v1/models/{TEXT}:classify", content="a", headers={"content-type": "text/plain"})
        assert one.json()["in_distribution"] is False and one.json()["ood_score"] == pytest.approx(
            preds[2]["ood_score"]
        )
        old = (await client.post(f"/v1/models/{OLD}:predict", json={"instances": texts})).json()["predictions"]
        assert all(p["ood_score"] is None and p["in_distribution"] is None for p in old)
        assert {"label", "score", "top_k", "truncated"} <= set(old[0])  # what old clients read is unchanged


async def test_image_noise_is_not_mine(ood_repo: Path) -> None:
    noise = png(np.random.default_rng(0).integers(0, 256, (28, 28)))
    dark = png(np.zeros((28, 28)))
    async with serve(Settings(model_repository=ood_repo)) as client:
        answers = []
        for data in (noise, dark):
            r = await client.post(f"/v1/models/{IMAGE}:classify", content=data, headers={"content-type": "image/png"})
            assert r.status_code == 200, r.text
            answers.append(r.json())
    assert answers[0]["in_distribution"] is False and answers[0]["ood_score"] > 2.0  # noise: ~2.7 (see synthetic)
    assert answers[1]["in_distribution"] is True and answers[1]["ood_score"] == pytest.approx(0.0, abs=1e-6)


def _v2(texts: list[str], outputs: list[str] | None = None, binary: bool = False) -> dict[str, object]:
    body: dict[str, object] = {
        "inputs": [{"name": "raw", "datatype": "BYTES", "shape": [len(texts)], "data": texts}],
        "parameters": {"binary_data_output": binary},
    }
    if outputs is not None:
        body["outputs"] = [{"name": n} for n in outputs]
    return body


def _binary_outputs(content: bytes, header_length: int) -> dict[str, np.ndarray | list[bytes]]:
    header, blob, offset, out = json.loads(content[:header_length]), content[header_length:], 0, {}
    for o in header["outputs"]:
        size = o["parameters"]["binary_data_size"]
        chunk, offset = blob[offset : offset + size], offset + size
        if o["datatype"] == "BYTES":
            values, pos = [], 0
            while pos < len(chunk):
                (n,) = struct.unpack_from("<I", chunk, pos)
                values.append(chunk[pos + 4 : pos + 4 + n])
                pos += 4 + n
            out[o["name"]] = values
        else:
            out[o["name"]] = np.frombuffer(chunk, dtype={"FP32": "<f4", "BOOL": "|b1"}[o["datatype"]])
    return out


async def test_v2_outputs_metadata_and_requested_outputs(ood_repo: Path) -> None:
    async with serve(Settings(model_repository=ood_repo)) as client:
        meta = (await client.get(f"/v2/models/{TEXT}")).json()
        assert [(o["name"], o["datatype"]) for o in meta["outputs"]] == [
            ("probabilities", "FP32"), ("label", "BYTES"), ("ood_score", "FP32"), ("in_distribution", "BOOL")]  # fmt: skip
        old_meta = (await client.get(f"/v2/models/{OLD}")).json()
        assert [o["name"] for o in old_meta["outputs"]] == ["probabilities", "label"]

        r = (await client.post(f"/v2/models/{TEXT}/infer", json=_v2([ENGLISH[1].decode(), "a"]))).json()
        by_name = {o["name"]: o for o in r["outputs"]}
        assert list(by_name) == ["probabilities", "label", "ood_score", "in_distribution"]
        assert by_name["in_distribution"] == {"name": "in_distribution", "datatype": "BOOL", "shape": [2],
                                              "data": [True, False]}  # fmt: skip
        assert by_name["ood_score"]["datatype"] == "FP32" and by_name["ood_score"]["shape"] == [2]

        asked = (await client.post(f"/v2/models/{TEXT}/infer", json=_v2(["a"], ["in_distribution", "label"]))).json()
        assert [o["name"] for o in asked["outputs"]] == ["in_distribution", "label"]  # only those, in that order

        binary = await client.post(f"/v2/models/{TEXT}/infer", json=_v2([ENGLISH[1].decode(), "a"], binary=True))
        decoded = _binary_outputs(binary.content, int(binary.headers["inference-header-content-length"]))
        assert list(decoded["in_distribution"]) == [True, False]
        np.testing.assert_allclose(decoded["ood_score"], by_name["ood_score"]["data"], rtol=1e-6)

        old = (await client.post(f"/v2/models/{OLD}/infer", json=_v2(["a"]))).json()
        assert [o["name"] for o in old["outputs"]] == ["probabilities", "label"]
        refused = await client.post(f"/v2/models/{OLD}/infer", json=_v2(["a"], ["ood_score"]))
        assert refused.status_code == 422 and "['probabilities', 'label'" in refused.json()["error"]


async def test_model_card_shows_ood_and_calibration(ood_repo: Path) -> None:
    async with serve(Settings(model_repository=ood_repo)) as client:
        card = (await client.get(f"/v1/models/{TEXT}")).json()
        info = {m["name"]: m for m in (await client.get("/info")).json()["models"]}
    assert (
        card["ood"]["output"] == "ood_score" and card["ood"]["threshold"] == read_config(ood_repo / TEXT).ood_threshold
    )
    assert card["ood"]["holdout_pass_rate"] == 0.95 and card["calibration"]["method"] == "temperature"
    assert info[IMAGE]["ood"]["threshold"] == 1.0 and "ood" not in info[OLD]
    assert card["explain"]["max_passages"] == [2, 64] and "explain" not in info[IMAGE]


async def test_triton_config_lists_the_ood_outputs(ood_repo: Path) -> None:
    async with serve(Settings(model_repository=ood_repo)) as client:
        new = (await client.get(f"/v2/models/{TEXT}/config")).json()["output"]
        old = (await client.get(f"/v2/models/{OLD}/config")).json()["output"]
    assert [(o["name"], o["data_type"]) for o in new][2:] == [
        ("ood_score", "TYPE_FP32"),
        ("in_distribution", "TYPE_BOOL"),
    ]
    assert [o["name"] for o in old] == ["probabilities", "label"]


def test_torch_forward_may_return_a_dict(ood_repo: Path) -> None:
    config = read_config(ood_repo / TEXT)

    def as_dict(model_dir: Path) -> object:
        import torch

        inner = load_synthetic(model_dir)

        class Dict(torch.nn.Module):
            def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> dict[str, torch.Tensor]:
                logits, ood = inner(ids, mask)
                return {"logits": logits, "ood_score": ood}

        return Dict()

    items = [text_item(t, config.preprocessing, None) for t in (ENGLISH[0], b"a")]
    tuple_out = TorchBackend(ood_repo / TEXT, config, "cpu", loader=load_synthetic).run_outputs(collate(items, config))
    dict_out = TorchBackend(ood_repo / TEXT, config, "cpu", loader=as_dict).run_outputs(collate(items, config))
    assert tuple_out.ood_score is not None and dict_out.ood_score is not None
    np.testing.assert_array_equal(tuple_out.ood_score, dict_out.ood_score)


def _edit_config(model_dir: Path, **changes: object) -> None:
    path = model_dir / "config.json"
    config = json.loads(path.read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))


@pytest.mark.parametrize("threshold", [math.inf, "1.0", True])
def test_config_refuses_a_bad_threshold(tmp_path: Path, threshold: object) -> None:
    make_text_model(tmp_path, "m", ood=True)
    _edit_config(tmp_path / "m", ood={"threshold": threshold})
    with pytest.raises(RepositoryError, match="ood.threshold must be a finite number"):
        read_config(tmp_path / "m")


def test_config_refuses_a_threshold_without_the_output(tmp_path: Path) -> None:
    make_text_model(tmp_path, "m")
    _edit_config(tmp_path / "m", ood={"threshold": 1.0})
    with pytest.raises(RepositoryError, match="have no 'ood_score'"):
        read_config(tmp_path / "m")


def test_declared_output_missing_from_the_graph_is_refused(tmp_path: Path) -> None:
    make_text_model(tmp_path, "m")  # a graph with logits only
    outputs = json.loads((tmp_path / "m" / "config.json").read_text())["outputs"]
    _edit_config(tmp_path / "m", outputs=[*outputs, {"name": "ood_score", "datatype": "FP32", "shape": [-1]}])
    with pytest.raises(BackendUnavailable, match="declares output 'ood_score'"):
        create_backend("onnxruntime", tmp_path / "m", read_config(tmp_path / "m"), "cpu")


def test_ood_score_without_threshold_gives_no_verdict(tmp_path: Path) -> None:
    make_text_model(tmp_path, "m", ood=True)
    _edit_config(tmp_path / "m", ood=None)
    config = read_config(tmp_path / "m")
    model = ServedModel(config, create_backend("onnxruntime", tmp_path / "m", config, "cpu"), policy_from(
        Settings(model_repository=tmp_path)))  # fmt: skip
    (scored,) = model._run_batch([text_item(b"a", config.preprocessing, None)])
    assert scored.ood_score is not None and scored.in_distribution is None
    assert model.ood_outputs() == {"ood_score": "FP32"}


class _NanOod:
    """A backend whose ood_score goes NaN for texts holding the byte '!' (after a clean load check)."""

    name, device = "fake", "cpu"

    def __init__(self, config: object) -> None:
        self.config = config

    def run(self, inputs: dict[str, np.ndarray]) -> np.ndarray:
        return self.run_outputs(inputs).logits

    def run_outputs(self, inputs: dict[str, np.ndarray]) -> ModelOutputs:
        ids = inputs["input_ids"]
        score = np.where((ids == ord("!") + 1).any(axis=1), np.nan, 0.5).astype(np.float32)
        return ModelOutputs(np.zeros((ids.shape[0], 4), np.float32), score)

    def close(self) -> None:
        pass


async def test_non_finite_ood_score_is_a_500_not_nan_json(ood_repo: Path) -> None:
    config = read_config(ood_repo / TEXT)
    settings = Settings(model_repository=ood_repo)
    model = ServedModel(config, _NanOod(config), policy_from(settings))  # type: ignore[arg-type]
    async with serve(settings, [model]) as client:
        ok = await client.post(f"/v1/models/{TEXT}:predict", json={"instances": ["fine"]})
        bad = await client.post(f"/v1/models/{TEXT}:predict", json={"instances": ["bad!"]})
    assert ok.status_code == 200 and ok.json()["predictions"][0]["ood_score"] == 0.5
    assert bad.status_code == 500 and "non-finite ood_score" in bad.json()["error"]


def test_torch_loader_asks_for_the_served_model_when_it_can(monkeypatch: pytest.MonkeyPatch) -> None:
    """model_export's load_pretrained(serving=True) adds the calibration temperature and ood_score head."""
    from lara_serve import model_export
    from lara_serve.server.backends.pytorch import default_loader

    calls: list[dict[str, object]] = []

    def new_style(model_dir: Path, map_location: str = "cpu", serving: bool = False) -> str:
        calls.append({"serving": serving})
        return "module"

    def old_style(model_dir: Path, map_location: str = "cpu") -> str:
        calls.append({})
        return "module"

    monkeypatch.setattr(model_export, "load_pretrained", new_style)
    assert default_loader()(Path("m")) == "module"
    monkeypatch.setattr(model_export, "load_pretrained", old_style)
    assert default_loader()(Path("m")) == "module"
    assert calls == [{"serving": True}, {}]
