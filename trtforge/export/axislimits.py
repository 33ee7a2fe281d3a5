"""How far a dynamic axis really goes: a model run at an axis' configured max, and a failure there told as the
axis, the size, the node and the config key to change.

A range under `axes` is a promise to every later step (profiles are built for it, chunks are cut to it), but a
model can take less: MPNet's position table of P rows takes P - 2 tokens, and a longer input makes a Gather read
past the table. Export and clean therefore run each axis at its max; where that fails on an index out of range,
the largest size that works is found by bisection (a few runs: the model is monotone in such a limit).
"""

from __future__ import annotations

import re
from typing import Callable

from trtforge.core.errors import UserError, exception_summary

OUT_OF_BOUNDS = ("out of data bounds", "index out of range", "out of bounds")
BISECT_STEPS = 20  # enough for any range up to a million positions


def failing_node(message: str) -> str:
    """'Gather node '/embeddings/Gather'' from an ONNX Runtime error, else the error's first words."""
    match = re.search(r"running (\w+) node\. Name:'([^']*)'", message)
    if match:
        return f"{match.group(1)} node '{match.group(2)}'"
    return "the graph: " + " ".join(message.split())[:200]


def is_out_of_bounds(message: str) -> bool:
    """An index past the end of a table (ONNX Runtime's Gather, torch's embedding): a limit of the model's, not a
    broken export."""
    lowered = message.lower()
    return any(marker in lowered for marker in OUT_OF_BOUNDS)


def largest_working(works: Callable[[int], bool], good: int, bad: int) -> int | None:
    """The largest size in [good, bad) at which `works` holds, by bisection between `good` (tried first) and `bad`
    (known to fail); None when even `good` fails or the range is too wide to settle in BISECT_STEPS runs."""
    if good >= bad or not works(good):
        return None
    for _ in range(BISECT_STEPS):
        if bad - good <= 1:
            return good
        middle = (good + bad) // 2
        if works(middle):
            good = middle
        else:
            bad = middle
    return good if bad - good <= 1 else None


def axis_limit_error(what: str, axis: str, size: int, error: BaseException | str, largest: int | None, others: dict[str, int]) -> UserError:
    """One sentence: which run failed at which size of which axis, in which node, and the config key to lower."""
    message = error if isinstance(error, str) else exception_summary(error, 300)
    # ONNX Runtime names the node and its status; PyTorch's message is the reason itself
    status = message.split("Status Message:", 1)[-1].split(" must be within")[0]
    reason = " ".join(status.split())[:160].rstrip(" ;,.")
    where = f" in {failing_node(message)}: {reason}" if "running" in message else f": {reason}"
    rest = ", ".join(f"{name}={value}" for name, value in others.items() if name != axis)
    at = f"{axis}={size} (the max of axis '{axis}'" + (f", with {rest})" if rest else ")")
    if largest is not None and is_out_of_bounds(message):
        return UserError(
            f"{what} fails at {at}{where}, so the model's positions run out at {axis} {largest + 1}; "
            f"lower axes.{axis}.max to {largest} and re-export."
        )
    hint = f"the largest {axis} that works is {largest}" if largest is not None else f"no smaller {axis} tried works"
    return UserError(
        f"{what} fails at {at}{where}, and {hint}; lower axes.{axis}.max in the config and re-export, or fix the model for that size."
    )
