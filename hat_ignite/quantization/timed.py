"""A start line and a done line, with the time taken, around quantization work that is long and quiet.

Exporting, preparing and converting a conv net take seconds to minutes on a CPU and print
nothing of their own; :func:`timed` says what is running and how long it took.

>>> import logging
>>> with timed(logging.getLogger("demo"), "exporting %s", "the model"):
...     pass
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Iterator

__all__ = ["timed"]


@contextlib.contextmanager
def timed(logger: logging.Logger, what: str, *args: Any) -> Iterator[None]:
    """Log ``what % args`` with "..." before the block and "done in N s" after it (not on an error,
    which says what failed itself)."""
    logger.info(what + " ...", *args)
    start = time.perf_counter()
    yield
    logger.info(what + ": done in %.1f s", *args, time.perf_counter() - start)
