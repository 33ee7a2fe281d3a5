"""Accuracy of a quantized model against its fp32 reference on held-out samples.

Sequence models (an output [B, S, H] and an `attention_mask` input) are judged on mean-pooled
embeddings, as sentence-embedding models are used: per sample, the mask-weighted mean over tokens,
then the cosine to the fp32 embedding. Other models: the cosine of each sample's flattened output.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.metrics import compare, vectors


def pooled(output: np.ndarray, mask: np.ndarray | None) -> np.ndarray:
    """[B, S, H] -> [B, H] mask-weighted mean; any other rank -> [B, -1]."""
    if output.ndim == 3 and mask is not None and mask.shape == output.shape[:2]:
        weights = mask.astype(np.float64)[..., None]
        return (output * weights).sum(axis=1) / np.maximum(weights.sum(axis=1), 1e-9)
    return output.reshape(output.shape[0], -1)


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    num = np.sum(a * b, axis=1)
    den = np.maximum(np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1), 1e-12)
    return num / den


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
        return {"mean_cosine": self.mean_cosine, "min_cosine": self.min_cosine, "samples": int(self.sample_cosines.size),
                "per_output": self.per_output}


def reference_outputs(runner: OrtRunner, batches: list[dict[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
    return [runner.run(batch) for batch in batches]


def evaluate(candidate: OrtRunner, batches: list[dict[str, np.ndarray]], references: list[dict[str, np.ndarray]]) -> Accuracy:
    cosines, refs, cands = [], {}, {}
    first = candidate.output_names[0]
    for batch, ref in zip(batches, references):
        got = candidate.run(batch)
        mask = batch.get("attention_mask")
        cosines.append(_cosines(pooled(ref[first].astype(np.float64), mask), pooled(got[first].astype(np.float64), mask)))
        for name in candidate.output_names:
            refs.setdefault(name, []).append(vectors(ref[name]))
            cands.setdefault(name, []).append(vectors(got[name]))
    per_output = {}
    for name in candidate.output_names:
        a, b = np.concatenate(refs[name]), np.concatenate(cands[name])
        # Rank-2 outputs with a small last axis are treated as logits (top-1 agreement).
        logits = references[0][name].ndim == 2 and 1 < references[0][name].shape[-1] <= 1000
        per_output[name] = compare(a, b, logits=logits)
    return Accuracy(np.concatenate(cosines), per_output)
