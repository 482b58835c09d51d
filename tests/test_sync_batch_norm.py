"""``sync_bn=True`` on the CPU: `CpuSyncBatchNorm` over 2 gloo ranks is BatchNorm on the global batch.

One real ``hat-train --nproc 2`` job (gloo) trains a conv-BN model with HAT's ``sync_bn = True``;
at its loop begin, the ranks also run the layer alone, case by case (``tests/sync_bn_dist.py``).
Each result is compared with one process running plain ``BatchNorm`` on the whole batch.
"""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from sync_bn_dist import CASES, case_batches, make_bn, rank_rows, train
from test_distributed import HAT_TRAIN, run

from hat_ignite.config import Config
from hat_ignite.data import DigitsImageDataset
from hat_ignite.engine.sync_batch_norm import CpuSyncBatchNorm
from hat_ignite.models import ResNetClassifier

# float32: what two summation orders of the same numbers differ by; float64: rounding alone
TOLERANCE = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-12, atol=1e-12)}


CONFIG = """
import torch
seed = 0
model = dict(type="ResNetClassifier", stem_channels=8, widths=(8, 16), blocks=1)
data_loader = dict(
    type="torch.utils.data.DataLoader", batch_size=16, shuffle=False,
    dataset=dict(type="DigitsImageDataset", split="train", size=8, limit=256),
)
float_trainer = dict(
    type="distributed_data_parallel_trainer",
    model=model,
    data_loader=data_loader,
    optimizer=dict(type="torch.optim.SGD", lr=0.05, momentum=0.9),
    batch_processor=dict(type="BasicBatchProcessor", need_grad_update=True,
                         loss_collector=dict(type="collect_loss_by_index", indexes=0)),
    device=None,
    stop_by="step",
    num_steps={steps},
    sync_bn=True,
    sync_bn_by_host=True,  # one node: the same ranks
    callbacks=[
        dict(type="ExponentialMovingAverage"),  # deep-copies the model and its process group
        dict(type="sync_bn_dist.LayerCases", out_dir={out!r}),
        dict(type="dist_helpers.DumpParams", out_dir={out!r}, initial=True),
        dict(type="Checkpoint", save_dir={ckpt!r}, name_prefix="float-", interval_by="step", save_interval={steps}),
    ],
)
calibration_trainer = dict(
    type="Calibrator",
    model=model,
    model_convert_pipeline=dict(type="ModelConvertPipeline", qat_mode="with_bn", converters=[
        dict(type="LoadCheckpoint", checkpoint_path={ckpt!r} + "/float-checkpoint-last.pth.tar"),
        dict(type="Float2Calibration", example_data_loader=data_loader, modules=["net"]),
    ]),
    data_loader=data_loader,
    batch_processor=dict(type="BasicBatchProcessor", need_grad_update=False),
    device=None,
    num_steps=2,
)
"""
STEPS = 6


@pytest.fixture(scope="module")
def job(tmp_path_factory):
    """``hat-train --nproc 2`` of :data:`CONFIG`'s float stage: the layer cases run at its loop begin."""
    tmp = tmp_path_factory.mktemp("sync_bn")
    cfg = tmp / "cfg.py"
    cfg.write_text(textwrap.dedent(CONFIG.format(steps=STEPS, out=str(tmp / "out"), ckpt=str(tmp / "ckpt"))))
    proc = run([sys.executable, HAT_TRAIN, str(cfg), "--stage", "float", "--nproc", "2", "--work-dir",
                str(tmp / "work"), "--dist-timeout", "60"], cwd=tmp)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return tmp, proc


@pytest.fixture(scope="module")
def ranks(job):
    return [torch.load(job[0] / "out" / f"rank{r}.pt", weights_only=True) for r in (0, 1)]


def _reference(name: str, dtype: torch.dtype | None = None) -> tuple[dict, torch.nn.Module]:
    """One plain BatchNorm trained on the whole batch of each step (in ``dtype`` if given)."""
    bn = make_bn(name)
    return train(bn.to(dtype or CASES[name][5]), name, slice(None), dtype), bn


