"""HAT's calibration observers (``min_max``, ``percentile``, ``mse``, ``kl``, ``mix``) on the PT2E flow.

==================  ================================================================================
module              holds
==================  ================================================================================
``statistics``      :class:`~.statistics.Statistics`: min, max and a magnitude histogram over a
                    power-of-two range; the same whatever the order of the batches, and summed over
                    processes exactly (:func:`~.statistics.all_reduce_statistics`)
``rules``           the range each observer takes from the statistics (percentile of ``|x|``,
                    least fake-quantization MSE, TensorRT's least KL divergence, horizon's mix)
``spec``            HAT's observer names and options, checked (:func:`~.spec.observer_spec`)
``hooks``           :class:`~.hooks.CalibrationObservers`: the observers of one prepared graph,
                    hooked onto torchao's fake-quantize modules; they write their ranges into them
``checkpoint``      :class:`~.checkpoint.CalibrationStatistics`: the statistics a ``Calibrator``
                    checkpoint saves, so that a stopped calibration resumes exactly
==================  ================================================================================

The observers run while a prepared model in the calibration stage is observing (a ``Calibrator``
step); QAT keeps torchao's moving-average min/max observers, starting from the calibrated ranges.
The model's ``state_dict`` holds torchao's tensors only, whatever the observer, so calibration,
QAT and int8 checkpoints load into each other's models as before. See docs/quantization.md.
"""
