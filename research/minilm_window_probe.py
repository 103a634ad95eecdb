"""Issue 53: a probe fitted on windows, for the pool's window gate: which 510-piece windows carry the article?

research/minilm_window_gate.py asked the serving head's outlier probe about each window. It wins back filler
(20 KB: 61.7 -> 93.3% on the holdout) but loses forms: the probe was fitted on whole documents, so a
window of a real article can look odd to it (g > 0 on 5% of holdout article windows) while a short tail window
of figures or a footer looks like news (a whole article with a table is in distribution), and the gate then
hands the vote to the tail (holdout: article + table 98.3 -> 94.9%).

Here a linear probe is fitted on window means instead: windows of BBC train articles (the fit side of the
build's holdout rule; whole, and wrapped as a web page, e-mail, JSON record or Markdown) against windows that
carry no article: the trainer's own filler (`robust_head.filler_passages`: logs, code, markup, translated
manual pages, Brown's religion, hobbies, lore and learned prose), SpamAssassin bodies of its train side, and
tables of made-up figures alone (`wrappers.with_table`'s rows): `pretrained.window_gate`'s probe. C by the holdout counts of
research/minilm_window_gate.py's cases (holdout articles with 10 / 20 KB of English manual pages and Brown's
belles-lettres and government documents, which neither probe trains on; holdout articles in long forms), then
the gate's strength the same way. Float graph (PyTorch).

    python -m research.minilm_window_probe [--docs 60] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from lara_serve.model_export.models.bert import mean_pool
from lara_serve.model_export.models.hub import load_pretrained
from lara_serve.model_export.pretrained.teacher import WordPieces
from lara_serve.model_export.pretrained.window_gate import fit_window_probe, training_windows, windows
from research.minilm_window_gate import MODEL, tally

OUT = Path(__file__).parent / "results" / "minilm_window_probe.json"
FEATURES = Path("runs") / "window_probe_features.pt"
C_GRID = (0.1, 1.0, 10.0)
STRENGTHS = (2.0, 4.0, 8.0, 16.0)
HINGE, MARGINS = (1.0, 2.0, 4.0), (0.0, 1.0, 2.0)


def cached_windows(model: torch.nn.Module, tok: WordPieces) -> dict[str, torch.Tensor]:
    """window_gate.training_windows, kept in runs/ between runs of this script."""
    if not FEATURES.exists():
        FEATURES.parent.mkdir(exist_ok=True)
        torch.save(training_windows(model, tok), FEATURES)
    return torch.load(FEATURES)


Gate = tuple[torch.Tensor, torch.Tensor, float, float | None]


def gate_bias(g: torch.Tensor, strength: float, margin: float | None) -> torch.Tensor:
    """margin None: strength x log sigmoid(-g) (every window moves, by how article-like it looks); a margin m:
    -strength x max(0, g - m) (windows the probe calls articles, g <= m, all keep their weight; the rest lose
    weight in proportion to how far past m they are)."""
    if margin is None:
        return strength * F.logsigmoid(-g)
    return -strength * torch.relu(g - margin)


@torch.inference_mode()
def labels_by_gate(serving: torch.nn.Module, tok: WordPieces, text: str, gates: dict[str, Gate]) -> dict[str, int]:
    """gate name -> (probe weight, bias, strength, margin): the head's label with the pool's score of window j's
    pieces lowered by gate_bias(g_j), g_j the probe's logit on window j's mean."""
    model = serving.model
    x, rows = windows(model, tok, text)
    live = rows.sum(1) > 0
    s = model.pool.score(x).squeeze(-1)  # [J, W+2]
    means = mean_pool(x, rows)  # [J, D]
    out = {}
    for name, (w, b, strength, margin) in gates.items():
        bias = gate_bias(means @ w + b, strength, margin).where(live, torch.zeros(()))
        t = (s + bias[:, None]).masked_fill(rows == 0, torch.finfo(s.dtype).min).reshape(-1)
        read = F.normalize(torch.softmax(t, -1) @ x.reshape(-1, x.shape[-1]), dim=-1)
        out[name] = int(model.head(read[None]).argmax())
    return out


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--docs", type=int, default=60)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    t0 = time.time()
    serving, tok = load_pretrained(MODEL, serving=True).eval(), WordPieces.from_dir(MODEL)
    feats = cached_windows(serving.model, tok)
    probes = {c: fit_window_probe(feats, c) for c in C_GRID}
    gates: dict[str, Gate] = {"none": (torch.zeros(feats["article"].shape[1]), torch.zeros(1), 0.0, None),
             "served probe:8": (serving.probe.weight.detach(), serving.probe.bias.detach(), 8.0, None)}  # fmt: skip
    gates |= {f"C={c:g}:{s:g}": (*probes[c], s, None) for c in C_GRID for s in STRENGTHS}
    gates |= {f"C={c:g}:{s:g}>{m:g}": (*probes[c], s, m) for c in C_GRID for s in HINGE for m in MARGINS}
    # the same cases, in the same order and draws, as research/minilm_window_gate.py
    right, counts = tally(lambda text: labels_by_gate(serving, tok, text, gates), args.docs)
    total = {g: sum(right[c][g] for c in right) for g in gates}
    result = {
        "command": "python -m research.minilm_window_probe",
        "model": str(MODEL),
        "training_windows": {k: len(v) for k, v in feats.items()},
        "n": counts,
        "right": right,
        "total_right": total,
        "accuracy": {c: {g: round(r / counts[c], 4) for g, r in row.items()} for c, row in right.items()},
        "seconds": round(time.time() - t0, 1),
    }
    OUT.write_text(json.dumps(result, indent=1) + "\n")
    for c, row in result["accuracy"].items():
        print(f"{c:18s}", " ".join(f"{g}={v:.3f}" for g, v in row.items()))
    print("total", total)
    return result


if __name__ == "__main__":
    main()
