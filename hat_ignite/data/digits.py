"""The 8x8 handwritten digits that scikit-learn ships, as a PyTorch dataset.

1,797 grey-level images of the digits 0-9 (UCI "Optical Recognition of Handwritten Digits"),
read from the copy inside scikit-learn: nothing is downloaded. Small enough to train a classifier
to more than 95 % validation accuracy in seconds on a CPU, which makes it the dataset of the
shipped configs and of the end-to-end tests.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset

__all__ = ["DigitsDataset"]

_SPLITS = ("train", "val", "all")


@functools.lru_cache(maxsize=1)
def _load() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import load_digits  # scikit-learn is only needed for this dataset

    digits = load_digits()
    return digits.data.astype(np.float32) / 16.0, digits.target.astype(np.int64)


class DigitsDataset(Dataset):
    """scikit-learn's 8x8 digits with a deterministic, stratified train/val split.

    Each item is a dict ``{"img": FloatTensor, "labels": LongTensor}``: ``img`` holds the 64 pixels
    scaled to ``[0, 1]`` (shape ``[64]``, or ``[1, 8, 8]`` with ``as_image=True``) and ``labels``
    the digit as a 0-d tensor. PyTorch's default collate turns a list of items into a dict batch
    ``{"img": [B, 64], "labels": [B]}``, which a batch processor passes whole to the model.

    Args:
        split: ``"train"``, ``"val"`` or ``"all"`` (every image, in scikit-learn's order).
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
            from sklearn.model_selection import train_test_split

            train_idx, val_idx = train_test_split(
                index, test_size=val_ratio, random_state=seed, stratify=labels
            )
            index = np.sort(train_idx if split == "train" else val_idx)
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
