"""Exact resume: the random generators and where a loop's data stream stands.

A bitwise-exact resume needs three things besides weights and optimizer state:

1. the python / numpy / torch generator states at the save point (:func:`rng_state`, stored as
   tensors and numbers so the checkpoint loads with ``torch.load(weights_only=True)``);
2. the generator states at the moment the running epoch's data iterator was created (they fix
   the shuffle order and the loader's worker base seed);
3. how many steps of that epoch are done.

:class:`ResumableData` is the iterable the loop hands to Ignite's ``run()``. It records (2) at
each epoch start and, on a resume, re-creates the epoch's iterator from those states and moves
it to the saved position. For a map-style ``torch.utils.data.DataLoader`` the position is
reached by skipping index lists in the batch sampler, so no skipped sample is loaded; any other
iterable is advanced by fetching and dropping batches.

With ``num_workers > 0`` a worker's generators advance with every sample it loads, so a batch's
random augmentation would depend on which batches the worker loaded before. The loop therefore
seeds the worker's generators before each batch from the epoch (a digest of the epoch-start
generator state) and the batch's position in the epoch: a batch gets the same augmentation in
a straight run and in a resumed one, whichever worker loads it. In the main process
(``num_workers=0``) nothing is reseeded: the generators restored from the checkpoint continue
the stream exactly.

>>> import torch
>>> loader = torch.utils.data.DataLoader(list(range(6)), batch_size=2, shuffle=True)
>>> data = ResumableData(loader)
>>> _ = torch.manual_seed(0)
>>> straight = [b.tolist() for b in data]
>>> saved = data.epoch_generators        # what a checkpoint taken in this epoch stores
>>> data.resume_at(2, saved)            # a new run: skip the two batches done
>>> [b.tolist() for b in data] == straight[2:]
True
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import logging
import random
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

__all__ = ["rng_state", "set_rng_state", "ResumableData"]

logger = logging.getLogger(__name__)


# -- random generators -----------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """The python, numpy, torch (and initialised CUDA) generator states, as tensors and numbers.

    Unlike the raw states (numpy's is a tuple holding an ndarray), the result loads with
    ``torch.load(weights_only=True)``.

    >>> saved = rng_state()
    >>> first = torch.rand(1)
    >>> set_rng_state(saved)
    ['python', 'numpy', 'torch']
    >>> bool(torch.rand(1) == first)
    True
    """
    py_version, py_internal, py_gauss = random.getstate()
    np_name, np_keys, np_pos, np_has_gauss, np_cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {
            "version": int(py_version),
            "state": torch.tensor(py_internal, dtype=torch.int64),
            "gauss_next": py_gauss,
        },
        "numpy": {
            "name": str(np_name),
            "keys": torch.from_numpy(np.asarray(np_keys, dtype=np.int64)),
            "pos": int(np_pos),
            "has_gauss": int(np_has_gauss),
            "cached_gaussian": float(np_cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.cpu() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state: Mapping[str, Any]) -> list[str]:
    """Restore generator states saved by :func:`rng_state`; return the names restored."""
    restored = []
    py = state.get("python")
    if py is not None:
        random.setstate((py["version"], tuple(int(v) for v in py["state"].tolist()), py["gauss_next"]))
        restored.append("python")
    npy = state.get("numpy")
    if npy is not None:
        keys = npy["keys"].numpy().astype(np.uint32)
        np.random.set_state((npy["name"], keys, npy["pos"], npy["has_gauss"], npy["cached_gaussian"]))
        restored.append("numpy")
    if state.get("torch") is not None:
        torch.set_rng_state(state["torch"].cpu())
        restored.append("torch")
    cuda = state.get("cuda")
    if cuda is not None:
        if torch.cuda.is_available() and torch.cuda.device_count() == len(cuda):
            torch.cuda.set_rng_state_all(cuda)
            restored.append("cuda")
        else:
            visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
            logger.warning(
                "The checkpoint has CUDA generator states for %d device(s) but %d are visible; "
                "CUDA generators not restored.", len(cuda), visible,
            )
    return restored


# -- per-batch worker seeding ------------------------------------------------------------------
class _TaggedBatch(list):
    """A batch's sample indices, plus the epoch key and the batch's position in the epoch."""

    def __init__(self, indices: Iterable[int], epoch_key: int, position: int) -> None:
        super().__init__(indices)
        self.epoch_key = epoch_key
        self.position = position

    def __reduce__(self) -> tuple:  # sent to the worker processes through a queue
        return (_TaggedBatch, (list(self), self.epoch_key, self.position))


def _batch_seed(epoch_key: int, position: int) -> int:
    digest = hashlib.blake2b(f"{epoch_key}:{position}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & 0x7FFF_FFFF_FFFF_FFFF


class _BatchSeededDataset(torch.utils.data.Dataset):
    """Seeds a worker's python/numpy/torch generators before it loads each tagged batch."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index: Any) -> Any:
        return self.dataset[index]

    def __getitems__(self, indices: list) -> list:
        if isinstance(indices, _TaggedBatch) and get_worker_info() is not None:
            seed = _batch_seed(indices.epoch_key, indices.position)
            torch.manual_seed(seed)
            random.seed(seed)
            np.random.seed(seed % 2**32)
        inner = getattr(self.dataset, "__getitems__", None)
        if inner:
            return inner(list(indices))
        return [self.dataset[i] for i in indices]


class _PositionedBatchSampler:
    """Wraps a batch sampler: skips the first ``skip`` batches (once) and tags each batch.

    ``after_skip`` (once) runs right after the skipped index lists were drawn, before the first
    batch is handed out: the shuffle seed has then been drawn (lazily, as a straight run draws
    it) from the epoch-start state, and the save point's generators can be set.
    """

    def __init__(self, batch_sampler: Any, tag: bool) -> None:
        self.batch_sampler = batch_sampler
        self.tag = tag
        self.skip = 0
        self.after_skip: Callable[[], Any] | None = None
        self.epoch_key = 0

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def __iter__(self) -> Iterator[list]:
        skip, self.skip = self.skip, 0
        after_skip, self.after_skip = self.after_skip, None
        key = self.epoch_key
        for position, indices in enumerate(self.batch_sampler):
            if position < skip:
                continue  # only indices are drawn: the skipped samples are never loaded
            if after_skip is not None:
                after_skip()
                after_skip = None
            yield _TaggedBatch(indices, key, position) if self.tag else indices


def _positionable(loader: Any) -> bool:
    """Whether ``loader`` is a plain map-style DataLoader whose batch sampler can be wrapped."""
    return (
        type(loader) is DataLoader
        and not isinstance(loader.dataset, IterableDataset)
        and loader.batch_sampler is not None
    )


def _derive(loader: DataLoader, batch_sampler: _PositionedBatchSampler, dataset: Any) -> DataLoader:
    """A DataLoader like ``loader`` (same workers, collate_fn, generator ...) over new parts."""
    return DataLoader(
        dataset, batch_sampler=batch_sampler, num_workers=loader.num_workers,
        collate_fn=loader.collate_fn, pin_memory=loader.pin_memory, timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn, multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator, prefetch_factor=loader.prefetch_factor,
        persistent_workers=loader.persistent_workers, pin_memory_device=loader.pin_memory_device,
        in_order=getattr(loader, "in_order", True),
    )


def _generators(loader: Any) -> dict[str, torch.Generator]:
    """The explicit generators a loader shuffles or seeds workers with (besides torch's default)."""
    found: dict[str, torch.Generator] = {}
    gen = getattr(loader, "generator", None)
    if isinstance(gen, torch.Generator):
        found["loader"] = gen
    sampler = getattr(loader, "sampler", None)
    sgen = getattr(sampler, "generator", None)
    if isinstance(sgen, torch.Generator) and sgen is not gen:
        found["sampler"] = sgen
    return found


class ResumableData:
    """The iterable a training loop runs over: ``loader`` plus its position in the epoch.

    Each ``iter()`` starts an epoch: the generator states it starts from are recorded in
    :attr:`epoch_generators` (what a checkpoint stores). After :meth:`resume_at`, the next
    ``iter()`` restores those states first, yields the epoch from the saved position on, and
    then sets the generators to the save point's states.

    Args:
        loader: the data loader (any iterable of batches).
        seed_workers: seed each batch's worker generators from its epoch and position when
            ``loader`` is a map-style ``DataLoader`` with ``num_workers > 0`` (see the module
            docstring); required for an exact mid-epoch resume with random augmentation in
            workers.
    """

    def __init__(self, loader: Iterable, seed_workers: bool = True) -> None:
        self.loader: Any = loader  # a DataLoader where _positionable(loader), else any iterable
        self.seed_workers = seed_workers
        #: Generator states at the start of the running epoch (``None`` before the first).
        self.epoch_generators: dict[str, Any] | None = None
        self._pending: tuple[int, Mapping[str, Any] | None, Mapping[str, Any] | None] | None = None
        self._limit: int | None = None
        self._sampler: _PositionedBatchSampler | None = None
        self._seeded: DataLoader | None = None
        #: Wraps each epoch's iterator (the loop's :class:`~hat_ignite.engine.data_wait.DataWait`); ``None``: as is.
        self.wrap: Callable[[Iterator[Any]], Iterator[Any]] | None = None
        if isinstance(loader, DataLoader) and _positionable(loader):
            tag = seed_workers and loader.num_workers > 0
            self._sampler = _PositionedBatchSampler(loader.batch_sampler, tag=tag)
            if tag:
                self._seeded = _derive(loader, self._sampler, _BatchSeededDataset(loader.dataset))

    def __len__(self) -> int:
        return len(self.loader)  # TypeError: no length, as Ignite expects

    @property
    def seeds_workers(self) -> bool:
        """Whether worker generators are seeded per batch (a DataLoader with workers)."""
        return self._seeded is not None

    def resume_at(self, steps_done: int, generators: Mapping[str, Any] | None,
                  rng: Mapping[str, Any] | None = None) -> None:
        """Make the next ``iter()`` continue an epoch after its first ``steps_done`` batches.

        Args:
            steps_done: batches of the epoch already trained on.
            generators: :attr:`epoch_generators` as saved in that epoch (``None``: unknown;
                the epoch then restarts from the current generators).
            rng: :func:`rng_state` of the save point, set once the iterator is positioned.
        """
        self._pending = (int(steps_done), generators, rng)

    def restart_for(self, batches: int) -> None:
        """Make the next ``iter()`` a fresh pass of the loader that stops after ``batches`` batches.

        For a resume that does not continue the epoch's data (``resume_dataloader=False``): the
        rest of the resumed epoch is taken from the start of a new pass, and the epoch after it
        starts a pass of its own.
        """
        self._pending = None
        self._limit = int(batches)

    def _capture(self) -> dict[str, Any]:
        state: dict[str, Any] = {"torch": torch.get_rng_state()}
        for name, gen in _generators(self.loader).items():
            state[name] = gen.get_state()
        return state

    def _restore(self, saved: Mapping[str, Any]) -> None:
        torch.set_rng_state(saved["torch"])
        for name, gen in _generators(self.loader).items():
            if saved.get(name) is not None:
                gen.set_state(saved[name])

    @staticmethod
    def _epoch_key(state: Mapping[str, Any]) -> int:
        digest = hashlib.blake2b(digest_size=8)
        for name in sorted(state):
            digest.update(state[name].numpy().tobytes())
        return int.from_bytes(digest.digest(), "little")

    def restore_epoch_start(self) -> None:
        """Put the generators back to where the running epoch's iterator started.

        For a stop before the epoch's first batch arrived: creating the iterator drew from them
        (the shuffle, the workers' base seed), and the resumed run creates it again.
        """
        if self.epoch_generators is not None:
            self._restore(self.epoch_generators)

    def __iter__(self) -> Iterator[Any]:
        iterator = self._iterate()
        return iterator if self.wrap is None else self.wrap(iterator)

    def _iterate(self) -> Iterator[Any]:
        pending, self._pending = self._pending, None
        limit, self._limit = self._limit, None
        if limit is not None:
            self.epoch_generators = self._capture()
            return itertools.islice(self._start(0, None), limit)
        skip, rng = 0, None
        if pending is not None:
            skip, saved, rng = pending
            if saved is not None:
                self._restore(saved)
        self.epoch_generators = self._capture()
        return self._start(skip, None if rng is None else functools.partial(set_rng_state, rng))

    def _start(self, skip: int, set_rng: Callable[[], Any] | None) -> Iterator[Any]:
        sampler = self._sampler
        if sampler is not None:
            sampler.epoch_key = self._epoch_key(self.epoch_generators or {})
            if skip:
                sampler.skip, sampler.after_skip = skip, set_rng
            if self._seeded is not None:
                return iter(self._seeded)
            if skip:
                return iter(_derive(self.loader, sampler, self.loader.dataset))
            return iter(self.loader)
        iterator = iter(self.loader)
        if skip:
            logger.info("Resuming inside an epoch: fetching and dropping %d batch(es) of %s (it cannot skip "
                        "by index).", skip, type(self.loader).__name__)
            for _ in range(skip):
                next(iterator)
        if set_rng is not None:
            set_rng()
        return iterator
