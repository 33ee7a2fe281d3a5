"""benchmarks/calibration.py: trtforge's streamed entropy calibration against ONNX Runtime's.

Same model (the cleaned MiniLM), same samples (256 windows of 128 real tokens from calib_data/minilm),
same method (entropy, 2048 bins). ORT's is `onnxruntime.quantization.calibrate.create_calibrator` with
CalibrationMethod.Entropy, which keeps every intermediate output in memory before building histograms;
trtforge streams them. Each side runs in its own process so peak RSS is its own. Reports wall time, peak
RSS and scale agreement (relative difference of amax on the tensors both calibrate), prints a table,
writes JSON. Aims: <= 1/3 of ORT's time, <= 1/4 of its memory.

    python benchmarks/calibration.py out/minilm.clean.onnx [--samples 256] [--tokens 128]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def samples(count: int, tokens: int) -> list[dict[str, np.ndarray]]:
    """Windows of `tokens` real tokens ([CLS] + text + [SEP]) over the calibration text, stride 3/4."""
    from trtforge.calibrate.data import read_texts, scan
    from trtforge.models.minilm import load_tokenizer

    tok = load_tokenizer()
    ids = []
    for text in read_texts(scan(ROOT / "calib_data" / "minilm")):
        ids += tok(text, add_special_tokens=False, verbose=False)["input_ids"]
    body, stride = tokens - 2, (tokens - 2) * 3 // 4
    out = []
    for start in range(0, len(ids) - body, stride):
        x = np.array([[tok.cls_token_id] + ids[start : start + body] + [tok.sep_token_id]], dtype=np.int64)
        out.append({"input_ids": x, "attention_mask": np.ones_like(x)})
        if len(out) == count:
            break
    return out


def run_trtforge(onnx_path: str, count: int, tokens: int) -> dict:
    from trtforge.calibrate.collect import collect, plan_quantization
    from trtforge.calibrate.data import batches
    from trtforge.calibrate.methods import entropy_amax
    from trtforge.core.onnxio import load_onnx

    data = samples(count, tokens)
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    model = load_onnx(onnx_path)
    plan = plan_quantization(model)
    tensors = plan.activation_tensors()
    stats = collect(model, list(batches(data, 16)), tensors)
    amax = {t: entropy_amax(stats.histograms[t]) for t in tensors}
    return {
        "seconds": time.perf_counter() - start,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_growth_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024,
        "amax": amax,
    }


def run_ort(onnx_path: str, count: int, tokens: int) -> dict:
    import tempfile

    from onnxruntime.quantization.calibrate import CalibrationDataReader, CalibrationMethod, create_calibrator

    data = samples(count, tokens)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(data)

        def get_next(self):
            return next(self.it, None)

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        calibrator = create_calibrator(
            onnx_path,
            op_types_to_calibrate=["MatMul"],
            augmented_model_path=f"{tmp}/aug.onnx",
            calibrate_method=CalibrationMethod.Entropy,
            extra_options={"num_bins": 2048},
        )
        calibrator.collect_data(Reader())
        ranges = calibrator.compute_data()
    amax = {}
    for name, value in ranges.data.items():
        low, high = value.range_value if hasattr(value, "range_value") else value
        amax[name] = float(max(abs(float(np.asarray(low).max())), abs(float(np.asarray(high).max()))))
    return {
        "seconds": time.perf_counter() - start,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "rss_growth_mb": (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024,
        "amax": amax,
    }


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_child":
        fn = run_trtforge if sys.argv[2] == "trtforge" else run_ort
        print(json.dumps(fn(sys.argv[3], int(sys.argv[4]), int(sys.argv[5]))))
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("onnx", type=Path)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--json", type=Path, default=ROOT / "out" / "bench" / "calibration_cpu.json")
    args = parser.parse_args()
    results = {}
    for side in ("trtforge", "onnxruntime"):
        proc = subprocess.run(
            [sys.executable, __file__, "_child", side, str(args.onnx), str(args.samples), str(args.tokens)], capture_output=True, text=True
        )
        if proc.returncode != 0:
            raise SystemExit(f"{side} failed:\n{proc.stderr[-3000:]}")
        results[side] = json.loads(proc.stdout.strip().splitlines()[-1])
    ours, theirs = results["trtforge"]["amax"], results["onnxruntime"]["amax"]
    common = sorted(set(ours) & set(theirs))
    rel = np.array([abs(ours[t] - theirs[t]) / max(theirs[t], 1e-12) for t in common])
    summary = {
        "samples": args.samples,
        "tokens": args.tokens,
        "tensors_compared": len(common),
        "trtforge_seconds": results["trtforge"]["seconds"],
        "ort_seconds": results["onnxruntime"]["seconds"],
        "time_ratio": results["trtforge"]["seconds"] / results["onnxruntime"]["seconds"],
        "trtforge_peak_rss_mb": results["trtforge"]["peak_rss_mb"],
        "ort_peak_rss_mb": results["onnxruntime"]["peak_rss_mb"],
        "memory_ratio": results["trtforge"]["peak_rss_mb"] / results["onnxruntime"]["peak_rss_mb"],
        "amax_rel_diff_median": float(np.median(rel)) if rel.size else None,
        "amax_rel_diff_p90": float(np.percentile(rel, 90)) if rel.size else None,
        "amax_within_10pct": float(np.mean(rel <= 0.10)) if rel.size else None,
    }
    print(f"{args.samples} samples x {args.tokens} tokens, entropy, 2048 bins, {len(common)} tensors compared")
    print(f"{'':28s}{'trtforge':>12s}{'ORT':>12s}{'ratio':>10s}")
    print(f"{'wall time (s)':28s}{summary['trtforge_seconds']:12.1f}{summary['ort_seconds']:12.1f}{summary['time_ratio']:10.3f}")
    print(f"{'peak RSS (MB)':28s}{summary['trtforge_peak_rss_mb']:12.0f}{summary['ort_peak_rss_mb']:12.0f}{summary['memory_ratio']:10.3f}")
    if rel.size:
        print(
            f"amax relative difference: median {summary['amax_rel_diff_median']:.3f}, p90 {summary['amax_rel_diff_p90']:.3f}, "
            f"within 10%: {summary['amax_within_10pct']:.0%}"
        )
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
