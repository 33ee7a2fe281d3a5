"""Helpers of `validate.sh stateful`: `tokenize TOKENIZER_DIR OUT.jsonl N` (inputs cut to N tokens, as input_ids)
and `table W` (the figures of the stateful reports, as markdown)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def tokenize(tok_dir: str, out: str, n: int) -> None:
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(Path(tok_dir) / "tokenizer.json"))
    lines = []
    for f in sorted((ROOT / "calib_data/minilm_long").glob("*.txt")):
        ids = tok.encode(f.read_text(), add_special_tokens=False).ids
        if len(ids) >= n:
            lines.append(json.dumps({"name": f.stem, "input_ids": ids[:n]}))
    Path(out).write_text("\n".join(lines[:2]) + "\n")  # two 4096-token inputs
    print(f"{len(lines[:2])} inputs of {n} tokens -> {out}")


def table(w: str) -> None:
    rows = []
    for label, name in (("TensorRT 8.6 fp16 (vs fp16 one-pass engine)", "stateful.json"), ("ONNX Runtime fp32 CPU", "stateful_ort.json")):
        path = Path(w) / name
        if not path.is_file():
            rows.append(f"| {label} | not produced (see steps.jsonl) |")
            continue
        r = json.loads(path.read_text())
        c, t, m, g = r["chunking_error"], r["throughput"], r["memory"], r["generation"] or {}
        per = ", ".join(
            f"p{p['profile']} past {p['axes']['past'][0]}..{p['axes']['past'][2]}: {p['tokens_per_s']:.0f}" for p in t["per_profile"]
        )
        rows.append(
            f"| {label} | {c['worst_input_rel_l2']:.2e} | {c.get('top1_agreement', float('nan')):.4f} | "
            f"{t['prefill_tokens_per_s']:.0f} ({per}) | {t['full_pass_tokens_per_s']:.0f} | "
            f"{g.get('decode_tokens_per_s') or 0:.0f} | {g.get('agreement', '-')} | "
            f"{m['stateful_prefill_peak_mb']:.0f} / {m['full_pass_peak_mb']:.0f} |"
        )
    print(
        "| run | chunking rel-L2 (worst input) | top-1 | prefill tok/s stateful (per profile) | one pass tok/s | decode tok/s | generate agreement | peak memory MiB stateful / one pass |"
    )
    print("|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))


if __name__ == "__main__":
    if sys.argv[1] == "tokenize":
        tokenize(sys.argv[2], sys.argv[3], int(sys.argv[4]))
    else:
        table(sys.argv[2])
