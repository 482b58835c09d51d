"""A project's own modules import in every process of a run, with no ``PYTHONPATH``.

The project: ``configs/shapes.py`` imports ``shapes_model.py`` beside it (its model, dataset and
callback, registered through ``from hat.registry import OBJECT_REGISTRY``), ``shapes_scale.py``
beside it by a relative import, and ``shapes_flip.py`` from the directory ``hat-train`` runs in.
Trained with ``--nproc 2``; each rank's three loaders (``num_workers=2``) start their workers
with ``spawn``, ``forkserver`` and ``fork``, and each worker unpickles the dataset and its two
transforms, so it imports all three modules.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap

from conftest import ROOT, time_limit

SHAPES_MODEL = '''
import torch
from torch import nn

from hat.callbacks import CallbackMixin
from hat.registry import OBJECT_REGISTRY


@OBJECT_REGISTRY.register
class ShapesDataset(torch.utils.data.Dataset):
    """16 points of 4 features; the label says whether they sum past 2."""

    def __init__(self, transforms=()):
        self.x = torch.rand(16, 4, generator=torch.Generator().manual_seed(0))
        self.transforms = list(transforms)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        x = self.x[i]
        for transform in self.transforms:
            x = transform(x)
        return dict(x=x, labels=(self.x[i].sum() > 2).long())


@OBJECT_REGISTRY.register
class ShapesNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(4, 2)

    def forward(self, data):
        out = self.fc(data["x"])
        return (out, dict(ce=nn.functional.cross_entropy(out, data["labels"]))) if self.training else out


@OBJECT_REGISTRY.register
class ShapesCallback(CallbackMixin):
    def on_epoch_end(self, epoch_id, **kwargs):
        print(f"shapes callback: epoch {epoch_id} ended on rank {torch.distributed.get_rank()}", flush=True)
'''

TRANSFORM = '''
from hat.registry import OBJECT_REGISTRY


@OBJECT_REGISTRY.register
class {name}:
    def __call__(self, x):
        return {expression}
'''

CONFIG = '''
import torch

import shapes_model  # beside the config
import shapes_flip  # in the directory hat-train runs from
from . import shapes_scale  # beside the config, relative
from hat.engine.processors.loss_collector import collect_loss_by_index


def loader(context):
    dataset = dict(type="ShapesDataset", transforms=[dict(type="Flip"), dict(type="Scale")])
    return dict(type=torch.utils.data.DataLoader, dataset=dataset, batch_size=4, shuffle=True,
                num_workers=2, multiprocessing_context=context)


float_trainer = dict(
    type="Trainer",
    model=dict(type="ShapesNet"),
    data_loader=loader("spawn"),
    optimizer=dict(type=torch.optim.SGD, lr=0.1),
    batch_processor=dict(type="BasicBatchProcessor", need_grad_update=True, loss_collector=collect_loss_by_index(1)),
    num_epochs=1,
    device=None,
    callbacks=[
        dict(type="ShapesCallback"),
        dict(type="Validation", data_loader=[loader("forkserver"), loader("fork")],
             batch_processor=dict(type="BasicBatchProcessor", need_grad_update=False), callbacks=[]),
    ],
)
'''


def test_own_modules_import_in_the_ranks_and_their_workers_of_every_start_method(tmp_path):
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "shapes.py").write_text(textwrap.dedent(CONFIG))
    (configs / "shapes_model.py").write_text(textwrap.dedent(SHAPES_MODEL))
    (configs / "shapes_scale.py").write_text(TRANSFORM.format(name="Scale", expression="x * 2"))
    (tmp_path / "shapes_flip.py").write_text(TRANSFORM.format(name="Flip", expression="x.flip(0)"))
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bin" / "hat-train"), "-c", "configs/shapes.py", "-s", "float",
         "--work-dir", "work", "--nproc", "2"],
        cwd=tmp_path, capture_output=True, text=True, timeout=time_limit(300),
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "OMP_NUM_THREADS": "1"},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "No module named" not in proc.stderr
    # the two ranks print at the same moment: their lines may interleave
    assert sorted(re.findall(r"epoch 0 ended on rank (\d)", proc.stdout)) == ["0", "1"], proc.stdout
