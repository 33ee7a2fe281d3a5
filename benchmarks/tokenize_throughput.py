"""Tokens/s of the tokenizer call `run`'s planning threads make (issue 11: on the H200 box tokenizing was most of the
planning time, and MiniLM's engine takes ~3.2 M tokens/s): encode_batch vs encode_batch_fast (no character offsets),
one thread, and N threads each tokenizing every document (both release the GIL, so N threads scale with cores).
Prints a table and writes JSON. No GPU needed.

    python benchmarks/tokenize_throughput.py TOKENIZER_DIR DOCS_DIR --out tok.json [--threads 1 2 4 8]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import threading
import time
from pathlib import Path

from tokenizers import Tokenizer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("tokenizer", type=Path)
    ap.add_argument("docs", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeat", type=int, default=3, help="best of this many passes")
    args = ap.parse_args()
    tok = Tokenizer.from_file(str(args.tokenizer / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    texts = [f.read_text() for f in sorted(args.docs.glob("*.txt"))]
    tokens = sum(len(e.ids) for e in tok.encode_batch(texts, add_special_tokens=False))
    rows = []
    for name in ("encode_batch", "encode_batch_fast"):
        if not hasattr(tok, name):
            continue
        fn = getattr(tok, name)

        def work() -> None:
            for text in texts:
                fn([text], add_special_tokens=False)

        for threads in args.threads:
            best = float("inf")
            for _ in range(args.repeat):
                pool = [threading.Thread(target=work) for _ in range(threads)]
                start = time.perf_counter()
                for t in pool:
                    t.start()
                for t in pool:
                    t.join()
                best = min(best, time.perf_counter() - start)
            rows.append({"call": name, "threads": threads, "seconds": best, "tokens_per_s": threads * tokens / best})
    print(f"{len(texts)} documents, {tokens} tokens, {os.cpu_count()} CPUs ({platform.node()})")
    print(f"{'call':<18} {'threads':>7} {'M tokens/s':>10}")
    for r in rows:
        print(f"{r['call']:<18} {r['threads']:>7} {r['tokens_per_s'] / 1e6:>10.3f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(args.out.suffix + ".tmp")
    tmp.write_text(json.dumps({"host": platform.node(), "cpus": os.cpu_count(), "documents": len(texts), "tokens": tokens,
                               "rows": rows}, indent=1))
    os.replace(tmp, args.out)


if __name__ == "__main__":
    main()
