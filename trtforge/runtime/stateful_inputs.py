"""A stateful run's inputs (`trtforge run --stateful`): token ids per input, from texts through the export's own
tokenizer or given as ids."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

import numpy as np

from trtforge.core.errors import UserError


def load_token_docs(path: Path, encode: Callable[[str], list[int]] | None, max_tokens: int | None = None) -> list[tuple[str, np.ndarray]]:
    """(name, ids) per input: a folder of .txt, a .txt file, or .jsonl lines {"text"} or {"input_ids"}."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"inputs {path} do not exist; pass a folder of .txt files or a .jsonl file.")
    items: list[tuple[str, Any]] = []
    files = sorted(p for p in path.iterdir() if p.suffix in (".txt", ".jsonl")) if path.is_dir() else [path]
    for f in files:
        if f.suffix == ".jsonl":
            for i, line in enumerate(f.read_text().splitlines()):
                if not line.strip():
                    continue
                try:
                    item = json.loads(line)
                except json.JSONDecodeError:
                    raise UserError(f"{f} line {i + 1} is not JSON; give one object per line with 'text' or 'input_ids'.") from None
                if "input_ids" not in item and "text" not in item:
                    raise UserError(f"{f} line {i + 1} has neither 'text' nor 'input_ids'.")
                items.append((item.get("name", f"{f.stem}_{i}"), item.get("input_ids", item.get("text"))))
        elif f.suffix == ".txt":
            items.append((f.stem, f.read_text()))
        else:
            raise UserError(f"inputs {f} is not a .txt or .jsonl file; give texts for --stateful.")
    if not items:
        raise UserError(f"inputs {path} hold no .txt or .jsonl files.")
    docs = []
    for name, content in items:
        if isinstance(content, str):
            if encode is None:
                raise UserError(f"{path} holds text, but the model's export saved no tokenizer; give .jsonl with input_ids.")
            content = encode(content)
        ids = np.asarray(content, dtype=np.int64)
        docs.append((name, ids[:max_tokens] if max_tokens else ids))
    return docs


def tokenizer_encoder(export_side: dict[str, Any] | None, export_path: Path | None) -> Callable[[str], list[int]] | None:
    """The export's saved tokenizer (tokenizer.json through the `tokenizers` library: no transformers needed)."""
    rel = (export_side or {}).get("tokenizer")
    if not rel or export_path is None:
        return None
    folder = export_path.parent / rel
    if not (folder / "tokenizer.json").is_file():
        raise UserError(f"tokenizer {folder} (named by {export_path}.json) has no tokenizer.json; re-run trtforge export --kv-cache.")
    import tokenizers

    tok = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    return lambda text: tok.encode(text, add_special_tokens=False).ids
