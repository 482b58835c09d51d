"""The digits as upsampled single-channel images, and a random-affine batch augmentation.

:class:`DigitsImageDataset` gives the shipped 8x8 digits resized (bilinear) to ``size x size``
images ``[1, size, size]``, with :class:`~hat_ignite.data.digits.DigitsDataset`'s deterministic
stratified split. :class:`RandomAffineBatch` augments a whole batch on its device (one random
rotation, scale and shift per image), for a training batch processor's ``batch_transforms``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch
from torch.nn import functional as F

from hat_ignite.data.digits import DigitsDataset

__all__ = ["DigitsImageDataset", "RandomAffineBatch"]


class DigitsImageDataset(DigitsDataset):
    """:class:`DigitsDataset` as ``[1, size, size]`` images (bilinear upsampling of the 8x8 pixels).

    Same splits and labels as :class:`DigitsDataset`; pixel values stay in ``[0, 1]``.

    Args:
        split: ``"train"``, ``"val"`` or ``"all"``.
        val_ratio: fraction of the images held out for ``"val"``.
        seed: seed of the split.
        size: side of the square images (at least 8).
        limit: keep only the first ``limit`` images of the split (``None``: all), for short runs.

    Example:
        >>> val = DigitsImageDataset("val", size=16)
        >>> len(val), tuple(val[0]["img"].shape)
        (360, (1, 16, 16))
        >>> bool((val.labels == DigitsDataset("val").labels).all())
        True
        >>> len(DigitsImageDataset("val", limit=50))
        50
    """

    def __init__(
        self, split: str = "train", val_ratio: float = 0.2, seed: int = 0, size: int = 16, limit: int | None = None
    ) -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 8:
            raise ValueError(f"DigitsImageDataset: size must be an int >= 8 (the digits are 8x8), got {size!r}.")
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
            raise ValueError(f"DigitsImageDataset: limit must be a positive int or None, got {limit!r}.")
        super().__init__(split=split, val_ratio=val_ratio, seed=seed, as_image=True)
        images = self.images
        if size != 8:
            images = F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False).clamp_(0.0, 1.0)
        if limit is not None:
            images, self.labels, self.indices = images[:limit], self.labels[:limit], self.indices[:limit]
        self.images = images.contiguous()
        self.size = size

    def __repr__(self) -> str:
        return (
            f"DigitsImageDataset(split={self.split!r}, size={len(self)}, image_size={self.size}, "
            f"val_ratio={self.val_ratio}, seed={self.seed})"
        )


class RandomAffineBatch:
    """Randomly rotate, scale and shift every image of a batch (a ``batch_transforms`` entry).

    Each image gets its own affine map drawn uniformly from the ranges; the batch is resampled
    with ``grid_sample`` (bilinear, zeros outside) on the batch's device, without any host-device
    synchronisation. Draws come from torch's global generator (on the batch's device), so a run
    seeded by the config's ``seed`` augments identically each time. Use it in the training batch
    processor only; validation sees the images as they are.

    Args:
        key: key of the ``[B, C, H, W]`` images in a dict batch (a tensor batch is transformed whole;
            a list/tuple batch has its first element transformed).
        degrees: largest rotation, in degrees, either way.
        scale: ``(low, high)`` range of the zoom factor.
        translate: largest shift, as a fraction of the image side, either way.

    Example:
        >>> _ = torch.manual_seed(0)
        >>> aug = RandomAffineBatch(degrees=10, scale=(0.9, 1.1), translate=0.1)
        >>> batch = {"img": torch.rand(4, 1, 16, 16), "labels": torch.arange(4)}
        >>> out = aug(batch)
        >>> tuple(out["img"].shape), bool((out["labels"] == batch["labels"]).all())
        ((4, 1, 16, 16), True)
        >>> same = RandomAffineBatch(degrees=0, scale=(1.0, 1.0), translate=0.0)(batch)
        >>> torch.allclose(same["img"], batch["img"], atol=1e-5)
        True
    """

    def __init__(
        self, key: str = "img", degrees: float = 10.0, scale: tuple[float, float] = (0.9, 1.1), translate: float = 0.1
    ) -> None:
        low, high = (float(v) for v in scale)
        if not 0 < low <= high:
            raise ValueError(f"RandomAffineBatch: scale must be (low, high) with 0 < low <= high, got {scale!r}.")
        if degrees < 0 or not 0 <= translate < 1:
            raise ValueError(
                f"RandomAffineBatch: degrees must be >= 0 and translate in [0, 1), got degrees={degrees!r}, "
                f"translate={translate!r}."
            )
        self.key = key
        self.degrees = float(degrees)
        self.scale = (low, high)
        self.translate = float(translate)

    def _augment(self, img: torch.Tensor) -> torch.Tensor:
        if img.dim() != 4:
            raise ValueError(f"RandomAffineBatch: expected [B, C, H, W] images, got shape {tuple(img.shape)}.")
        n, dev = img.shape[0], img.device
        draws = torch.rand(n, 4, device=dev, dtype=img.dtype) * 2 - 1  # uniform in [-1, 1)
        angle = draws[:, 0] * math.radians(self.degrees)
        low, high = self.scale
        zoom = low + (draws[:, 1] + 1) * 0.5 * (high - low)
        # affine_grid maps output coordinates to input ones: the inverse of the zoom
        cos, sin = torch.cos(angle) / zoom, torch.sin(angle) / zoom
        shift = draws[:, 2:] * (2 * self.translate)  # normalised coordinates span 2
        theta = torch.stack([torch.stack([cos, -sin, shift[:, 0]], 1), torch.stack([sin, cos, shift[:, 1]], 1)], 1)
        grid = F.affine_grid(theta, list(img.shape), align_corners=False)
        return F.grid_sample(img, grid, mode="bilinear", padding_mode="zeros", align_corners=False)

    def __call__(self, batch: Any) -> Any:
        if isinstance(batch, torch.Tensor):
            return self._augment(batch)
        if isinstance(batch, Mapping):
            if self.key not in batch:
                raise KeyError(f"RandomAffineBatch: the batch has no {self.key!r} key (keys: {sorted(batch)}); set key=.")
            out = dict(batch)
            out[self.key] = self._augment(batch[self.key])
            return out
        if isinstance(batch, (list, tuple)) and batch:
            return type(batch)([self._augment(batch[0]), *batch[1:]])
        raise TypeError(f"RandomAffineBatch: cannot augment a {type(batch).__name__} batch; give a dict, tensor or tuple.")

    def __repr__(self) -> str:
        return (
            f"RandomAffineBatch(key={self.key!r}, degrees={self.degrees}, scale={self.scale}, "
            f"translate={self.translate})"
        )
