"""Decoders by default: grouped-query decoders (Qwen2, LLaMA-3 style) export with the default command, and
`export --kv-cache` without a kv_cache section picks cache and chunk ranges that fit the model's positions.

trtforge's imports sit inside the tests, so that each test fails on its own account where a name is missing."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import ROOT, assert_user_error, run_cli

# GPT-2 as published: its 50,257-token vocabulary and 1,024 positions (GPT2Config's defaults); one narrow layer
# keeps the CPU export in seconds, and the positions are what the cache ranges must fit.
STOCK_GPT2 = """
import torch
import transformers


def stock_gpt2():
    torch.manual_seed(0)
    config = transformers.GPT2Config(n_layer=1, n_embd=64, n_head=4)
    assert config.n_positions == 1024 and config.vocab_size == 50257
    module = transformers.GPT2LMHeadModel(config).eval()
    return module, {"input_ids": torch.randint(0, config.vocab_size, (2, 9))}, ["logits"]
"""


def _sidecar(onnx: Path) -> dict:
    return json.loads(onnx.with_name(onnx.name + ".json").read_text())


def test_gqa_attention_runs_unrolled_with_the_same_values():
    """The rewrite the legacy exporter gets: same values as enable_gqa, for causal and masked calls;
    calls without enable_gqa pass untouched and are not counted."""
    import torch
    import torch.nn.functional as F

    from trtforge.export.step import grouped_query_attention_unrolled

    torch.manual_seed(0)
    q, k, v = torch.randn(2, 6, 5, 16), torch.randn(2, 2, 7, 16), torch.randn(2, 2, 7, 16)
    mask = torch.randn(2, 1, 5, 7)
    expected = [
        F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
        F.scaled_dot_product_attention(q[..., :7, :], k, v, is_causal=True, enable_gqa=True),
    ]
    with grouped_query_attention_unrolled() as rewritten:
        got = [
            F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True),
            F.scaled_dot_product_attention(q[..., :7, :], k, v, is_causal=True, enable_gqa=True),
        ]
        F.scaled_dot_product_attention(q, q, q)
    assert rewritten == [2]
    for want, have in zip(expected, got):
        torch.testing.assert_close(have, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("factory", ["qwen2", "llama"])
def test_grouped_query_decoder_exports_with_the_default_command(factory, tmp_path):
    """Qwen2ForCausalLM and LlamaForCausalLM with fewer K/V heads than query heads: the default (legacy)
    exporter, checked against PyTorch at two batch and two seq sizes, and the sidecar says how."""
    import zoo.models as zoo

    config = getattr(zoo, factory)()[0].config
    assert config.num_key_value_heads < config.num_attention_heads  # the grouped-query case, not plain MHA
    out = tmp_path / f"{factory}.onnx"
    proc = run_cli("export", "--model", f"zoo/models.py:{factory}", "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    side = _sidecar(out)
    assert side["exporter"] == "legacy" and side["checked"]
    assert [r for r in side["exporter_rewrites"] if "enable_gqa" in r], side["exporter_rewrites"]
    assert any(line.startswith("note:") and "enable_gqa" in line for line in proc.stderr.splitlines()), proc.stderr
    sizes = {}
    for check in side["check"]:
        sizes.setdefault(check["axis"], set()).add(check["size"])
        assert check["metrics"]["logits"]["rel_l2"] <= side["check_tolerance"]
    assert len(sizes["batch"]) >= 2 and len(sizes["seq"]) >= 2


def test_qwen2_zoo_config_exports_with_the_default_exporter(tmp_path):
    from trtforge.core.config import load_config

    assert load_config(ROOT / "zoo/configs/qwen2.yaml").export.exporter == "legacy"
    out = tmp_path / "qwen2.onnx"
    proc = run_cli("export", "--config", "zoo/configs/qwen2.yaml", "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert {c["size"] for c in _sidecar(out)["check"] if c["axis"] == "seq"} == {7, 131, 256}  # the config's check sizes and the axis max


@pytest.mark.parametrize("model", ["zoo/models.py:qwen2", "stock_gpt2"])
def test_kv_cache_without_a_section_fits_the_models_positions(model, tmp_path):
    """Both models have 1,024 positions; the defaults (cache 1024 + chunk 512) do not fit them. Qwen2 runs with
    transformers' switch that passes enable_gqa to SDPA even beside a mask (as its integration does on backends
    whose SDPA takes both): the cache export must take grouped-query SDPA as the plain export does."""
    env = {}
    if model == "stock_gpt2":
        (tmp_path / "gpt2_stock.py").write_text(STOCK_GPT2)
        model = f"{tmp_path / 'gpt2_stock.py'}:stock_gpt2"
    else:
        env = {"TRANSFORMERS_SDPA_FORCE_GQA": "1"}
    out = tmp_path / "m.kv.onnx"
    proc = run_cli("export", "--kv-cache", "--model", model, "-o", str(out), "--json", env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    side = _sidecar(out)
    assert bool(side["exporter_rewrites"]) == bool(env), side["exporter_rewrites"]
    kv = side["kv_cache"]
    positions = kv["layout"]["max_positions"]
    assert positions == 1024
    past_max, seq_max = kv["past"]["max"], side["axes"]["seq"]["max"]
    assert past_max + seq_max <= positions and past_max >= 256 and seq_max >= 256, (past_max, seq_max)
    assert kv["ranges_chosen"] == [f"kv_cache.past.max {past_max}"]
    assert side["axes"]["past"]["max"] == past_max and max(kv["tiers"]["past"]) <= past_max
    note = [line for line in proc.stderr.splitlines() if line.startswith("note:") and "kv_cache.past.max" in line]
    assert note and f"{positions} positions" in note[0], proc.stderr


def _kv_config(tmp_path: Path, kv_cache: str) -> Path:
    path = tmp_path / "qwen2-kv.yaml"
    path.write_text(f"""name: qwen2-kv
