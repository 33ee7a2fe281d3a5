"""The Runner protocol every backend implements: named numpy feeds in, named numpy outputs out."""

from __future__ import annotations

from typing import Protocol

import numpy as np


class Runner(Protocol):
    input_names: list[str]
    output_names: list[str]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...
