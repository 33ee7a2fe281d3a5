"""What loading a model gives: the module, example inputs, output names and kinds, the tokenizer."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class LoadedModel:
    module: Any  # torch.nn.Module
    example_inputs: dict[str, Any]  # name -> torch.Tensor
    output_names: list[str] = field(default_factory=list)
    source: str = ""
    tokenizer: Any = None
    # Kinds (token/pooled/logits/dense) the model itself knows for its outputs; a config's kinds win.
    output_kinds: dict[str, str] = field(default_factory=dict)
