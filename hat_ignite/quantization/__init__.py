"""int8 quantization over torchao's PT2E flow: HAT's model converters and their pipeline.

``torch.export`` -> ``prepare_qat_pt2e`` (X86 inductor quantizer) -> calibration and/or QAT ->
``convert_pt2e``. Importing this package does not import torchao; the converters do, when run.
See ``docs/quantization.md``.
"""

from typing import TYPE_CHECKING

from hat_ignite.lazy import lazy_attributes

# each name is imported from its module when first used (hat_ignite.lazy)
_EXPORTS = {
    "hat_ignite.quantization.converters": [
        "Calibration2QAT", "Calibration2Quantize", "Float2Calibration", "Float2QAT", "QAT2Quantize",
        "default_quantizer",
    ],
    "hat_ignite.quantization.inductor": ["LoadedProgram"],
    "hat_ignite.quantization.io": ["file_sha256", "load_quantized_model", "save_quantized_model", "tensor_bytes"],
    "hat_ignite.quantization.pipeline": ["ModelConvertPipeline"],
    "hat_ignite.quantization.prepared": ["STAGES", "PreparedModule", "observing", "prepared_modules"],
    "hat_ignite.quantization.qconfig": ["CONVERT_MODES", "QAT_MODES", "parse_qconfig_params"],
}

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
    "LoadedProgram",
    "file_sha256",
    "tensor_bytes",
    "QAT_MODES",
    "CONVERT_MODES",
    "parse_qconfig_params",
]

__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from hat_ignite.quantization.converters import (
        Calibration2QAT,
        Calibration2Quantize,
        Float2Calibration,
        Float2QAT,
        QAT2Quantize,
        default_quantizer,
    )
    from hat_ignite.quantization.inductor import LoadedProgram
    from hat_ignite.quantization.io import file_sha256, load_quantized_model, save_quantized_model, tensor_bytes
    from hat_ignite.quantization.pipeline import ModelConvertPipeline
    from hat_ignite.quantization.prepared import STAGES, PreparedModule, observing, prepared_modules
    from hat_ignite.quantization.qconfig import CONVERT_MODES, QAT_MODES, parse_qconfig_params
