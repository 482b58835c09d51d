"""Where a loop's time goes: phase, event and callback timing, and a bridge to torch.profiler.

Give a loop ``profiler="simple"`` (or a :class:`SimpleProfiler`) for a table of phases and
handlers at the end of the run, or a :class:`TorchProfiler` for a trace of a window of steps
that TensorBoard's profiler plugin and ``chrome://tracing`` / Perfetto open.
"""

from hat_ignite.profiler.base import ProfilerBase, build_profiler
from hat_ignite.profiler.simple import SimpleProfiler
from hat_ignite.profiler.torch_profiler import TorchProfiler

__all__ = ["ProfilerBase", "SimpleProfiler", "TorchProfiler", "build_profiler"]
