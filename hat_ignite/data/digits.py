"""The 8x8 handwritten digits, shipped with hat-ignite, as a PyTorch dataset.

1,797 grey-level images of the digits 0-9: the test set of the UCI "Optical Recognition of
Handwritten Digits" data (E. Alpaydin, C. Kaynak, 1998), the same images in the same order as
scikit-learn's ``load_digits``. They ship inside the package (``digits.npz``, 45 KB, with its
attribution in ``DIGITS_LICENSE.txt``): nothing is downloaded and no other package is needed.
Small enough to train a classifier to more than 95 % validation accuracy in seconds on a CPU,
which makes it the dataset of the shipped configs and of the end-to-end tests.
"""

from __future__ import annotations

import functools
import math
import os
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

__all__ = ["DigitsDataset", "stratified_split"]

_SPLITS = ("train", "val", "all")
_DATA = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digits.npz")


@functools.lru_cache(maxsize=1)
def _load() -> tuple[np.ndarray, np.ndarray]:
    """The pixels scaled to ``[0, 1]`` (float32 ``[1797, 64]``) and the labels (int64 ``[1797]``)."""
    with np.load(_DATA, allow_pickle=False) as data:
        return data["images"].astype(np.float32) / 16.0, data["labels"].astype(np.int64)


def _shares(counts: np.ndarray, n_draws: int, rng: np.random.RandomState) -> np.ndarray:
    """How many of ``n_draws`` items each class gets: its proportional share rounded down, then one
    more for the classes with the largest remainders (ties drawn at random) until the sum is reached."""
    exact = counts / counts.sum() * n_draws
    shares = np.floor(exact)
    missing = int(n_draws - shares.sum())
    remainder = exact - shares
    for value in np.sort(np.unique(remainder))[::-1]:
        if missing <= 0:
            break
        (tied,) = np.where(remainder == value)
        take = min(len(tied), missing)
        shares[rng.choice(tied, size=take, replace=False)] += 1
        missing -= take
    return shares.astype(int)


def stratified_split(labels: np.ndarray, val_ratio: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A seeded split of ``range(len(labels))`` keeping each class's share in both parts.

    The validation part has ``ceil(val_ratio * n)`` items. The split is the one scikit-learn's
    ``train_test_split(..., test_size=val_ratio, random_state=seed, stratify=labels)`` makes (the
    same draws from ``numpy.random.RandomState(seed)``), so the shipped configs' splits, and the
    figures measured on them, are those of the versions that used scikit-learn for it.

    Returns:
        The train and the validation indices, each sorted.

    Raises:
        ValueError: a class has fewer than two items, or a part would have fewer items than there
            are classes.

    >>> labels = np.array([0, 0, 0, 0, 1, 1, 1, 1, 1, 1])
    >>> train, val = stratified_split(labels, 0.4, seed=0)
    >>> train.tolist(), val.tolist(), np.bincount(labels[val]).tolist()
    ([2, 3, 4, 5, 6, 8], [0, 1, 7, 9], [2, 2])
    """
    n = len(labels)
    n_val = math.ceil(val_ratio * n)
    n_train = n - n_val
    classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
    if counts.min() < 2 or min(n_train, n_val) < len(classes):
        raise ValueError(
            f"stratified_split: {n} items in {len(classes)} classes (the smallest has {counts.min()}) cannot be "
            f"split {n_train}/{n_val} with every class in both parts; choose another val_ratio."
        )
    members = np.split(np.argsort(inverse, kind="stable"), np.cumsum(counts)[:-1])
    rng = np.random.RandomState(seed)
    train_shares = _shares(counts, n_train, rng)
    val_shares = _shares(counts - train_shares, n_val, rng)
    train: list[np.ndarray] = []
    val: list[np.ndarray] = []
    for k, items in enumerate(members):
        shuffled = items[rng.permutation(counts[k])]
        train.append(shuffled[: train_shares[k]])
        val.append(shuffled[train_shares[k]: train_shares[k] + val_shares[k]])
    return np.sort(np.concatenate(train)), np.sort(np.concatenate(val))


class DigitsDataset(Dataset):
    """The shipped 8x8 digits with a deterministic, stratified train/val split.

    Each item is a dict ``{"img": FloatTensor, "labels": LongTensor}``: ``img`` holds the 64 pixels
    scaled to ``[0, 1]`` (shape ``[64]``, or ``[1, 8, 8]`` with ``as_image=True``) and ``labels``
    the digit as a 0-d tensor. PyTorch's default collate turns a list of items into a dict batch
    ``{"img": [B, 64], "labels": [B]}``, which a batch processor passes whole to the model.

    Args:
        split: ``"train"``, ``"val"`` or ``"all"`` (every image, in the data's order).
        val_ratio: fraction of the images held out for ``"val"``, in ``(0, 1)``.
        seed: seed of the split; the same ``(val_ratio, seed)`` always gives the same split, and
            ``"train"`` and ``"val"`` never share an image.
        as_image: return images as ``[1, 8, 8]`` instead of flat ``[64]`` vectors.

    Example:
        >>> train, val = DigitsDataset("train"), DigitsDataset("val")
        >>> len(train), len(val)
        (1437, 360)
        >>> item = train[0]
        >>> item["img"].shape, item["img"].dtype, item["labels"].dtype
        (torch.Size([64]), torch.float32, torch.int64)
        >>> 0.0 <= float(item["img"].min()) and float(item["img"].max()) <= 1.0
        True
        >>> DigitsDataset("val", as_image=True)[0]["img"].shape
        torch.Size([1, 8, 8])
    """

    def __init__(self, split: str = "train", val_ratio: float = 0.2, seed: int = 0, as_image: bool = False) -> None:
        if split not in _SPLITS:
            raise ValueError(f"DigitsDataset: split must be one of {', '.join(_SPLITS)}, got {split!r}.")
        if not (isinstance(val_ratio, (int, float)) and 0.0 < val_ratio < 1.0):
            raise ValueError(f"DigitsDataset: val_ratio must be a number in (0, 1), got {val_ratio!r}.")
        images, labels = _load()
        index = np.arange(len(labels))
        if split != "all":
            train_idx, val_idx = stratified_split(labels, val_ratio, seed)
            index = train_idx if split == "train" else val_idx
        self.split = split
        self.val_ratio = val_ratio
        self.seed = seed
        self.as_image = as_image
        self.indices = index
        img = torch.from_numpy(images[index])
        self.images = img.view(-1, 1, 8, 8) if as_image else img
        self.labels = torch.from_numpy(labels[index])

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"img": self.images[i], "labels": self.labels[i]}

    def __repr__(self) -> str:
        return f"DigitsDataset(split={self.split!r}, size={len(self)}, val_ratio={self.val_ratio}, seed={self.seed})"
