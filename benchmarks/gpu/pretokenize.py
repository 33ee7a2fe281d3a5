"""Texts -> the pre-tokenized JSONL `trtforge run` reads ({"name", "input_ids"} per line, ids without special tokens),
so that a run measures the loop without the tokenizer's cost (on a 16-CPU GPU machine
tokenizing was most of the planning threads' time).

    python benchmarks/gpu/pretokenize.py DOCS_DIR TOKENIZER_DIR OUT.jsonl
"""

import json
import sys
from pathlib import Path

from trtforge.runtime.tokenize import TextTokenizer


def main() -> None:
    docs, tok_dir, out = (Path(a) for a in sys.argv[1:4])
    tokenizer = TextTokenizer(tok_dir)
    lines = [json.dumps({"name": f.stem, "input_ids": tokenizer.document(f.read_text()).tolist()}) for f in sorted(docs.glob("*.txt"))]
    out.write_text("\n".join(lines) + "\n")
    print(f"{len(lines)} documents -> {out}")


if __name__ == "__main__":
    main()
