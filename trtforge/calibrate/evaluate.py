"""Accuracy of a quantized model against its fp32 reference on held-out samples.

Sequence models (an output [B, S, H] and an `attention_mask` input) are judged on mean-pooled
embeddings, as sentence-embedding models are used: per sample, the mask-weighted mean over tokens,
then the cosine to the fp32 embedding. Other models: the cosine of each sample's flattened output.
Per output, the comparator's (verify/compare.py) metrics for the output's kind: a classifier is also judged on top-1
agreement and a segmentation net on per-pixel argmax agreement (a cosine alone let an INT8 ResNet
pass with top-1 agreement 0).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trtforge.backends.base import Runner
from trtforge.backends.onnxruntime import OrtRunner
from trtforge.verify.compare import Comparator, items
from trtforge.verify.metrics import rowwise_cosine


def _sample_cosines(reference: np.ndarray, candidate: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """Per sample: the cosine of mask-weighted mean embeddings for a [B, S, H] output with its mask, else
    of the flattened outputs (verify.compare.items pools, verify.metrics.rowwise_cosine compares)."""
    kind = "token" if reference.ndim == 3 and mask is not None and mask.shape == reference.shape[:2] else None
    return rowwise_cosine(items(kind, reference, mask), items(kind, candidate, mask))


@dataclass
class Accuracy:
    sample_cosines: np.ndarray
    per_output: dict[str, dict[str, float]] = field(default_factory=dict)

    @property
    def mean_cosine(self) -> float:
        return float(self.sample_cosines.mean())

    @property
    def min_cosine(self) -> float:
        return float(self.sample_cosines.min())

    def to_json(self) -> dict:
        return {
            "mean_cosine": self.mean_cosine,
            "min_cosine": self.min_cosine,
            "samples": int(self.sample_cosines.size),
            "per_output": self.per_output,
        }


def reference_outputs(runner: OrtRunner, batches: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    return [runner.run(batch) for batch in batches]


def evaluate(
    candidate: Runner,
    batches: list[dict[str, np.ndarray]],
    references: list[dict[str, np.ndarray]],
    kinds: dict[str, str | None] | None = None,
) -> Accuracy:
    """Held-out accuracy: the mean-pooled sample cosine of the first output (what the fallback search
    steers by), and per output the comparator's metrics for its kind (top-1 agreement for logits,
    per-pixel agreement for dense outputs)."""
    cosines = []
    first = candidate.output_names[0]
    comparator = Comparator({name: (kinds or {}).get(name) for name in candidate.output_names})
    for batch, ref in zip(batches, references):
        got = candidate.run(batch)
        mask = batch.get("attention_mask")
        cosines.append(_sample_cosines(ref[first], got[first], mask))
        comparator.add(ref, got, mask)
    return Accuracy(np.concatenate(cosines), comparator.result())
