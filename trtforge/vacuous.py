"""Checks that cannot fail prove nothing: a reference output that is all zeros or constant.

A random-init torchvision ViT has a zero-initialised head, so comparing its (all-zero) logits gives
rel-L2 0 whatever the exported graph computes. Export's check against PyTorch and clean's parity check
refuse such references, naming the output.

"Constant" is judged relative to the output's own magnitude, not to an absolute threshold: a
random-init SegFormer's logits have std ~3e-3, which is small but very much not constant. An output is
constant when its spread (max - min) is below `RELATIVE_SPREAD` times its largest magnitude, i.e. the
values agree to about float32 rounding. Outputs with a single element cannot be judged (a scalar is
always 'constant') unless they are exactly zero.

An output whose largest magnitude is below float32's smallest normal number is "subnormal": the
model's activations have vanished (a random-init MobileViT's logits are ~1e-41), an engine turns them into
zeros (GPUs flush subnormals; fp16 and INT8 cannot hold them at all), and every later check fails with cosine 0
and no hint of why. Outputs that are tiny but normal float32 (down to ~1e-38) pass: an fp32 engine keeps them, and
an fp16 build's own precision gate then says how far they are off.
"""

from __future__ import annotations

import numpy as np

from trtforge.errors import UserError

RELATIVE_SPREAD = 1e-6
SMALLEST_NORMAL = float(np.finfo(np.float32).tiny)


def vacuous_reason(values: np.ndarray) -> str | None:
    """'all zeros' / 'constant (every value X)' when a comparison against `values` could never fail."""
    array = np.asarray(values)
    if array.size == 0:
        return None
    if array.dtype == bool:
        array = array.astype(np.int8)
    array = array.astype(np.float64)
    finite = array[np.isfinite(array)]
    if finite.size == 0:
        return None  # all NaN/inf: the comparison fails loudly on its own
    magnitude = float(np.max(np.abs(finite)))
    if magnitude == 0.0:
        return "all zeros"
    if magnitude < SMALLEST_NORMAL:
        return f"subnormal (largest magnitude {magnitude:.2g}, below float32's smallest normal {SMALLEST_NORMAL:.2g})"
    if array.size == 1:
        return None
    spread = float(np.max(finite) - np.min(finite))
    if spread <= RELATIVE_SPREAD * magnitude:
        return f"constant (every value {float(finite.flat[0]):.6g})"
    return None


def require_informative(outputs: dict[str, np.ndarray], where: str) -> None:
    """Raise UserError naming the first output whose reference values make the check vacuous."""
    for name, values in outputs.items():
        reason = vacuous_reason(values)
        if reason and reason.startswith("subnormal"):
            raise UserError(
                f"{where}: reference output '{name}' is {reason}: the model's activations vanish layer by layer, "
                "so an engine (which flushes subnormals to zero on the GPU) returns zeros; initialise the weights at a "
                "larger scale (e.g. the config's initializer_range) or load trained weights."
            )
        if reason:
            raise UserError(
                f"{where}: reference output '{name}' is {reason}, so comparing against it proves nothing; "
                "re-initialise the layer that produces it (e.g. a zero-initialised classifier head: "
                "torch.nn.init.normal_(head.weight, std=0.02)) or return a meaningful output."
            )
