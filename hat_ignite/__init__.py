"""hat-ignite: HAT's training engine rebuilt as an event bus on PyTorch-Ignite.

Importing this package defines names only: no logging setup, no seeding, no signal handlers
(those belong to :mod:`hat_ignite.cli`). Heavy optional pieces are imported where they are used.
"""

__version__ = "0.1.0"

__all__ = ["__version__"]