@pytest.mark.parametrize("name", list(CASES))
def test_two_ranks_compute_batchnorm_of_the_global_batch(ranks, name):
    # mean 1001, std 3: float32 itself rounds the input at 6e-5 there, so compare with float64
    ref, ref_bn = _reference(name, torch.float64 if name == "mean 1000" else None)
    tol = dict(rtol=1e-4, atol=1e-4) if name == "mean 1000" else TOLERANCE[CASES[name][5]]

    def close(got, want, what):
        torch.testing.assert_close(got.to(want.dtype), want, **tol, msg=lambda m: f"{name}, {what}: {m}")

    for step in range(len(ref["out"])):
        close(torch.cat([r[name]["out"][step] for r in ranks]), ref["out"][step], f"output of step {step}")
        close(torch.cat([r[name]["input_grad"][step] for r in ranks]), ref["input_grad"][step], "input grad")
        for grad in ("weight_grad", "bias_grad"):  # DDP sums (averages) these over the ranks
            if ref[grad][step] is None:
                assert all(r[name][grad][step] is None for r in ranks)
            else:
                close(ranks[0][name][grad][step] + ranks[1][name][grad][step], ref[grad][step], grad)
    for rank, result in enumerate(ranks):
        assert result[name]["state"].keys() == ref["state"].keys()
        for key, value in ref["state"].items():  # running mean, unbiased var, num_batches_tracked
            close(result[name]["state"][key], value, f"rank {rank} {key}")
        rows = case_batches(name)[0][0][rank_rows(name, rank)]
        with torch.no_grad():  # eval: the running statistics, or the local batch's when not tracked
            close(result[name]["eval_out"], ref_bn.eval()(rows.to(ref["out"][0].dtype)), f"rank {rank} eval output")
        assert result[name]["host_reads"] == 0, name


def test_the_large_mean_case_would_catch_a_float32_sum_of_squares_reduction():
    x = case_batches("mean 1000")[0][0]
    true = x.double().var(dim=(0, 2, 3), unbiased=False)
    naive = (x * x).mean(dim=(0, 2, 3)) - x.mean(dim=(0, 2, 3)) ** 2
    assert (naive.double() - true).abs().max() > 1e-2  # a variance 1 % off: outputs 1e-2 off, not 1e-4


def test_a_process_group_of_one_rank_normalises_the_local_batch(ranks):
    name = "3d unequal"
    for rank, result in enumerate(ranks):
        local = train(make_bn(name), name, rank_rows(name, rank))
        for step in range(len(local["out"])):
            torch.testing.assert_close(result["own group"]["out"][step], local["out"][step], rtol=1e-6, atol=1e-6)
        for key, value in local["state"].items():
            torch.testing.assert_close(result["own group"]["state"][key], value, rtol=1e-6, atol=1e-6)


def test_batchnorm_with_momentum_none_reads_the_host_where_the_synchronised_layer_does_not():
    from host_reads import HostReads

    reads = HostReads()
    with reads:
        train(make_bn("4d momentum None"), "4d momentum None", slice(None))
    assert reads.per_step[0] == 3  # float(num_batches_tracked) at each of its 3 steps: the counter sees it


def test_hat_train_with_sync_bn_on_two_cpu_processes_trains_batchnorm_of_the_global_batch(job):
    tmp, proc = job
    assert "sync_bn: 6 BatchNorm layers (CpuSyncBatchNorm) normalise over the batches of 2 ranks (this node's)" in proc.stderr
    final = [torch.load(tmp / "out" / f"params_rank{r}.pt", weights_only=True) for r in (0, 1)]
    for key, value in final[0].items():  # both ranks hold the same statistics (per-rank BN: ~1e-3 apart)
        assert torch.equal(final[1][key], value), key

    # the same steps in one process, plain BatchNorm, the two ranks' batches as one (no shuffling:
    # rank r took samples r, r+2, ... of each 32)
    model = ResNetClassifier(stem_channels=8, widths=(8, 16), blocks=1)
    model.load_state_dict(torch.load(tmp / "out" / "initial_rank0.pt", weights_only=True))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loader = torch.utils.data.DataLoader(DigitsImageDataset("train", size=8, limit=256), batch_size=32)
    model.train()
    for _, batch in zip(range(STEPS), loader):
        optimizer.zero_grad()
        model(batch)[0]["cls_loss"].backward()
        optimizer.step()
    for key, value in model.state_dict().items():  # weights, running mean / var, num_batches_tracked
        torch.testing.assert_close(final[0][key], value, rtol=0, atol=1e-5, msg=lambda m, k=key: f"{k}: {m}")


def test_the_checkpoint_loads_into_the_plain_model_and_the_next_stage_quantizes_it(job):
    tmp, _ = job
    saved = torch.load(tmp / "ckpt" / "float-checkpoint-last.pth.tar", weights_only=True)["state_dict"]
    ResNetClassifier(stem_channels=8, widths=(8, 16), blocks=1).load_state_dict(saved)  # strict: BatchNorm's keys
    calibrator = Config.fromfile(tmp / "cfg.py").build("calibration_trainer")  # LoadCheckpoint, then torch.export
    calibrator.fit()
    assert calibrator.state.iteration == 2
    assert not any(isinstance(m, CpuSyncBatchNorm) for m in calibrator.model.modules())