model: {{source: {ROOT / "zoo/models.py"}:qwen2}}
inputs:
  - {{name: input_ids, dtype: int64, shape: [batch, seq]}}
axes:
  batch: {{min: 1, opt: 1, max: 2}}
  seq: {{min: 1, opt: 64, max: 512}}
{kv_cache}""")
    return path


def test_a_set_cache_max_that_does_not_fit_is_refused_naming_the_key(tmp_path):
    config = _kv_config(tmp_path, "kv_cache:\n  enabled: true\n  past: {min: 0, opt: 512, max: 1024}\n")
    proc = run_cli("export", "--config", str(config), "-o", str(tmp_path / "m.kv.onnx"))
    assert_user_error(proc, "kv_cache.past.max 1024", "1024 positions", "lower kv_cache.past.max")
    assert not (tmp_path / "m.kv.onnx").exists()


def test_unset_ranges_reads_what_the_config_file_sets(tmp_path):
    from trtforge.export.kvcache import kv_config, unset_ranges

    bare = kv_config("zoo/models.py:qwen2", None)
    assert unset_ranges(None, bare) == {"past.max", "past.opt", "seq"}
    none = _kv_config(tmp_path, "")
    assert unset_ranges(none, kv_config(None, none)) == {"past.max", "past.opt"}
    some = _kv_config(tmp_path, "kv_cache:\n  past: {max: 600}\n")
    assert unset_ranges(some, kv_config(None, some)) == {"past.opt"}


def _bare(seq_max: int = 512):
    from trtforge.core.config import ModelConfig

    return ModelConfig(
        name="m",
        model={"source": "m.py:f"},
        inputs=[{"name": "input_ids", "dtype": "int64", "shape": ["batch", "seq"]}],
        axes={"batch": {"min": 1, "opt": 1, "max": 8}, "seq": {"min": 1, "opt": 128, "max": seq_max}},
    )


def test_fit_ranges_keeps_defaults_that_fit_and_shares_small_position_tables():
    from trtforge.export.kvcache import RANGE_KEYS, fit_ranges

    roomy, chosen = fit_ranges(_bare(), 4096, set(RANGE_KEYS))
    assert (roomy.kv_cache.past.max, roomy.axes["seq"].max, chosen) == (1024, 512, [])
    small, chosen = fit_ranges(_bare(), 100, set(RANGE_KEYS))
    assert (small.kv_cache.past.max, small.axes["seq"].max) == (50, 50)
    assert small.kv_cache.past.opt <= 50 and small.axes["seq"].opt <= 50
    assert chosen == ["kv_cache.past.max 50", "axes.seq.max 50"]
    config_seq, chosen = fit_ranges(_bare(256), 1024, {"past.max", "past.opt"})  # a config file's own seq axis
    assert (config_seq.kv_cache.past.max, config_seq.axes["seq"].max, chosen) == (768, 256, ["kv_cache.past.max 768"])


def test_fit_ranges_refuses_set_values_that_leave_no_room():
    from trtforge.core.config import CacheRange
    from trtforge.core.errors import UserError
    from trtforge.export.kvcache import fit_ranges

    with pytest.raises(UserError, match=r"axes\.seq\.max 1024 leaves no position for a cache"):
        fit_ranges(_bare(1024), 1024, {"past.max", "past.opt"})
    opt_set = _bare(256)
    opt_set.kv_cache.past = CacheRange(min=0, opt=900, max=1024)
    with pytest.raises(UserError, match=r"kv_cache\.past\.opt 900 exceeds the 768"):
        fit_ranges(opt_set, 1024, {"past.max"})
    tiers_set = _bare(256)
    tiers_set.kv_cache.past_tiers = [0, 1024]
    with pytest.raises(UserError, match=r"kv_cache\.past_tiers go up to 1024 but 768"):
        fit_ranges(tiers_set, 1024, {"past.max", "past.opt"})
