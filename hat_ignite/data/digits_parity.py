"""Digit parity: a second task on the same 8x8 digits, for the shipped multitask config."""

from __future__ import annotations

from hat_ignite.data.digits import DigitsDataset

__all__ = ["DigitsParityDataset"]


class DigitsParityDataset(DigitsDataset):
    """:class:`DigitsDataset` whose label is the digit's parity: 0 for even, 1 for odd.

    Same images, splits and arguments as :class:`DigitsDataset`; only ``labels`` change, so the
    parity task can have its own loader (its own shuffling and batch size) next to the digit
    classification task.

    Example:
        >>> digits, parity = DigitsDataset("val"), DigitsParityDataset("val")
        >>> bool((parity.labels == digits.labels % 2).all()), sorted(parity.labels.unique().tolist())
        (True, [0, 1])
    """

    def __init__(self, split: str = "train", val_ratio: float = 0.2, seed: int = 0, as_image: bool = False) -> None:
        super().__init__(split=split, val_ratio=val_ratio, seed=seed, as_image=as_image)
        self.labels = self.labels % 2

    def __repr__(self) -> str:
        return "DigitsParityDataset" + super().__repr__()[len("DigitsDataset"):]
