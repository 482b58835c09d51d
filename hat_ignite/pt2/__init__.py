"""``.pt2`` files (``torch.export`` programs) that load without running code and are verified.

``torch.export.load`` unpickles parts of a ``.pt2`` archive with ``weights_only=False``, loads
native libraries from it and evaluates strings from it as Python. hat-ignite never hands it a
file it has not checked:

* :mod:`~hat_ignite.pt2.code_strings` — the strings torch evaluates (symbolic sizes, input
  guards, pytree specs), each parsed and held to the pieces torch itself writes;
* :mod:`~hat_ignite.pt2.archive` — the entries: only those ``torch.export.save`` writes for a
  program of plain tensors, no pickled payload, sample inputs that load weights-only; and the
  content hash over all of them;
* :mod:`~hat_ignite.pt2.export` — exporting, with the graph torch prints when a capture fails
  sent to the debug log instead of the terminal;
* :mod:`~hat_ignite.pt2.files` — writing (the content hash recorded inside the file, a
  crash-safe write that clears what an interrupted one left) and loading (check, compare with
  the recorded hash, then deserialize the very bytes that were checked).

The int8 models of ``hat-predict --stage int_infer`` (:func:`hat_ignite.quantization.save_quantized_model`,
:func:`~hat_ignite.quantization.load_quantized_model`) and ``SaveTraced``'s ``.pt2`` go through it.
"""

from typing import TYPE_CHECKING

from hat_ignite.lazy import lazy_attributes

# each name is imported from its module when first used (hat_ignite.lazy)
_EXPORTS = {
    "hat_ignite.pt2.export": ["export_program"],
    "hat_ignite.pt2.files": ["load_program", "program_bytes", "remove_stale_temp_files", "save_program"],
}

__all__ = ["export_program", "load_program", "program_bytes", "remove_stale_temp_files", "save_program"]

__getattr__, __dir__ = lazy_attributes(__name__, _EXPORTS)

if TYPE_CHECKING:  # what type checkers and IDEs see
    from hat_ignite.pt2.export import export_program
    from hat_ignite.pt2.files import load_program, program_bytes, remove_stale_temp_files, save_program
