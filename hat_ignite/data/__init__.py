"""Small real datasets for the shipped configs and the tests (nothing is downloaded)."""

from hat_ignite.data.digits import DigitsDataset

__all__ = ["DigitsDataset"]
