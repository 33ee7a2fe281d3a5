"""tiny-fcn: a small fully convolutional image model with fixed weights (seed 0).

Stride 1 and 'same' padding everywhere, so the output has the input's height and width and every
output pixel sees a 9x9 window (four 3x3 convolutions): tiles that overlap by >= 4 pixels per side
reproduce the whole-image result exactly, which is what the 2-D tiling tests rely on.
"""

from __future__ import annotations

from typing import Any

from trtforge.models.loaded import LoadedModel

RECEPTIVE_FIELD = 9
CHANNELS_IN = 3
CHANNELS_OUT = 4


def load(seed: int = 0, **_: Any) -> LoadedModel:
    import torch

    torch.manual_seed(seed)
    layers = []
    widths = [CHANNELS_IN, 16, 32, 16]
    for c_in, c_out in zip(widths[:-1], widths[1:]):
        layers += [torch.nn.Conv2d(c_in, c_out, 3, padding=1), torch.nn.BatchNorm2d(c_out), torch.nn.ReLU()]
    layers += [torch.nn.Conv2d(widths[-1], CHANNELS_OUT, 3, padding=1)]
    module = torch.nn.Sequential(*layers)
    with torch.no_grad():  # non-trivial BatchNorm statistics so folding is actually exercised
        for layer in module:
            if isinstance(layer, torch.nn.BatchNorm2d):
                layer.running_mean.uniform_(-0.1, 0.1)
                layer.running_var.uniform_(0.5, 1.5)
    module.eval()
    examples = {"image": torch.rand(1, CHANNELS_IN, 64, 64)}
    return LoadedModel(module, examples, ["logits"], "tiny-fcn")
