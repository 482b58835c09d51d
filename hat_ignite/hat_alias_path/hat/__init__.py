"""hat-ignite's ``hat`` for the processes a run starts (see :mod:`hat_ignite.hat_alias`).

:func:`hat_ignite.hat_alias.install_hat_alias` puts the directory above this package on
``sys.path``. Processes started with the ``spawn`` or ``forkserver`` method (DDP ranks,
DataLoader workers) receive the parent's ``sys.path`` but not its import hook, so when such a
process unpickles a user's class whose module imports from ``hat``, ``import hat`` finds this
file, which installs the hook there and becomes the same virtual package.
"""

from hat_ignite.hat_alias import serve_as_virtual_hat

serve_as_virtual_hat(__name__)
