"""The digits ship inside the package: scikit-learn's images and splits, without scikit-learn."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, time_limit
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split

from hat_ignite.data import DigitsDataset
from hat_ignite.data.digits import _load, stratified_split


def test_the_shipped_images_and_labels_are_scikit_learns():
    images, labels = _load()
    digits = load_digits()
    assert images.dtype == np.float32 and labels.dtype == np.int64
    assert np.array_equal(images, digits.data.astype(np.float32) / 16.0)  # the values the datasets always had
    assert np.array_equal(labels, digits.target)


@pytest.mark.parametrize("val_ratio", [0.2, 0.1, 0.25, 0.5, 0.013, 0.9])
def test_the_split_is_scikit_learns_stratified_split(val_ratio):
    """The split scikit-learn's train_test_split(stratify=...) made: same configs, same figures."""
    _, labels = _load()
    for seed in range(6):
        expected = train_test_split(np.arange(len(labels)), test_size=val_ratio, random_state=seed, stratify=labels)
        got = stratified_split(labels, val_ratio, seed)
        assert [a.tolist() for a in got] == [np.sort(e).tolist() for e in expected], (val_ratio, seed)


def test_the_split_matches_on_uneven_classes_with_ties():
    """Class sizes whose shares tie on the remainder make the split draw among them."""
    rng = np.random.RandomState(7)
    for trial in range(20):
        labels = rng.randint(0, rng.randint(2, 7), size=rng.randint(30, 90))
        labels = np.concatenate([labels, np.unique(labels)])  # every class at least twice
        val_ratio = float(rng.choice([0.2, 0.3, 0.45]))
        expected = train_test_split(np.arange(len(labels)), test_size=val_ratio, random_state=trial, stratify=labels)
        got = stratified_split(labels, val_ratio, trial)
        assert [a.tolist() for a in got] == [np.sort(e).tolist() for e in expected], trial


def test_a_split_too_small_for_every_class_is_an_error():
    with pytest.raises(ValueError, match=r"cannot be split 1796/1 with every class in both parts; choose another"):
        DigitsDataset("val", val_ratio=0.0005)


def test_the_dataset_needs_neither_scikit_learn_nor_scipy():
    code = ("import sys; from hat_ignite.data import DigitsDataset; d = DigitsDataset('train'); "
            "print(len(d), 'sklearn' in sys.modules, 'scipy' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=time_limit(120), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["1437", "False", "False"]
