"""Issue 53: should `lara train`'s frozen encoder read a long document whole or in 510-piece windows?

`lara train --init lara-text-news` fits its head on each document's mean embedding. Read whole in one LARA
pass, the student agrees with the teacher (read in 512-piece windows, the mean of their embeddings) at cosine
0.878 at 2,048 pieces and 0.853 at 8,192 (docs/pretrained-encoder.md); its conversion was trained on 256-512-piece
windows only. This measures the other reading the served model already has (config `window`: each 510 pieces
their own [CLS] ... [SEP], one mean over all windows' vectors, `LaraBertClassifier.forward_pooled`) on the same
held-out texts (Brown test + held-out SOTU, never trained on by the conversion or by any head).

    python -m research.minilm_window_fidelity   # about 6 minutes on one thread
"""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import torch

from lara_serve.model_export.models.bert_lara import LaraBertClassifier
from lara_serve.model_export.models.hub import load_pretrained
from lara_serve.model_export.pretrained.fidelity import heldout_pieces, teacher_reference
from lara_serve.model_export.pretrained.teacher import load_teacher, pad_pieces

MODEL = Path("model_repository/lara-text-news")
OUT = Path(__file__).parent / "results" / "minilm_window_fidelity.json"
LENGTHS = (512, 2048, 8192)
WINDOW = 510


def reader(base: LaraBertClassifier, window: int) -> LaraBertClassifier:
    """The shipped encoder read whole (window 0) or in windows, to the masked mean (forward_pooled)."""
    cfg = dataclasses.replace(base.cfg, readout="mean", window=window, window_gate=0.0)
    model = LaraBertClassifier(cfg)
    model.encoder.load_state_dict(base.encoder.state_dict(), strict=True)
    return model.eval()


@torch.inference_mode()
def pooled(model: LaraBertClassifier, tok, docs: list[list[int]]) -> torch.Tensor:
    out = []
    for d in docs:  # one at a time: lengths differ, and a document's embedding does not depend on its batch
        ids, mask = pad_pieces([tok.wrap(d)], tok.pad_id)
        out.append(model.forward_pooled(model.forward_features(ids, mask), mask)[0])
    return torch.stack(out)


def main() -> dict[str, dict[str, float]]:
    torch.set_num_threads(1)
    teacher, tok = load_teacher()
    base = load_pretrained(MODEL)
    readers = {"whole": reader(base, 0), "windows": reader(base, WINDOW)}
    docs = heldout_pieces(tok)
    result: dict[str, dict[str, float]] = {}
    for n in LENGTHS:
        cut = [d[: n - 2] for d in docs if len(d) >= n - 2]
        ref = teacher_reference(teacher, tok, cut, batch=8)
        row: dict[str, float] = {"docs": len(cut)}
        for name, model in readers.items():
            t0 = time.perf_counter()
            cos = (ref * pooled(model, tok, cut)).sum(-1)
            row |= {
                f"{name}_mean_cosine": round(cos.mean().item(), 4),
                f"{name}_min_cosine": round(cos.min().item(), 4),
            }
            row[f"{name}_s"] = round(time.perf_counter() - t0, 1)
        result[str(n)] = row
        print(n, row, flush=True)
    OUT.write_text(json.dumps({"model": str(MODEL), "window": WINDOW, "lengths": result}, indent=1) + "\n")
    return result


if __name__ == "__main__":
    main()
