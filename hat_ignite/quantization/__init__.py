"""int8 quantization over torchao's PT2E flow: HAT's model converters and their pipeline.

``torch.export`` -> ``prepare_qat_pt2e`` (X86 inductor quantizer) -> calibration and/or QAT ->
``convert_pt2e``. Importing this package does not import torchao; the converters do, when run.
See ``docs/quantization.md``.
"""

from hat_ignite.quantization.converters import (
    Calibration2QAT,
    Calibration2Quantize,
    Float2Calibration,
    Float2QAT,
    QAT2Quantize,
    default_quantizer,
)
from hat_ignite.quantization.io import file_sha256, load_quantized_model, save_quantized_model, tensor_bytes
from hat_ignite.quantization.pipeline import ModelConvertPipeline
from hat_ignite.quantization.prepared import STAGES, PreparedModule, observing, prepared_modules
from hat_ignite.quantization.qconfig import CONVERT_MODES, QAT_MODES, parse_qconfig_params

__all__ = [
    "ModelConvertPipeline",
    "Float2Calibration",
    "Float2QAT",
    "Calibration2QAT",
    "QAT2Quantize",
    "Calibration2Quantize",
    "default_quantizer",
    "PreparedModule",
    "STAGES",
    "observing",
    "prepared_modules",
    "save_quantized_model",
    "load_quantized_model",
    "file_sha256",
    "tensor_bytes",
    "QAT_MODES",
    "CONVERT_MODES",
    "parse_qconfig_params",
]
