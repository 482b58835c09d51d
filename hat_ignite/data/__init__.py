"""Small real datasets for the shipped configs and the tests (nothing is downloaded)."""

from hat_ignite.data.digits import DigitsDataset
from hat_ignite.data.digits_image import DigitsImageDataset, RandomAffineBatch
from hat_ignite.data.digits_parity import DigitsParityDataset
from hat_ignite.data.multitask import MultitaskLoader

__all__ = ["DigitsDataset", "DigitsImageDataset", "RandomAffineBatch", "DigitsParityDataset", "MultitaskLoader"]
