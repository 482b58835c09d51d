"""Small real datasets for the shipped configs and the tests (nothing is downloaded)."""

from typing import TYPE_CHECKING

from hat_ignite.lazy import lazy_attributes

# each name is imported from its module when first used (hat_ignite.lazy)
_EXPORTS = {
    "hat_ignite.data.digits": ["DigitsDataset"],
    "hat_ignite.data.digits_image": ["DigitsImageDataset", "RandomAffineBatch"],
    "hat_ignite.data.digits_parity": ["DigitsParityDataset"],
    "hat_ignite.data.multitask": ["MultitaskLoader"],
}

__all__ = ["DigitsDataset", "DigitsImageDataset", "RandomAffineBatch", "DigitsParityDataset", "MultitaskLoader"]

__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from hat_ignite.data.digits import DigitsDataset
    from hat_ignite.data.digits_image import DigitsImageDataset, RandomAffineBatch
    from hat_ignite.data.digits_parity import DigitsParityDataset
    from hat_ignite.data.multitask import MultitaskLoader
