"""``torch.export.export`` without the partial graph torch prints on a failed capture.

When a capture fails on a value that depends on the data (``GuardOnDataDependentSymNode``: a
Python branch on a tensor, the box count of an NMS), torch prints the graph captured so far to
stderr, hundreds of lines, once for each layer of its exporter, before it raises. hat-ignite
reports such a failure in one message (the module, the op, the source line; see
:func:`hat_ignite.quantization.capture.export_module`) and exports the submodules again to find
the culprit, so a detector's ``hat-predict -s int_infer`` printed thousands of lines ahead of its
one-line warning. :func:`export_program` sends that graph to this module's logger at DEBUG
(``hat-train --debug`` shows it) instead; anything else written to stderr during the export
(warnings) is written there once the export is done, in order.

>>> program = export_program(torch.nn.Linear(3, 2), (torch.ones(1, 3),))
>>> [spec.arg.name for spec in program.graph_signature.input_specs]
['p_weight', 'p_bias', 'input']
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from typing import Any

import torch

__all__ = ["export_program"]

logger = logging.getLogger(__name__)


def export_program(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any] | None = None,
                   **options: Any) -> torch.export.ExportedProgram:
    """``torch.export.export(module, args, kwargs, **options)``, its partial graph in the debug log.

    Raises:
        Exception: what ``torch.export.export`` raises, unchanged.
    """
    printed = io.StringIO()
    graph = None
    try:
        with contextlib.redirect_stderr(printed):
            return torch.export.export(module, args, kwargs, **options)
    except Exception as exc:
        graph = getattr(exc, "partial_fx_graph", None)
        if graph is not None:
            logger.debug("torch.export of %s failed (%s); the graph it had captured:\n%s",
                         type(module).__name__, type(exc).__name__, graph)
        raise
    finally:
        rest = printed.getvalue()
        if graph is not None:
            rest = rest.replace(f"{graph}\n", "")
        if rest:
            sys.stderr.write(rest)
