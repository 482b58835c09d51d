"""What every rank imports before its first step, imported once by the server the ranks are forked
from: the server's preload (:func:`hat_ignite.engine.rank_start.prepare_rank_start`). Meant for that
process only.

It imports torch, ``torch._dynamo`` (an optimizer's first parameter group imports it), and
Ignite's ``distributed`` and ``engine`` as Python's documentation advises for a process that forks
without ``exec``:

* with the cyclic garbage collector paused: the imports create about half a million objects that
  stay, and hardly any garbage, and the collector would go through them again each time what it
  tracks grew by a quarter;
* then frozen (``gc.freeze``), before any rank is forked: a rank's collections skip these objects
  (and so leave alone the memory pages it shares with the server) until the command it runs
  unfreezes everything for its last collection (:mod:`hat_ignite.cli.collector`).

The collector is then as it was. The command line's own processes import the same way; the
figures are in docs/benchmarks.md ("third pass").
"""

from __future__ import annotations

import gc

_collector_was_on = gc.isenabled()
gc.disable()
try:
    import torch
    import torch._dynamo  # noqa: F401
    import ignite.distributed  # noqa: F401
    import ignite.engine  # noqa: F401
finally:
    gc.freeze()
    if _collector_was_on:
        gc.enable()

__all__: list[str] = []
