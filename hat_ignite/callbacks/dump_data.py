"""`DumpData`: pickle what each step saw (batches, outputs, gradients, weights) for debugging.

HAT's ``DumpData`` callback, with HAT's file format, so tools written for HAT's dumps read ours.
The file is ``<output_dir>/<name_prefix>.pkl``: one pickle holding a list with one dict per
process (rank order), each mapping ``"epoch_<epoch_id>_step_<global_step_id>"`` to that step's
entries, every tensor converted to a numpy array (dicts, lists and namedtuples kept):

==========================  ====================================================  ==============
entry                       what                                                  hook
==========================  ====================================================  ==============
``batch_data``              the batch given to the model (after device move and   forward begin
                            batch transforms)
``model_outs``              the model's outputs (``reformat_model_outs_fn`` of    forward end
                            them when given; a tuple of namedtuples becomes one
                            dict of their fields)
``grad_before_optimizer``   ``{parameter name: gradient}`` after backward         backward end
``param_before_optimizer``  ``{parameter name: value}`` before the update         optimizer step
==========================  ====================================================  ==============

With a :class:`~hat_ignite.engine.MultiBatchProcessor` each per-batch entry carries the batch's
index (``batch_data_0``, ``model_outs_1``...), as in HAT. The file is rewritten, whole, at the
end of every step that dumped something, so it is complete after any step; it grows with the
run: dump a few steps (``save_interval``, a short ``num_steps``), not a whole training. In a
distributed run every process takes part and rank 0 writes.

Example:
    >>> import pickle, tempfile, torch
    >>> from hat_ignite.engine import BasicBatchProcessor, Trainer
    >>> out = tempfile.mkdtemp()
    >>> model = torch.nn.Linear(2, 1)
    >>> trainer = Trainer(
    ...     model=model, data_loader=[(torch.ones(1, 2),)] * 2, device=None, num_epochs=1,
    ...     optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
    ...     batch_processor=BasicBatchProcessor(True, loss_collector=lambda out: [out.sum()]),
    ...     callbacks=[DumpData(output_dir=out, name_prefix="dump", dump_model_param=False)])
    >>> _ = trainer.fit()
    >>> [rank0] = pickle.load(open(f"{out}/dump.pkl", "rb"))
    >>> {step: sorted(entries) for step, entries in rank0.items()}
    {'epoch_0_step_0': ['batch_data', 'grad_before_optimizer', 'model_outs'], 'epoch_0_step_1': ['batch_data', 'grad_before_optimizer', 'model_outs']}
    >>> rank0["epoch_0_step_0"]["grad_before_optimizer"]["weight"].tolist()
    [[1.0, 1.0]]
"""

from __future__ import annotations

import os
import pickle
from collections.abc import Mapping, Sequence
from typing import Any, Callable

import torch
from torch import nn

from hat_ignite.callbacks.base import CallbackMixin
from hat_ignite.engine.processors.multi import MultiBatchProcessor

__all__ = ["DumpData", "convert_numpy"]


def convert_numpy(data: Any) -> Any:
    """``data`` with every tensor turned into a numpy array (detached, on the CPU), recursively.

    Mappings become dicts, namedtuples stay namedtuples, other sequences (not strings) become
    lists; anything else is kept as it is.

    >>> convert_numpy({"x": torch.ones(2), "n": [torch.zeros(1), "a", 3]})
    {'x': array([1., 1.], dtype=float32), 'n': [array([0.], dtype=float32), 'a', 3]}
    """
    if isinstance(data, torch.Tensor):
        return data.detach().to("cpu", copy=True).numpy()  # a snapshot, also of a CPU tensor
    if isinstance(data, Mapping):
        return {key: convert_numpy(value) for key, value in data.items()}
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(convert_numpy(value) for value in data))
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        return [convert_numpy(value) for value in data]
    return data


