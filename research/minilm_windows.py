"""Issue 53: does reading a long document in windows keep filler out of the article's vectors?

The attention-pool head of `runs/minilm-attn/lara-text-news` (built by `python -m
lara_serve.model_export.pretrained.classifier ... --readout attention`) on 60 holdout articles with 0 / 10 / 20 KB
of the trainer's filler before or after them; each 510-piece window is read ALONE by the encoder, then one pool
over all pieces. Read whole, the same head gets 41.7 / 26.7% at 10 / 20 KB (config.json of that build).

    python -m research.minilm_windows   # about 4 minutes on 2 cores
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from lara_serve.model_export.models.hub import load_pretrained
from lara_serve.model_export.pretrained.classifier import in_holdout
from lara_serve.model_export.pretrained.teacher import WordPieces, pad_pieces
from lara_serve.model_export.training.augment import FillerBank, insert_filler
from lara_serve.model_export.training.data import load_news

MODEL = Path("runs/minilm-attn/lara-text-news")
OUT = Path(__file__).parent / "results" / "minilm_windows.json"
WINDOW = 510  # pieces per window; [CLS] and [SEP] make the teacher's 512


@torch.no_grad()
def windowed_label(clf: torch.nn.Module, tok: WordPieces, text: str) -> int:
    body = tok.pieces(text)
    windows = [tok.wrap(body[i : i + WINDOW]) for i in range(0, len(body), WINDOW)] or [tok.wrap([])]
    x, mask = pad_pieces(windows, tok.pad_id)
    h = clf.encoder(x, mask)  # every window alone
    flat = h[mask.bool()][None]  # [1, pieces, D]
    return int(clf.head(clf.pool(flat, torch.ones(flat.shape[:2], dtype=torch.long))).argmax())


def main() -> dict[str, float]:
    torch.set_num_threads(2)
    clf, tok = load_pretrained(MODEL).eval(), WordPieces.from_dir(MODEL)
    val = [d for d in load_news("train") if in_holdout(d.text)]
    val = val[:: max(1, len(val) // 60)][:60]
    bank, rng = FillerBank.installed(), random.Random(0)
    res = {}
    for kb in (0, 10, 20):
        right = 0
        for d in val:
            raw = d.text.encode()
            if kb:
                raw = insert_filler(raw, bank.sample(rng, kb * 1024), rng.choice(["start", "end"]), rng)
            right += int(windowed_label(clf, tok, raw.decode("utf-8", "ignore")) == d.label)
        res[str(kb)] = round(right / len(val), 4)
        print(kb, res[str(kb)], flush=True)
    OUT.write_text(json.dumps({"command": "python -m research.minilm_windows", "n": len(val),
                               "accuracy_by_filler_kb": res}, indent=1))  # fmt: skip
    return res


if __name__ == "__main__":
    main()
