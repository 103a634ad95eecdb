"""Peak resident memory of the lean install (onnxruntime, no torch) for one long text document.

    python -m benchmarks.memory_one_mib [--model lara-text-news-bytes] [--bytes 1048576] [--variants sliced,server]

Each variant runs in a fresh process (one at a time: a 1 MiB document through the whole graph may take 8 GB):
load the model's onnxruntime backend as the server does (no torch hand-off: `ort_long_via_torch` has no
torch to hand off to in the image), run one document of --bytes bytes (examples/long-document.txt
repeated), then a short one. `before`: the whole graph on one session with onnxruntime's arena (what
served every length first); `after`: the whole graph, documents over 65,536 tokens on a session without
arena or memory patterns, the heap trimmed after them; `sliced`: documents over 65,536 tokens on the
model's sliced program (`1/sliced/`, lara_serve.sliced_program), what the server runs now. Per
variant: RSS when loaded, peak RSS (ru_maxrss), RSS after the long document and after the short one,
seconds of the long one. `server`: the whole server as the image and the manifests run it (the models
.dockerignore lets into the image, SERVER_ENV), every text model's arena grown by its largest batch, then
one document through `:classify` to each text model in turn, resident memory sampled every 20 ms: the
figure the pod's memory limit is set from (--model does not apply to it). `server_own_arenas`: the same with
one onnxruntime arena per model (LARA_ORT_SHARED_ARENA=false), as before 2026-12-06. Writes benchmarks/results/memory_one_mib.json; variants not run this
time are kept from the file's previous content (each variant records the command that measured it).
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.sampling import peak_of

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results" / "memory_one_mib.json"
VARIANTS = ("before", "after", "sliced", "server", "server_own_arenas")
CHILD_VARIANTS = VARIANTS[:3]


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(model: str, size: int, variant: str) -> dict[str, float]:
    """In the measured process: the backend as the server builds it, one long document, one short."""
    from lara_serve.server.backends import OrtOptions
    from lara_serve.server.backends.onnx_runtime import OnnxRuntimeBackend
    from lara_serve.server.preprocess import collate, text_item
    from lara_serve.server.repository import served_config
    from lara_serve.server.settings import DEFAULT_MODEL_REPOSITORY

    model_dir = DEFAULT_MODEL_REPOSITORY / model
    config = served_config(model, model_dir)
    backend = OnnxRuntimeBackend(
        model_dir,
        config,
        "cpu",
        ort_options=OrtOptions(long_via_torch=False),
        lean_long=variant != "before",
        sliced=variant == "sliced",
    )
    text = (ROOT / "examples" / "long-document.txt").read_bytes()
    document = (text * (size // len(text) + 1))[:size]
    short = text_item(text[:2048], config.preprocessing, "head")
    backend.run_outputs(collate([short], config))  # warm: the idle server's state
    loaded = rss_mib()
    start = time.perf_counter()
    backend.run_outputs(collate([text_item(document, config.preprocessing, None)], config))
    seconds = time.perf_counter() - start
    after_long = rss_mib()
    backend.run_outputs(collate([short], config))
    return {
        "rss_loaded_mib": round(loaded, 1),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "rss_after_long_mib": round(after_long, 1),
        "rss_after_short_mib": round(rss_mib(), 1),
        "long_seconds": round(seconds, 2),
    }


# The manifests' settings (deploy/k8s/configmap.yaml), every shipped model, and no torch hand-off: the image
# has no torch, so long documents run on onnxruntime there whatever ort_long_via_torch says.
SERVER_ENV = {"LARA_NUM_THREADS": "2", "LARA_MAX_BATCH_TOKENS": "65536", "LARA_ORT_LONG_VIA_TORCH": "false",
              "LARA_REQUEST_TIMEOUT_S": "600"}  # fmt: skip


def _children_rss_mib() -> float:
    """Resident memory of this process's children (the server), summed."""
    total = 0.0
    for path in Path("/proc/self/task").glob("*/children"):
        for pid in path.read_text().split():
            status = Path(f"/proc/{pid}/status")
            for line in status.read_text().splitlines() if status.exists() else []:
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) / 1024
    return total


def left_out_of_image() -> set[str]:
    """Models that .dockerignore keeps out of the image (a `model_repository/<name>/` line)."""
    lines = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()]
    return {line.split("/")[1] for line in lines if line.startswith("model_repository/") and line.endswith("/")
            and line.count("/") == 2}  # fmt: skip


def image_models() -> dict[str, dict]:
    """name -> config.json of every model the image serves, in repository order."""
    from lara_serve.server.settings import DEFAULT_MODEL_REPOSITORY

    configs = sorted(DEFAULT_MODEL_REPOSITORY.glob("*/config.json"))
    skip = left_out_of_image()
    return {p.parent.name: json.loads(p.read_text()) for p in configs if p.parent.name not in skip}


