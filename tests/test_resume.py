"""Exact resume: a run killed with SIGKILL and resumed in new processes ends bitwise equal to an
uninterrupted run, and writes the same checkpoints at the same steps.

Every run is a real ``hat-train`` subprocess on the config of :mod:`resume_support` (dropout,
random augmentation, shuffled loader, validation at each epoch end, a checkpoint every 2 steps).
"""

from __future__ import annotations

import pathlib
import shutil

import pytest
import torch

from hat_ignite.callbacks.checkpoint_io import atomic_save, with_content_hash
from hat_ignite.engine.resume import ResumableData
from resume_support import (
    STEPS_PER_EPOCH,
    TOTAL_STEPS,
    differences,
    hat_train,
    load,
    step_file,
    straight_run,
    write_config,
)

# Keys that legitimately differ between two runs of the same training.
RUN_SPECIFIC = (".versions", ".content_sha256")
# workers0: fp32, StepDecayLrUpdater by step, data loaded in the main process.
# workers2-bf16-ema: bf16 autocast, CosLrUpdater with warm-up, EMA of the weights, 2 loader workers.
VARIANTS = ["workers0", "workers2-bf16-ema"]
SAVED_STEPS = [s for s in range(TOTAL_STEPS) if (s + 1) % 2 == 0]


def _killed_chain(tmp_path: pathlib.Path, variant: str) -> pathlib.Path:
    """Kill at step 4 (mid-epoch 0), resume; kill at the end of epoch 1, resume; run to the end."""
    config = write_config(tmp_path)
    work_dir = tmp_path / "wd"
    env = {"KILL_AT": "step:4,epoch:1", "KILL_MARKERS": str(tmp_path), "RESUME_VARIANT": variant}
    first = hat_train(config, work_dir, env=env)
    assert first.returncode == -9, first.stderr[-2000:]  # a real SIGKILL at global step 4
    newest = load(work_dir / "checkpoints" / "checkpoint-last.pth.tar")
    assert newest["step"] == 3 and newest["data"]["steps_done"] == 4  # step 4's update was lost
    second = hat_train(config, work_dir, "--resume", env=env)
    assert second.returncode == -9, second.stderr[-2000:]  # killed again at the end of epoch 1
    assert "Resuming inside epoch 0 at step 4 of 6" in second.stderr
    newest = load(work_dir / "checkpoints" / "checkpoint-last.pth.tar")
    assert newest["step"] == 2 * STEPS_PER_EPOCH - 1 and newest["data"]["epoch_open"] is True
    third = hat_train(config, work_dir, "--resume", "auto", env=env)
    assert third.returncode == 0, third.stderr[-2000:]
    assert "Running the on_epoch_end hooks of epoch 1, which the saved run had not run" in third.stderr
    not_restored = [line for line in third.stderr.splitlines() if "Not restored" in line]
    # EMA weights are put back by the ExponentialMovingAverage callback at loop begin
    assert all(line.endswith("ema_model (the loop has no ema_model yet; it stays in loop.checkpoint).")
               for line in not_restored), not_restored
    if "ema" in variant:
        assert "ExponentialMovingAverage: EMA weights restored from the checkpoint" in third.stderr
    return work_dir


@pytest.mark.parametrize("variant", VARIANTS)
def test_sigkilled_and_resumed_run_is_bitwise_equal_to_a_straight_run(tmp_path, variant):
    straight = straight_run(variant)
    resumed = _killed_chain(tmp_path, variant)
    final_a = load(straight / "checkpoints" / "checkpoint-last.pth.tar")
    final_b = load(resumed / "checkpoints" / "checkpoint-last.pth.tar")
    # the last save point (step 17) came before the last epoch's end hooks, so the end of training
    # wrote last again after them: the loop end's global_step_id is the number of steps done
    assert final_a["step"] == final_b["step"] == TOTAL_STEPS
    assert final_a["data"]["epoch_open"] is final_b["data"]["epoch_open"] is False
    assert differences(final_a, final_b, RUN_SPECIFIC) == []  # weights, optimizer, EMA, rng, data ...
    assert final_a["optimizer"]["state"]
    if "ema" in variant:
        assert final_b["ema_state_dict"] is not None and final_b["callbacks"]["ExponentialMovingAverage"]
    for step in SAVED_STEPS:  # the checkpoint written at step j equals the straight run's at j
        assert differences(load(step_file(straight, step)), load(step_file(resumed, step)), RUN_SPECIFIC) == [], step


