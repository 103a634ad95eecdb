"""Latency and memory per document vs length through the real server (python -m lara_serve.server on 127.0.0.1).

    python -m benchmarks.long_serving [--model lara-text-news-bytes] [--lengths 1024,4096,...,262144,1048576]
    python -m benchmarks.long_serving --synthetic   # the same path on a synthetic model of max_length 1 MiB

Documents are same-label composites of BBC test articles cut to each length (lara_serve.model_export.training.long_docs). For
each length: a request holding 1 document (median of --repeats), and a request holding 8 different
documents (median of --repeats, also per document). Lengths above 64 KB use --long-repeats and
--long-docs documents in the multi-document request (each 1 MiB document runs alone in its batch, so 8 of
them take 8 runs); `--backend torch` serves the model through PyTorch, whose forward takes documents above
64K tokens in slices of rows (lara_serve.model_export.models.long_forward); lengths above the model's max_length are
listed as skipped. The server's resident memory is sampled from /proc every 10 ms; the table gives its
peak above the idle (warmed-up) server at each length, and the largest X-Batch-Size of the 8-document
requests (1 where a document is longer than max_batch_tokens: it ran alone).
Writes benchmarks/results/long_serving.json (long_serving_synthetic.json with --synthetic).

    python -m benchmarks.long_serving --compare-ort-attention [--lengths 4096,16384,32768,65536]

starts two servers, one running LaraAttention as its ONNX function body (LARA_ORT_ATTENTION=body), one
with the fused kernel (=fused), and alternates every request between them, so both see the same load;
`--before REV` adds a third, the body on the model.onnx that commit REV shipped (what users had then).
Writes benchmarks/results/long_serving_ort_attention.json with the ratios fused / body (/ before).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx

from benchmarks.common import environment, markdown_table, model_path_at, shipped_onnx_at, write_json
from benchmarks.sampling import peak_of
from lara_serve.model_export.training.long_docs import make_composites
from lara_serve.model_export.training.tasks import text_docs
from lara_serve.server.testing import server_process

REPO = Path(__file__).resolve().parent.parent / "model_repository"


def _rss_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _server_pid(port: int) -> int:
    """The `python -m lara_serve.server` process listening on `port` (found by its command line)."""
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if b"server" in cmd and b"--port" in cmd and cmd[cmd.index(b"--port") + 1] == str(port).encode():
                return int(proc.name)
    raise RuntimeError(f"no server process on port {port}")


def _post(client: httpx.Client, model: str, texts: list[str]) -> tuple[float, float | None]:
    elapsed, server_ms, _ = _post_batch(client, model, texts)
    return elapsed, server_ms


def _post_batch(client: httpx.Client, model: str, texts: list[str]) -> tuple[float, float | None, int]:
    """(client ms, server inference ms, X-Batch-Size) of one :predict request."""
    t0 = time.perf_counter()
    r = client.post(f"/v1/models/{model}:predict", json={"instances": texts})
    elapsed = time.perf_counter() - t0
    r.raise_for_status()
    if any(p["truncated"] for p in r.json()["predictions"]):
        raise RuntimeError("the server truncated a document: the benchmark must measure whole documents")
    server_ms = r.headers.get("x-inference-time-ms")
    return elapsed * 1000, float(server_ms) if server_ms else None, int(r.headers.get("x-batch-size", "0"))


LONG = 65536  # lengths above this use long_repeats


def measure(
    url: str, pid: int, model: str, lengths: list[int], repeats: int, long_repeats: int = 2, long_docs: int = 8
) -> list[dict[str, Any]]:
    texts, labels = text_docs("news", "test")
    rows: list[dict[str, Any]] = []
    with httpx.Client(base_url=url, timeout=1800) as client:
        max_length = int(client.get(f"/v1/models/{model}").json()["max_length"])
        _post(client, model, ["warm up"])
        idle = _rss_kib(pid)
        for n in lengths:
            if n > max_length:
                rows.append({"bytes": n, "skipped": f"model {model} takes at most max_length={max_length} bytes"})
                print(rows[-1], flush=True)
                continue
            docs = [raw.decode("utf-8", "ignore") for raw, _ in make_composites(texts, labels, n, per_class=2)][:8]
            times = long_repeats if n > LONG else repeats
            many = docs[:long_docs] if n > LONG else docs  # each runs alone above the batch budget: k runs
            with peak_of(lambda: _rss_kib(pid), interval=0.01) as mem:
                one = [_post_batch(client, model, [docs[i % len(docs)]]) for i in range(times)]
                eight = [_post_batch(client, model, many) for _ in range(times)] if many else []
            rows.append(
                {
                    "bytes": n,
                    "repeats": times,
                    "batch1_ms": statistics.median(t for t, _, _ in one),
                    "batch1_server_inference_ms": statistics.median(s for _, s, _ in one) if one[0][1] else None,
                    "batch8_docs": len(many),
                    "batch8_ms": statistics.median(t for t, _, _ in eight) if eight else None,
                    "batch8_per_doc_ms": statistics.median(t for t, _, _ in eight) / len(many) if eight else None,
                    "batch8_largest_batch": max(b for _, _, b in eight) if eight else None,
                    "batch1_ms_per_kib": statistics.median(t for t, _, _ in one) / (n / 1024),
                    "peak_rss_above_idle_mib": (mem["peak"] - idle) / 1024,
                }
            )
            print(rows[-1], flush=True)
    return rows


def _repo_at(rev: str, model: str, root: Path) -> Path:
    """A model repository holding `model` as commit `rev` shipped it: its model.onnx and its config.json (a
    config of today may declare outputs, such as ood_score, that the older graph lacks)."""
    shutil.copytree(REPO / model, root / model)
    (root / model / "1" / "model.onnx").write_bytes(shipped_onnx_at(rev, model))
    config = subprocess.run(["git", "show", f"{rev}:{model_path_at(rev, model)}/config.json"], cwd=REPO.parent,
                            capture_output=True, check=True).stdout  # fmt: skip
    (root / model / "config.json").write_bytes(config)
    return root


def compare_attention(
    model: str, lengths: list[int], repeats: int, threads: int, before: str | None, before_attention: str = "body"
) -> dict[str, Any]:
    """Median latency per length of a body server and a fused server (and, with `before`, a server on the
    model that commit shipped, its attention run as `before_attention`), requests alternating between them
    so all see the same load. `--before REV --before-attention fused` times a retrained model against the
    one it replaced, both on today's code and kernel."""
    texts, labels = text_docs("news", "test")
    env = {"LARA_NUM_THREADS": str(threads), "LARA_MAX_QUEUE_DELAY_MS": "2", "LARA_REQUEST_TIMEOUT_S": "600"}
    servers = {"body": (REPO, "body"), "fused": (REPO, "fused")}
    with ExitStack() as stack:
        if before:
            tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="long-serving-")))
            servers["before"] = (_repo_at(before, model, tmp), before_attention)
        clients = {}
        for name, (repo, attention) in servers.items():
            server_env = env | {"LARA_MODEL_REPOSITORY": str(repo), "LARA_ORT_ATTENTION": attention}
            url = stack.enter_context(server_process(["--log-level", "warning"], env=server_env, timeout_s=180))
            clients[name] = stack.enter_context(httpx.Client(base_url=url, timeout=600))
            _post(clients[name], model, ["warm up"])
        kinds = list(clients)
        rows = []
        for n in lengths:
            docs = [raw.decode("utf-8", "ignore") for raw, _ in make_composites(texts, labels, n, per_class=2)][:8]
            times: dict[str, dict[str, list[float]]] = {k: {"batch1": [], "batch8": []} for k in kinds}
            for i in range(repeats):
                for k in kinds[i % len(kinds) :] + kinds[: i % len(kinds)]:  # rotate who goes first
                    times[k]["batch1"].append(_post(clients[k], model, [docs[i % len(docs)]])[0])
                    times[k]["batch8"].append(_post(clients[k], model, docs)[0])
            row: dict[str, Any] = {"bytes": n}
            for k in kinds:
                row |= {f"{k}_{b}_ms": statistics.median(v) for b, v in times[k].items()}
            for base in ("body", "before"):
                for b in ("batch1", "batch8") if base in kinds else ():
                    row[f"fused_over_{base}_{b}"] = row[f"fused_{b}_ms"] / row[f"{base}_{b}_ms"]
            rows.append(row)
            print(row, flush=True)
    return {"model": model, "server_threads": threads, "repeats": repeats, "before": before,
            "before_attention": before_attention if before else None, "rows": rows}  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="lara-text-news-bytes")
    p.add_argument("--lengths", default="1024,4096,16384,32768,65536,262144,1048576")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--long-repeats", type=int, default=2, help="repeats for lengths above 64 KB")
    p.add_argument(
        "--long-docs", type=int, default=8, help="documents in the multi-document request above 64 KB (0: none)"
    )
    p.add_argument(
        "--backend", choices=("onnxruntime", "torch"), default="onnxruntime", help="LARA_BACKEND of the server"
    )
    p.add_argument("--out-json", default="", help="result file name (default long_serving[_synthetic].json)")
    p.add_argument(
        "--synthetic",
        action="store_true",
        help="serve a synthetic text model of max_length 1 MiB (lara_serve.server.synthetic) instead of --model",
    )
    p.add_argument("--threads", type=int, default=2, help="LARA_NUM_THREADS of the server")
    p.add_argument("--compare-ort-attention", action="store_true", help="body vs fused LaraAttention servers")
    p.add_argument("--before", metavar="REV", help="with --compare-ort-attention: also the model of this commit")
    p.add_argument("--out-name", default="long_serving_ort_attention.json", help="with --compare-ort-attention")
    p.add_argument(
        "--before-attention", choices=("body", "fused"), default="body", help="how --before's server runs attention"
    )
    args = p.parse_args(argv)
    lengths = [int(x) for x in args.lengths.split(",")]
    if args.compare_ort_attention:
        result = compare_attention(args.model, lengths, args.repeats, args.threads, args.before, args.before_attention)
        path = write_json(args.out_name, {"environment": environment(), **result})
        kinds = [k for k in ("before", "body", "fused") if f"{k}_batch1_ms" in result["rows"][0]]
        headers = ["bytes"] + [f"{k} {b} (ms)" for b in ("1 doc", "8 docs") for k in kinds]
        headers += [f"fused/{k} {b}" for b in ("1 doc", "8 docs") for k in kinds if k != "fused"]
        table = [
            [r["bytes"]]
            + [r[f"{k}_{b}_ms"] for b in ("batch1", "batch8") for k in kinds]
            + [r[f"fused_over_{k}_{b}"] for b in ("batch1", "batch8") for k in kinds if k != "fused"]
            for r in result["rows"]
        ]
        print(markdown_table(headers, table))
        print(f"wrote {path}")
        return
    with ExitStack() as stack:
        repo, model = REPO, args.model
        if args.synthetic:
            from lara_serve.server.synthetic import make_text_model

            repo = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="long-serving-")))
            model = "synthetic-1mib"
            make_text_model(repo, model, max_length=1 << 20, hidden=64)
        env = {"LARA_MODEL_REPOSITORY": str(repo), "LARA_NUM_THREADS": str(args.threads), "LARA_BACKEND": args.backend,
               "LARA_MAX_QUEUE_DELAY_MS": "2", "LARA_REQUEST_TIMEOUT_S": "600"}  # fmt: skip
        url = stack.enter_context(server_process(["--log-level", "warning"], env=env, timeout_s=180))
        pid = _server_pid(int(url.rsplit(":", 1)[1]))
        rows = measure(url, pid, model, lengths, args.repeats, args.long_repeats, args.long_docs)
    by_len = {r["bytes"]: r for r in rows if "skipped" not in r}
    ratios = {}
    for long in (65536, 262144, 1048576):
        if 4096 in by_len and long in by_len:
            ratios[f"batch1_{long // 1024}k_over_4k"] = by_len[long]["batch1_ms"] / by_len[4096]["batch1_ms"]
            if by_len[long]["batch8_ms"] and by_len[4096]["batch8_ms"]:
                ratios[f"batch8_{long // 1024}k_over_4k"] = by_len[long]["batch8_ms"] / by_len[4096]["batch8_ms"]
    path = write_json(
        args.out_json or ("long_serving_synthetic.json" if args.synthetic else "long_serving.json"),
        {"environment": environment(), "model": model, "server_threads": args.threads, "backend": args.backend,
         "rows": rows,
         "ratios": ratios, "note": "client-side wall time on loopback; one server, default batching settings"
         + ("; a synthetic model (embedding + per-token MLP + mean): the serving path, not LARA" if args.synthetic
            else "")},
    )  # fmt: skip
    headers = ["bytes", "1 doc (ms)", "k docs", "k docs (ms)", "k docs, per doc (ms)", "largest batch of k",
               "peak RSS above idle (MiB)"]  # fmt: skip
    table = [
        [r["bytes"], r["batch1_ms"], r["batch8_docs"], r["batch8_ms"], r["batch8_per_doc_ms"],
         r["batch8_largest_batch"], r["peak_rss_above_idle_mib"]]
        if "skipped" not in r else [r["bytes"], r["skipped"], "", "", "", "", ""]
        for r in rows
    ]  # fmt: skip
    print(markdown_table(headers, table))
    print(f"ratios: {ratios}\nwrote {path}")


if __name__ == "__main__":
    main()
