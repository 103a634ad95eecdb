"""Issue 53: the attention-pool head of runs/minilm-attn (pretrained.classifier --readout attention) on holdout
articles with 0 / 10 / 20 KB of the trainer's filler, each 510-piece window read ALONE by the encoder, then one
pool over all pieces: does reading in windows keep filler out of the article's vectors? (research/README.md)

    python -m research.minilm_windows   # needs runs/minilm-attn/lara-news-minilm; about 4 minutes
"""

import json
import random

import torch

from lara_serve.model_export.models.hub import load_pretrained
from lara_serve.model_export.pretrained.classifier import in_holdout
from lara_serve.model_export.pretrained.teacher import WordPieces, pad_pieces
from lara_serve.model_export.training.augment import FillerBank, insert_filler
from lara_serve.model_export.training.data import load_news

torch.set_num_threads(2)
M = "runs/minilm-attn/lara-news-minilm"
clf = load_pretrained(M).eval()
tok = WordPieces.from_dir(__import__("pathlib").Path(M))
val = [d for d in load_news("train") if in_holdout(d.text)]
val = val[:: max(1, len(val) // 60)][:60]
bank, rng = FillerBank.installed(), random.Random(0)
res = {}
for kb in (0, 10, 20):
    ok_w = ok_whole = 0
    for d in val:
        raw = (
            d.text.encode()
            if kb == 0
            else insert_filler(d.text.encode(), bank.sample(rng, kb * 1024), rng.choice(["start", "end"]), rng)
        )
        body = tok.pieces(raw.decode("utf-8", "ignore"))
        wins = [tok.wrap(body[i : i + 510]) for i in range(0, len(body), 510)] or [tok.wrap([])]
        with torch.no_grad():
            x, m = pad_pieces(wins, tok.pad_id)
            h = clf.encoder(x, m)  # each window alone
            flat = h[m.bool()][None]
            fm = torch.ones(flat.shape[:2], dtype=torch.long)
            ok_w += int(clf.head(clf.pool(flat, fm)).argmax().item() == d.label)
    res[kb] = ok_w / len(val)
    print(kb, res[kb], flush=True)
json.dump(res, open("research/results/minilm_windows.json", "w"))
