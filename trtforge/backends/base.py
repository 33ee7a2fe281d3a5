"""What every backend shares: the one Runner protocol (named numpy feeds in, named numpy outputs out, and a
lifecycle), and TrtModule, the loaded TensorRT flavour.

Every runner (OrtRunner, TrtRunner), `run`'s targets (OrtTarget, TrtTarget), the stateful steppers, the stored and
recording references and the wrappers (NamedOutputs, RunOnce) implement it, as Polygraphy's BaseRunner does: open on
construction, `run` any number of times, `close()` once (idempotent) or leave a `with` block. A wrapper closes what it
wraps. `RunnerLifecycle` gives the context manager; a class frees its own resources in `close`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import numpy as np


@runtime_checkable
class Runner(Protocol):
    input_names: list[str]
    output_names: list[str]

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Any: ...

    def __exit__(self, *exc: object) -> None: ...


class RunnerLifecycle:
    """`with runner:` closes it on the way out, also on an error; close() with nothing to free does nothing."""

    def close(self) -> None:
        pass

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass
class TrtModule:
    trt: Any
    flavour: str  # "tensorrt" | "tensorrt_rtx"
    version: str

    @property
    def major(self) -> int:
        return int(self.version.split(".")[0])

    @property
    def strongly_typed(self) -> bool:
        return self.flavour == "tensorrt_rtx" or self.major >= 10

    @property
    def label(self) -> str:
        return f"{self.flavour} {self.version}"
