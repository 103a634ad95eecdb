"""LARA Serve installs beside Hugging Face transformers and its `kernels` package in one fresh virtualenv.

The project is built from a copy of its sources (a wheel, not the editable checkout) and installed with
transformers and kernels into a new venv; the heavy dependencies they share (torch, fastapi, onnxruntime,
huggingface_hub ...) are borrowed from the project's .venv through a .pth line, so the test costs one small pip
install instead of two gigabytes. Then, from a folder outside the repository: `import kernels` is Hugging
Face's, transformers saves and loads a model, a LARA model runs forward, and the server classifies a text.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import subprocess
import sys
import sysconfig
import textwrap
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from lara_serve.server.settings import REPO_ROOT
from lara_serve.server.testing import server_process
from tests.install_helpers import bare_venv, copy_sources

pytestmark = pytest.mark.slow
HF = ("transformers", "kernels")


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    for name in HF:
        pytest.importorskip(name, reason=f"{name} is in the [dev] install")
    root = tmp_path_factory.mktemp("beside")
    src = copy_sources(root)
    env = root / "venv"
    python = bare_venv(env)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True).stdout.strip()  # fmt: skip
    # Borrowed after the venv's own site-packages: what the venv installs itself comes first.
    (Path(site) / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pins = [f"{name}=={metadata.version(name)}" for name in HF]
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "-q", "--no-deps", "--ignore-installed", "--no-compile",
                    "--disable-pip-version-check", str(src), *pins], check=True, timeout=900)  # fmt: skip
    yield env


def _run(env: Path, code: str, cwd: Path) -> dict:
    done = subprocess.run([str(env / "bin" / "python"), "-c", textwrap.dedent(code)], cwd=cwd, capture_output=True,
                          text=True, timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_kernels_is_hugging_faces_and_transformers_loads_a_model(venv: Path, tmp_path: Path) -> None:
    found = _run(
        venv,
        f"""
        import json, torch, kernels, transformers, lara_serve
        from transformers import AutoModel, BertConfig, BertModel
        torch.manual_seed(0)
        config = BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                            intermediate_size=64, max_position_embeddings=64)
        BertModel(config).eval().save_pretrained({str(tmp_path / "bert")!r})
        model = AutoModel.from_pretrained({str(tmp_path / "bert")!r}).eval()
        with torch.no_grad():
            out = model(input_ids=torch.tensor([[1, 5, 9, 2]])).last_hidden_state
        print(json.dumps({{"kernels": kernels.__file__, "lara_serve": lara_serve.__file__,
                          "has_get_kernel": hasattr(kernels, "get_kernel"), "shape": list(out.shape)}}))
    """,
        tmp_path,
    )
    site = str(venv)
    assert found["kernels"].startswith(site) and found["has_get_kernel"]  # Hugging Face's, from this venv
    assert found["lara_serve"].startswith(site)  # the built wheel, not the checkout
    assert found["shape"] == [1, 4, 32]


def test_a_lara_model_runs_forward_beside_transformers(venv: Path, tmp_path: Path) -> None:
    found = _run(
        venv,
        """
        import json, torch, transformers, kernels
        from lara_serve.model_export import create_model
        from lara_serve.kernels.api import describe_backends
        torch.manual_seed(0)
        model = create_model("tiny-text").eval()
        ids = torch.randint(1, 257, (2, 40))
        mask = torch.ones(2, 40, dtype=torch.bool)
        with torch.no_grad():
            logits = model(ids, mask)
        print(json.dumps({"shape": list(logits.shape), "finite": bool(torch.isfinite(logits).all())}))
    """,
        tmp_path,
    )
    assert found["shape"][0] == 2 and found["finite"]


def test_the_server_classifies_beside_transformers(venv: Path, tmp_path: Path) -> None:
    args = ["--model-repository", str(REPO_ROOT / "model_repository"), "--models", "lara-text-news-bytes",
            "--num-threads", "1", "--log-level", "warning"]  # fmt: skip
    with server_process(args, python=str(venv / "bin" / "python"), cwd=str(tmp_path), timeout_s=180) as url:
        text = "The striker scored twice in the cup final and the manager praised the defence after the match."
        answer = httpx.post(f"{url}/v1/models/lara-text-news-bytes:predict", json={"instances": [text]}, timeout=60)
        assert answer.status_code == 200, answer.text
        assert answer.json()["predictions"][0]["label"] == "sport"
