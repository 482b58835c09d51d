"""A dataset whose loading hangs, for the stuck-data-loader tests (``tests`` is on the child's path).

``HangingDigits`` is the shipped config's ``DigitsDataset`` except that loading sample
``hang_at`` blocks for good while the file ``hang_file`` exists (a dataset stuck on a file or
the network). It first writes its process id into ``hang_file + ".pid"``, so a test can find the
process (the main one with ``num_workers=0``, a data-loader worker otherwise). Without the file
it loads the sample as usual, so a resumed run goes on.
"""

from __future__ import annotations

import os
import time
from typing import Any

from hat_ignite.data.digits import DigitsDataset


class HangingDigits(DigitsDataset):
    """``DigitsDataset`` whose sample ``hang_at`` hangs while ``hang_file`` exists."""

    def __init__(self, hang_at: int, hang_file: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.hang_at = hang_at
        self.hang_file = hang_file

    def __getitem__(self, index: int) -> Any:
        if index == self.hang_at and os.path.exists(self.hang_file):
            with open(self.hang_file + ".pid", "w") as f:
                f.write(str(os.getpid()))
            while True:  # stuck: no timeout, no output
                time.sleep(3600)
        return super().__getitem__(index)