def largest_batch(config: dict, document: bytes, budget: int) -> list[bytes]:
    """The texts of the batch that grows a text model's arena the most at the manifests' token budget: one
    64 KiB document for a byte model (65,536 tokens); for a word-piece model, as many documents at its whole
    graph's longest as the budget admits (4 x ~15,500 pieces: 644 MiB against 549 for one, measured)."""
    if config["preprocessing"]["kind"] != "wordpiece":
        return [document[:budget]]
    whole = config["model"]["max_length"]  # the whole graph's longest; the sliced program reads past it
    per, count = whole * 4, budget // whole  # bytes: English runs ~4.8 bytes a piece, so under `whole` pieces
    document = document * (per * count // len(document) + 1)
    return [document[i * per : (i + 1) * per] for i in range(count)]


def server(size: int, shared_arena: bool = True) -> dict:
    """The whole server (python -m lara_serve.server) with the image's models: idle RSS; RSS once every text
    model has run its largest batch (largest_batch: the arenas keep that size); then, for each text model in
    turn, peak while one document of `size` bytes is classified (sampled every 20 ms) and RSS after it;
    `peak_rss_mib`, the largest of them, is the pod's worst case."""
    import httpx

    from lara_serve.server.testing import server_process

    text = (ROOT / "examples" / "long-document.txt").read_bytes()
    document = (text * (size // len(text) + 1))[:size]
    headers = {"Content-Type": "text/plain"}
    models = image_models()
    texts = [name for name, config in models.items() if config["task"] == "text"]
    budget = int(SERVER_ENV["LARA_MAX_BATCH_TOKENS"])
    env = {**SERVER_ENV, "LARA_ORT_SHARED_ARENA": str(shared_arena).lower()}
    with server_process(["--log-level", "warning", "--models", ",".join(models)], env=env, timeout_s=300) as url:
        idle = _children_rss_mib()
        for name in texts:  # each arena at its largest: the worst case the pod's limit must hold
            batch = [t.decode("utf-8", "ignore") for t in largest_batch(models[name], document, budget)]
            r = httpx.post(f"{url}/v1/models/{name}:predict", json={"instances": batch}, timeout=600)
            r.raise_for_status()
        arenas = _children_rss_mib()
        per_model = {}
        for name in texts:
            with peak_of(_children_rss_mib) as peak:
                start = time.perf_counter()
                r = httpx.post(f"{url}/v1/models/{name}:classify", content=document, headers=headers, timeout=900)
                seconds = time.perf_counter() - start
            r.raise_for_status()
            per_model[name] = {"peak_rss_mib": round(peak["peak"], 1), "rss_after_long_mib": round(_children_rss_mib(), 1),
                               "long_seconds": round(seconds, 2), "truncated": r.json().get("truncated")}  # fmt: skip
            print(name, per_model[name], flush=True)
        httpx.post(f"{url}/v1/models/{texts[0]}:classify", content=text[:2048], headers=headers, timeout=60)
        return {
            "models": list(models),
            "rss_idle_mib": round(idle, 1),
            "rss_arenas_mib": round(arenas, 1),
            "peak_rss_mib": max(m["peak_rss_mib"] for m in per_model.values()),
            "rss_after_long_mib": max(m["rss_after_long_mib"] for m in per_model.values()),
            "rss_after_short_mib": round(_children_rss_mib(), 1),
            "long_seconds": max(m["long_seconds"] for m in per_model.values()),
            "per_model": per_model,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="lara-text-news-bytes")
    parser.add_argument("--bytes", type=int, default=1 << 20)
    parser.add_argument("--variants", default="sliced,server")
    parser.add_argument("--child", choices=CHILD_VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.model, args.bytes, args.child)))
        return
    command = " ".join(["python -m benchmarks.memory_one_mib", *sys.argv[1:]])
    previous = json.loads(args.out.read_text()) if args.out.is_file() else {}
    same = previous.get("model") == args.model and previous.get("bytes") == args.bytes
    results = dict(previous.get("variants", {})) if same else {}
    for variant in args.variants.split(","):  # sequentially, never two at once
        if variant not in VARIANTS:
            parser.error(f"unknown variant {variant!r}; choose from {', '.join(VARIANTS)}")
        if variant.startswith("server"):
            results[variant] = {**server(args.bytes, shared_arena=variant == "server"), "command": command}
            print(variant, results[variant], flush=True)
            continue
        cmd = [sys.executable, "-m", "benchmarks.memory_one_mib", "--model", args.model, "--bytes", str(args.bytes),
               "--child", variant]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, check=True, timeout=1800)
        results[variant] = {**json.loads(done.stdout.strip().splitlines()[-1]), "command": command}
        print(variant, results[variant], flush=True)
    report = {**(previous if same else {}), "model": args.model, "bytes": args.bytes, "variants": results}
    report.pop("command", None)  # each variant carries its own
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
