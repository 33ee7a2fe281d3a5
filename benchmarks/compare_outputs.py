"""Two `trtforge run --save-outputs` files compared key by key: the same inputs and outputs, and how far apart
(max abs difference, elements not bit-equal). Exit 1 if any key differs by more than --atol, or the keys differ.
Used by the GPU validation (validate.sh runloop) to prove that the copy-engine merge writes what the host merge writes, from the same engine:

    python benchmarks/compare_outputs.py copy.npz host.npz --atol 0 --json equal.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np


def compare(a_path: Path, b_path: Path, atol: float) -> dict:
    a, b = np.load(a_path), np.load(b_path)
    keys_a, keys_b = set(a.files), set(b.files)
    rows = []
    for key in sorted(keys_a & keys_b):
        x, y = a[key], b[key]
        if x.shape != y.shape:
            rows.append({"key": key, "shape": [list(x.shape), list(y.shape)], "ok": False})
            continue
        diff = np.abs(x.astype(np.float64) - y.astype(np.float64))
        worst = float(np.nanmax(diff)) if diff.size else 0.0
        nan_mismatch = int((np.isnan(x) != np.isnan(y)).sum())
        same_bits = x.dtype == y.dtype and x.dtype.kind in "fiub"
        unequal = (x.view(f"u{x.dtype.itemsize}") != y.view(f"u{y.dtype.itemsize}")) if same_bits else (x != y)
        rows.append(
            {
                "key": key,
                "shape": list(x.shape),
                "max_abs": worst,
                "not_bit_equal": int(unequal.sum()),
                "compared": "bit patterns" if same_bits else "values",
                "nan_mismatch": nan_mismatch,
                "ok": worst <= atol and nan_mismatch == 0,
            }
        )
    return {
        "a": str(a_path),
        "b": str(b_path),
        "atol": atol,
        "only_in_a": sorted(keys_a - keys_b),
        "only_in_b": sorted(keys_b - keys_a),
        "keys": len(rows),
        "elements": int(sum(np.prod(r["shape"]) for r in rows if r.get("max_abs") is not None)),
        "worst": max((r.get("max_abs", float("inf")) for r in rows), default=0.0),
        "ok": bool(rows) and all(r["ok"] for r in rows) and keys_a == keys_b,
        "rows": rows,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("a", type=Path)
    ap.add_argument("b", type=Path)
    ap.add_argument("--atol", type=float, default=0.0)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    result = compare(args.a, args.b, args.atol)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    bad = [r for r in result["rows"] if not r["ok"]]
    print(
        f"{result['keys']} keys, {result['elements']:,} elements, worst |a-b| {result['worst']:.3g}; "
        f"{sum(r.get('not_bit_equal', 0) for r in result['rows']):,} not bit-equal; only in a/b: "
        f"{len(result['only_in_a'])}/{len(result['only_in_b'])}; {'EQUAL within' if result['ok'] else 'DIFFERENT beyond'} atol {args.atol}"
    )
    for r in bad[:10]:
        print("  ", r)
    sys.exit(0 if result["ok"] else 1)


if __name__ == "__main__":
    main()
