"""Which combination of the feature (Mahalanobis) and input (byte bigram) ood scores, chosen on VALIDATION
sets only: the BBC holdout ("val", in distribution) against out-of-domain text the evaluation suite never
uses: Brown "learned" texts (English of another kind), Python standard-library source, word salad and
made-up-language prose from the training filler bank (lara_serve.model_export.training.augment), cut to news-like lengths.

    python -m research.ood_combination [--model model_repository/lara-text-news-bytes] [--n 30]

Rules compared, each with the scales of the shipped head (95% holdout quantiles q_m, q_s) and medians:
max(m/q_m, s/q_s) (shipped first), the sum m/q_m + s/q_s, the max of median-centred scores
(x - median) / (q95 - median), and m/q_m plus a hinge max(0, (s - q_s) / (q_s - median_s)) that leaves the
feature score alone unless the input is less likely than 95% of the holdout. Writes research/results/ood_combination.json.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

import numpy as np
import torch
from sklearn.metrics import roc_auc_score

from lara_serve.model_export.models.hub import load_pretrained
from lara_serve.model_export.models.ood import pooled_features
from lara_serve.model_export.training.augment import FillerBank
from lara_serve.model_export.training.brown import load_brown
from lara_serve.model_export.training.tasks import text_docs

OUT = Path(__file__).resolve().parent / "results" / "ood_combination.json"


@torch.inference_mode()
def components(serving: torch.nn.Module, docs: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    m, s = [], []
    for d in docs:
        ids = torch.frombuffer(bytearray(d), dtype=torch.uint8).long()[None] + 1
        mask = torch.ones_like(ids)
        f = pooled_features(serving.model, {"input_ids": ids, "attention_mask": mask})
        m.append(float(serving.ood(f)[0]))
        s.append(float(serving.input_score(ids, mask)[0]))
    return np.array(m), np.array(s)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", type=Path, default=Path("model_repository/lara-text-news-bytes"))
    p.add_argument("--n", type=int, default=30)
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    serving = load_pretrained(args.model, serving=True)
    val = [t.encode()[: serving.cfg.max_length] for t in text_docs("news", "val")[0]]
    rng = random.Random(0)
    sizes = [len(rng.choice(val)) for _ in range(args.n)]
    learned = [d.text.encode() for s in ("train", "test") for d in load_brown(s) if d.label == 2]
    bank = FillerBank.installed()
    sets = {
        "brown_learned": [learned[i % len(learned)][:k] for i, k in enumerate(sizes)],
        "python_source": [bank.sample(random.Random(f"c{i}"), k, "code") for i, k in enumerate(sizes)],
        "word_salad": [bank.sample(random.Random(f"w{i}"), k, "salad") for i, k in enumerate(sizes)],
        "pseudo_language": [bank.sample(random.Random(f"p{i}"), k, "pseudo") for i, k in enumerate(sizes)],
    }
    m_in, s_in = components(serving, val)
    q_m, q_s = (float(v) for v in serving.ood_scales[:2])  # (q_m, q_s[, median_s]) of the head
    med_m, med_s = float(np.median(m_in)), float(np.median(s_in))
    rules = {
        "max(m/q_m, s/q_s)": lambda m, s: np.maximum(m / q_m, s / q_s),
        "m/q_m + s/q_s": lambda m, s: m / q_m + s / q_s,
        "max of median-centred": lambda m, s: np.maximum((m - med_m) / (q_m - med_m), (s - med_s) / (q_s - med_s)),
        "m/q_m + hinge": lambda m, s: m / q_m + np.maximum(0.0, (s - q_s) / (q_s - med_s)),
        "m alone": lambda m, s: m,
        "s alone": lambda m, s: s,
    }
    table: dict[str, dict[str, float]] = {r: {} for r in rules}
    for name, docs in sets.items():
        m_o, s_o = components(serving, docs)
        y = np.r_[np.zeros(len(m_in)), np.ones(len(m_o))]
        for r, f in rules.items():
            table[r][name] = round(float(roc_auc_score(y, np.r_[f(m_in, s_in), f(m_o, s_o)])), 4)
    for r in table:
        table[r]["worst"] = min(table[r].values())
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(
        json.dumps({"model": str(args.model), "n_in": len(val), "n_ood": args.n, "auroc": table}, indent=2) + "\n"
    )
    for r, row in table.items():
        print(f"{r:24s} " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()))


if __name__ == "__main__":
    main()
