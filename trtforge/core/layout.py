"""Which axis of a model's inputs is chunked, and where it sits in each input. Pure, no runtime.

A sequence model chunks its one dynamic non-batch axis (say 'seq'), an image model tiles the named
height and width of its [N, C, H, W] input. The axis is found by NAME in every input, at whatever dim
it sits: an input without it (a fixed-size side input) is fed whole to every chunk.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from trtforge.core.config import InputSpec


@dataclass(frozen=True)
class Layout:
    kind: str  # "sequence" | "image"
    batch_axis: str | None  # the axis name at dim 0 of every input, if dynamic
    chunk_axes: tuple[str, ...]  # ("seq",), ("height", "width"), or () when nothing can be chunked
    dims: dict[str, dict[str, int]]  # input name -> {chunk axis: dim index in that input}
    image_input: str | None = None  # the [N, C, H, W] input of an image model
    fixed_hw: tuple[int, int] | None = None  # an image model's fixed H, W (images are resized to it)
    ambiguous: tuple[str, ...] = ()  # several candidate sequence axes: chunking needs one
    sample_stride: int | None = None  # windows start at multiples of this (token outputs at a stride: runtime/audio.py)
    fixed_length: int | None = None  # the model takes exactly this many positions: windows of it, the last one padded

    @property
    def seq_axis(self) -> str | None:
        return self.chunk_axes[0] if self.kind == "sequence" and self.chunk_axes else None

    def sliced(self, feeds: dict[str, np.ndarray], spans: dict[str, tuple[int, int]]) -> dict[str, np.ndarray]:
        """Each input cut to `spans` (axis name -> (start, end)) along its own dim of that axis."""
        out = {}
        for name, array in feeds.items():
            index: list[slice] = [slice(None)] * array.ndim
            for axis, dim in self.dims.get(name, {}).items():
                if axis in spans:
                    index[dim] = slice(*spans[axis])
            out[name] = array[tuple(index)]
        return out

    def length(self, feeds: dict[str, np.ndarray], axis: str) -> int:
        """The size of a chunk axis in these feeds (the first input that has it)."""
        for name, dims in self.dims.items():
            if axis in dims and name in feeds:
                return int(feeds[name].shape[dims[axis]])
        raise KeyError(axis)


def _is_image(spec: InputSpec) -> bool:
    return len(spec.shape) == 4 and spec.dtype in ("float32", "float16")


def model_layout(specs: list[InputSpec]) -> Layout:
    firsts = {s.shape[0] for s in specs if s.shape}
    batch = next(iter(firsts)) if len(firsts) == 1 and isinstance(next(iter(firsts)), str) else None
    image = next((s for s in specs if _is_image(s)), None)
    if image is not None:
        h, w = image.shape[2], image.shape[3]
        if isinstance(h, str) and isinstance(w, str):
            axes: tuple[str, ...] = (h, w)
            fixed = None
        else:
            axes, fixed = (), (int(h), int(w)) if isinstance(h, int) and isinstance(w, int) else None
        return Layout("image", batch, axes, _dims(specs, axes), image.name, fixed)
    named: list[str] = []
    for spec in specs:
        for dim in spec.shape[1:]:
            if isinstance(dim, str) and dim != batch and dim not in named:
                named.append(dim)
    if len(named) == 1:
        return Layout("sequence", batch, (named[0],), _dims(specs, (named[0],)))
    return Layout("sequence", batch, (), {}, ambiguous=tuple(named))


def _dims(specs: list[InputSpec], axes: tuple[str, ...]) -> dict[str, dict[str, int]]:
    return {s.name: {a: s.shape.index(a) for a in axes if a in s.shape} for s in specs}
