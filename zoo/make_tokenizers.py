"""Train the zoo's byte-level BPE tokenizers (RoBERTa-style and GPT-2-style) on the shipped prose.

Real RoBERTa/GPT-2 vocabularies cannot be downloaded here, and the zoo's models are random-init, so
what matters is the tokenizer's *behaviour*: RoBERTa's specials <s>=0, <pad>=1, </s>=2 and GPT-2's
absence of any. Deterministic: the same text gives the same files. Run from the repository root:
    python zoo/make_tokenizers.py
"""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import ByteLevelBPETokenizer
from tokenizers.processors import RobertaProcessing
from transformers import PreTrainedTokenizerFast

ROOT = Path(__file__).resolve().parent
VOCAB = 4096


def corpus() -> list[str]:
    lines = []
    for path in sorted((ROOT.parent / "calib_data" / "minilm").glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                lines.append(json.loads(line)["text"])
    return lines


def train(specials: list[str]) -> ByteLevelBPETokenizer:
    tok = ByteLevelBPETokenizer()
    tok.train_from_iterator(corpus(), vocab_size=VOCAB, min_frequency=2, special_tokens=specials, show_progress=False)
    return tok


def main() -> None:
    roberta = train(["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    # RoBERTa: <s> text </s>, pairs <s> a </s></s> b </s>; the ids come from training order: 0, 1, 2, 3, 4.
    roberta._tokenizer.post_processor = RobertaProcessing(("</s>", 2), ("<s>", 0), trim_offsets=True, add_prefix_space=False)
    gpt2 = train(["<|endoftext|>"])  # GPT-2 adds no special tokens to a text
    for name, raw, specials, max_len in (
        (
            "roberta-bpe",
            roberta,
            dict(
                bos_token="<s>",
                eos_token="</s>",
                cls_token="<s>",
                sep_token="</s>",
                pad_token="<pad>",
                unk_token="<unk>",
                mask_token="<mask>",
            ),
            512,
        ),
        ("gpt2-bpe", gpt2, dict(bos_token="<|endoftext|>", eos_token="<|endoftext|>", unk_token="<|endoftext|>"), 1024),
    ):
        out = ROOT / "tokenizers" / name
        out.mkdir(parents=True, exist_ok=True)
        fast = PreTrainedTokenizerFast(tokenizer_object=raw._tokenizer, model_max_length=max_len, **specials)
        fast.save_pretrained(str(out))
        ids = fast("Hello world")["input_ids"]
        print(name, len(fast), ids, {k: fast.convert_tokens_to_ids(v) for k, v in fast.special_tokens_map.items() if isinstance(v, str)})


if __name__ == "__main__":
    main()