def test_sigkilled_at_the_first_and_at_the_last_step_resumes_to_the_straight_result(tmp_path):
    """Kill at step 0 (before any checkpoint), resume auto (a fresh start); kill at the last step
    before its save, resume auto; the run ends as the straight run does."""
    straight = straight_run("workers0")
    config = write_config(tmp_path)
    work_dir = tmp_path / "wd"
    last = TOTAL_STEPS - 1
    env = {"KILL_AT": f"step:0,step:{last}", "KILL_MARKERS": str(tmp_path), "RESUME_VARIANT": "workers0"}
    first = hat_train(config, work_dir, "--resume", "auto", env=env)
    assert first.returncode == -9, first.stderr[-2000:]
    assert not list((work_dir / "checkpoints").glob("*.pth.tar"))  # killed before the first save
    second = hat_train(config, work_dir, "--resume", "auto", env=env)
    assert second.returncode == -9, second.stderr[-2000:]
    assert "no checkpoint in" in second.stderr and "starting from the beginning" in second.stderr
    assert load(work_dir / "checkpoints" / "checkpoint-last.pth.tar")["step"] == last - 2  # step 17 unsaved
    third = hat_train(config, work_dir, "--resume", "auto", env=env)
    assert third.returncode == 0, third.stderr[-2000:]
    assert f"Resuming inside epoch 2 at step {STEPS_PER_EPOCH - 2} of {STEPS_PER_EPOCH}" in third.stderr
    final_a = load(straight / "checkpoints" / "checkpoint-last.pth.tar")
    final_b = load(work_dir / "checkpoints" / "checkpoint-last.pth.tar")
    assert final_b["step"] == TOTAL_STEPS and differences(final_a, final_b, RUN_SPECIFIC) == []  # written at the end
    for step in SAVED_STEPS:
        assert differences(load(step_file(straight, step)), load(step_file(work_dir, step)), RUN_SPECIFIC) == [], step


def test_resuming_without_the_saved_generators_is_not_equal(tmp_path):
    """The test above has teeth: the same resume with the RNG state deleted ends elsewhere."""
    straight = straight_run("workers0")
    saved = load(step_file(straight, 7))  # inside epoch 1
    assert 0 < saved["data"]["steps_done"] < STEPS_PER_EPOCH
    payload = {k: v for k, v in saved.items() if k not in ("rng", "content_sha256")}
    no_rng = atomic_save(with_content_hash(payload), tmp_path / "no-rng.pth.tar")
    work_dir = tmp_path / "wd"
    config = write_config(tmp_path)
    full = hat_train(config, work_dir, "--resume", str(step_file(straight, 7)))
    assert full.returncode == 0, full.stderr[-2000:]
    final = load(straight / "checkpoints" / "checkpoint-last.pth.tar")
    assert differences(final, load(work_dir / "checkpoints" / "checkpoint-last.pth.tar"), RUN_SPECIFIC) == []
    shutil.rmtree(work_dir / "checkpoints")
    partial = hat_train(config, work_dir, "--resume", no_rng)
    assert partial.returncode == 0, partial.stderr[-2000:]
    assert "rng (none saved)" in partial.stderr
    without = load(work_dir / "checkpoints" / "checkpoint-last.pth.tar")
    assert ".state_dict.net.0.weight" in differences(final, without, RUN_SPECIFIC)


def test_resumable_data_skips_by_index_without_loading_skipped_samples():
    loaded: list[int] = []

    class Recording(torch.utils.data.Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            loaded.append(i)
            return torch.tensor([i])

    loader = torch.utils.data.DataLoader(Recording(), batch_size=2, shuffle=True)
    data = ResumableData(loader)
    torch.manual_seed(3)
    straight = [b.flatten().tolist() for b in data]
    saved = data.epoch_generators
    loaded.clear()
    torch.manual_seed(99)  # another process: other generator states until the resume sets them
    data.resume_at(4, saved)
    resumed = [b.flatten().tolist() for b in data]
    assert resumed == straight[4:]
    assert sorted(loaded) == sorted(i for b in straight[4:] for i in b)  # nothing of batches 0-3
