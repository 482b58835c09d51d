"""Former home of :mod:`hat_ignite.checkpoint.optimizer_state`, kept so existing imports work (the same objects)."""

from hat_ignite.checkpoint.optimizer_state import OptionChange, load_optimizer_state, run_options_over

__all__ = ["OptionChange", "load_optimizer_state", "run_options_over"]
