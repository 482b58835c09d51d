"""Pictures of a run: its TensorBoard scalars read back, and training curves drawn as a PNG.

Importing this package imports neither tensorboardX nor matplotlib; each function imports what
it needs when called.
"""

from hat_ignite.visualize.curves import CURVES_FILE, draw_training_curves, plot_scalars
from hat_ignite.visualize.event_file import find_event_dirs, read_scalars

__all__ = ["CURVES_FILE", "draw_training_curves", "plot_scalars", "find_event_dirs", "read_scalars"]