class DumpData(CallbackMixin):
    """Dump batches, outputs, gradients and weights of chosen steps to a pickle (format: module doc).

    Args:
        output_dir: directory of the file (made when missing).
        name_prefix: the file is ``<name_prefix>.pkl``.
        save_interval: dump every this many steps (or epochs).
        interval_by: ``"step"`` (``global_step_id + 1`` a multiple of ``save_interval``) or
            ``"epoch"`` (every step of the epochs whose ``epoch_id + 1`` is one).
        dump_batch_data: dump the batch given to the model.
        dump_model_outs: dump the model's outputs.
        dump_model_grad: dump each parameter's gradient after backward (training).
        dump_model_param: dump each parameter before the optimizer update (training).
        reformat_model_outs_fn: a function applied to the outputs before they are dumped.
        overwrite: replace a file left by an earlier run; with ``False`` such a file stops the
            run at its beginning (HAT warns and replaces it).
    """

    def __init__(
        self,
        output_dir: str,
        name_prefix: str = "",
        save_interval: int = 1,
        interval_by: str = "step",
        dump_batch_data: bool = True,
        dump_model_outs: bool = True,
        dump_model_grad: bool = True,
        dump_model_param: bool = True,
        reformat_model_outs_fn: Callable[[Any], Any] | None = None,
        overwrite: bool = True,
    ) -> None:
        if interval_by not in ("step", "epoch"):
            raise ValueError(f"DumpData(interval_by={interval_by!r}): use 'step' or 'epoch'.")
        if isinstance(save_interval, bool) or not isinstance(save_interval, int) or save_interval < 1:
            raise ValueError(f"DumpData(save_interval={save_interval!r}): give a positive integer.")
        if reformat_model_outs_fn is not None and not callable(reformat_model_outs_fn):
            raise TypeError(f"DumpData(reformat_model_outs_fn={reformat_model_outs_fn!r}): give a function.")
        self.output_dir = str(output_dir)
        self.name_prefix = str(name_prefix)
        self.save_interval = save_interval
        self.interval_by = interval_by
        self.dump_batch_data = bool(dump_batch_data)
        self.dump_model_outs = bool(dump_model_outs)
        self.dump_model_grad = bool(dump_model_grad)
        self.dump_model_param = bool(dump_model_param)
        self.reformat_model_outs_fn = reformat_model_outs_fn
        self.overwrite = bool(overwrite)
        #: ``{"epoch_E_step_S": {entry: data}}`` of this process, as written to the file.
        self.dump_data: dict[str, dict[str, Any]] = {}

    @property
    def dump_file(self) -> str:
        """Where the dump is written."""
        return os.path.join(self.output_dir, self.name_prefix + ".pkl")

    # -- what and when --------------------------------------------------------------------------
    def _due(self, epoch_id: int, global_step_id: int) -> bool:
        count = epoch_id if self.interval_by == "epoch" else global_step_id
        return (count + 1) % self.save_interval == 0

    @staticmethod
    def _entry(name: str, kwargs: Mapping[str, Any]) -> str:
        """``name``, with the batch's index under a multi-batch processor (HAT's keys)."""
        loop = kwargs.get("loop")
        if loop is not None:
            indexed = isinstance(getattr(loop, "batch_processor", None), MultiBatchProcessor)
        else:  # called the way HAT's processors call it: a batch_idx only from the multi-batch one
            indexed = kwargs.get("batch_idx") is not None
        return f"{name}_{kwargs.get('batch_idx', 0)}" if indexed else name

    def _put(self, epoch_id: int, global_step_id: int, entry: str, data: Any) -> None:
        self.dump_data.setdefault(f"epoch_{epoch_id}_step_{global_step_id}", {})[entry] = data

    @staticmethod
    def _named(model: nn.Module, grads: bool) -> dict[str, Any]:
        if grads:
            return {n: convert_numpy(p.grad) for n, p in model.named_parameters()
                    if p.requires_grad and p.grad is not None}
        return {n: convert_numpy(p) for n, p in model.named_parameters()}

    # -- hooks ----------------------------------------------------------------------------------
    def on_loop_begin(self, **kwargs: Any) -> None:
        if not self.overwrite and os.path.exists(self.dump_file):
            raise FileExistsError(
                f"DumpData: {os.path.abspath(self.dump_file)} exists and overwrite=False. Move it away, "
                f"choose another output_dir / name_prefix, or set overwrite=True."
            )
        os.makedirs(self.output_dir, exist_ok=True)
        self.dump_data = {}

    def on_forward_begin(self, batch: Any, epoch_id: int, global_step_id: int, **kwargs: Any) -> None:
        if self.dump_batch_data and self._due(epoch_id, global_step_id):
            self._put(epoch_id, global_step_id, self._entry("batch_data", kwargs), convert_numpy(batch))

    def on_forward_end(self, model_outs: Any, epoch_id: int, global_step_id: int, **kwargs: Any) -> None:
        if not (self.dump_model_outs and self._due(epoch_id, global_step_id)):
            return
        outs = model_outs if self.reformat_model_outs_fn is None else self.reformat_model_outs_fn(model_outs)
        if isinstance(outs, tuple) and outs and isinstance(outs[0], tuple) and hasattr(outs[0], "_fields"):
            data = {key: convert_numpy(value) for nt in outs for key, value in nt._asdict().items()}
        else:
            data = convert_numpy(outs)
        self._put(epoch_id, global_step_id, self._entry("model_outs", kwargs), data)

    def on_backward_end(self, model: nn.Module, epoch_id: int, global_step_id: int, **kwargs: Any) -> None:
        if self.dump_model_grad and self._due(epoch_id, global_step_id):
            entry = self._entry("grad_before_optimizer", kwargs)
            self._put(epoch_id, global_step_id, entry, self._named(model, grads=True))

    def on_optimizer_step_begin(self, model: nn.Module, epoch_id: int, global_step_id: int, **kwargs: Any) -> None:
        if self.dump_model_param and self._due(epoch_id, global_step_id):
            self._put(epoch_id, global_step_id, "param_before_optimizer", self._named(model, grads=False))

    def on_step_end(self, epoch_id: int, global_step_id: int, **kwargs: Any) -> None:
        if self._due(epoch_id, global_step_id):  # the same steps on every process: all gather
            self._write()

    # -- the file -------------------------------------------------------------------------------
    def _write(self) -> None:
        dist = torch.distributed
        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if world > 1:
            gathered: list[Any] = [None] * world
            dist.all_gather_object(gathered, self.dump_data)
        else:
            gathered = [self.dump_data]
        if world == 1 or dist.get_rank() == 0:
            os.makedirs(self.output_dir, exist_ok=True)
            tmp = f"{self.dump_file}.tmp{os.getpid()}"
            with open(tmp, "wb") as f:
                pickle.dump(gathered, f)
            os.replace(tmp, self.dump_file)
        if world > 1:
            dist.barrier()

    def __repr__(self) -> str:
        return (f"DumpData(output_dir={self.output_dir!r}, name_prefix={self.name_prefix!r}, "
                f"save_interval={self.save_interval}, interval_by={self.interval_by!r})")
