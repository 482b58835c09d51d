"""DigitsImageDataset (digits as upsampled images) and the RandomAffineBatch augmentation."""

from __future__ import annotations

import pytest
import torch

from hat_ignite.data import DigitsDataset, DigitsImageDataset, RandomAffineBatch
from hat_ignite.registry import build_from_cfg


def test_images_are_the_digits_upsampled_with_the_same_split():
    small, big = DigitsDataset("train", as_image=True), DigitsImageDataset("train", size=16)
    assert big.images.shape == (len(small), 1, 16, 16) and torch.equal(big.labels, small.labels)
    assert 0.0 <= float(big.images.min()) and float(big.images.max()) <= 1.0
    # 2x2 average pooling of the bilinear 16x16 image gives back (a blurred) 8x8 image
    pooled = torch.nn.functional.avg_pool2d(big.images, 2).flatten(1)
    corr = torch.nn.functional.cosine_similarity(pooled - pooled.mean(1, keepdim=True), small.images.flatten(1) - small.images.flatten(1).mean(1, keepdim=True))
    assert corr.min() > 0.9
    assert set(DigitsImageDataset("val").indices).isdisjoint(DigitsImageDataset("train").indices)
    with pytest.raises(ValueError, match="size must be an int >= 8"):
        DigitsImageDataset(size=4)


def test_augmentation_is_deterministic_under_the_seed_and_differs_per_image():
    aug = build_from_cfg(dict(type="RandomAffineBatch", degrees=12, scale=(0.9, 1.1), translate=0.1))
    images = DigitsImageDataset("val", limit=8).images
    batch = {"img": images, "labels": torch.arange(8)}
    torch.manual_seed(3)
    first = aug(batch)["img"]
    torch.manual_seed(3)
    again = aug(batch)["img"]
    assert torch.equal(first, again)
    assert not torch.equal(aug(batch)["img"], first)  # the next draw differs
    same = RandomAffineBatch(degrees=0, scale=(1, 1), translate=0)(images)
    torch.testing.assert_close(same, images, rtol=0, atol=1e-5)
    moved = (first - images).abs().flatten(1).mean(1)
    assert (moved > 0).all() and first.shape == images.shape
    # a pure shift moves the ink: the centre of mass follows the translation
    shifted = RandomAffineBatch(degrees=0, scale=(1, 1), translate=0.2)(images)
    cols = torch.arange(16.0)
    com = lambda x: (x.sum(2) * cols).sum((1, 2)) / x.sum((1, 2, 3))  # noqa: E731
    assert (com(shifted) - com(images)).abs().max() > 0.2
    with pytest.raises(ValueError, match=r"expected \[B, C, H, W\]"):
        aug(torch.rand(3, 16, 16))
