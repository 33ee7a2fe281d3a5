"""KV-cache export (issue 12): explicit past/present per layer, checked against the plain transformers
model called with a DynamicCache; prefill/decode profiles; the cache engine built with tensorrt-rtx."""

import json

import numpy as np
import pytest
from conftest import ROOT, assert_user_error, require, run_cli

from trtforge.build.kv_profiles import plan_kv_profiles, select_phase_profile, suggest_tier
from trtforge.build.profiles import tier_ranges
from trtforge.core.config import AxisRange, CacheRange, InputSpec
from trtforge.core.errors import UserError

MODELS = {"gpt2": "zoo/configs/gpt2-kv.yaml", "llama": "zoo/configs/llama-kv.yaml"}


def _export(tmp_path_factory, name):
    out = tmp_path_factory.mktemp(f"kv-{name}") / f"{name}.kv.onnx"
    proc = run_cli("export", "--config", str(ROOT / MODELS[name]), "-o", str(out), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


@pytest.fixture(scope="session")
def gpt2_kv(tmp_path_factory):
    return _export(tmp_path_factory, "gpt2")


@pytest.fixture(scope="session")
def llama_kv(tmp_path_factory):
    return _export(tmp_path_factory, "llama")


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_export_checks_seq_and_past_alone(name, request):
    path = request.getfixturevalue(f"{name}_kv")
    side = json.loads(path.with_name(path.name + ".json").read_text())
    kv = side["kv_cache"]
    layers = kv["layout"]["layers"]
    inputs = [s["name"] for s in side["inputs"]]
    assert inputs == ["input_ids", "position_ids"] + [f"past_{k}_{i}" for i in range(layers) for k in ("key", "value")]
    assert [o["name"] for o in side["outputs"]] == ["logits"] + [f"present_{k}_{i}" for i in range(layers) for k in ("key", "value")]
    assert side["inputs"][2]["shape"] == ["batch", kv["layout"]["kv_heads"], "past", kv["layout"]["head_dim"]]
    if name == "llama":  # grouped-query attention: the cache has fewer heads than attention
        assert kv["layout"]["kv_heads"] < kv["layout"]["heads"]
    sizes = {}
    for c in side["check"]:
        sizes.setdefault(c["axis"], set()).add(c["size"])
        base = {a: s for a, s in c["sizes"].items() if a != c["axis"]}
        assert base == {a: s for a, s in {"batch": 1, "past": 4, "seq": 6}.items() if a != c["axis"]}  # the others stay put
        assert max(m["rel_l2"] for m in c["metrics"].values()) <= 1e-4
    assert len(sizes["seq"]) >= 2 and len(sizes["past"]) >= 2 and 0 in sizes["past"] and len(sizes["batch"]) >= 2
    assert (path.parent / side["tokenizer"] / "tokenizer.json").is_file()


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_onnx_matches_transformers_dynamic_cache(name, request):
    """Independent of the export's own check: the zoo model, a DynamicCache of past 0 and of past 19."""
    import onnxruntime as ort
    import torch
    from transformers import DynamicCache

    import zoo.models as zoo

    path = request.getfixturevalue(f"{name}_kv")
    module = (zoo.gpt2_lm if name == "gpt2" else zoo.llama)()[0]
    cfg = module.config
    kv_heads = getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    sess = ort.InferenceSession(str(path))
    rng = np.random.default_rng(1)
    for past, seq in [(0, 9), (19, 1), (19, 6)]:
        ids = rng.integers(0, cfg.vocab_size, (1, seq))
        pos = np.arange(past, past + seq)[None]
        cache = DynamicCache(config=cfg)
        feeds = {"input_ids": ids, "position_ids": pos}
        for i in range(cfg.num_hidden_layers):
            k, v = (rng.standard_normal((1, kv_heads, past, head_dim)).astype(np.float32) for _ in range(2))
            feeds[f"past_key_{i}"], feeds[f"past_value_{i}"] = k, v
            if past:
                cache.update(torch.from_numpy(k), torch.from_numpy(v), i)
        with torch.no_grad():
            ref = module(input_ids=torch.from_numpy(ids), position_ids=torch.from_numpy(pos), cache=cache, use_cache=True)
        got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
        assert got["present_key_1"].shape == (1, kv_heads, past + seq, head_dim)
        np.testing.assert_allclose(got["logits"], ref.logits.numpy(), rtol=1e-4, atol=1e-5)
        np.testing.assert_allclose(got["present_value_1"], cache.layers[1].values.numpy(), rtol=1e-5, atol=1e-6)


def _kv_setup():
    specs = [
        InputSpec(name="input_ids", dtype="int64", shape=["batch", "seq"]),
        InputSpec(name="past_key_0", shape=["batch", 2, "past", 16]),
    ]
    axes = {
        "batch": AxisRange(min=1, opt=1, max=4),
        "seq": AxisRange(min=1, opt=128, max=512),
        "past": CacheRange(min=0, opt=512, max=4096),
    }
    kv = {"seq_axis": "seq", "past_axis": "past", "tiers": {"seq": [512], "past": [0, 4096]}}
    return specs, axes, kv


def test_prefill_and_decode_profiles_per_phase():
    specs, axes, kv = _kv_setup()
    tiers = {"seq": tier_ranges([128, 512], axes["seq"], "seq"), "past": tier_ranges([0, 1024, 4096], axes["past"], "past")}
    profiles, phases = plan_kv_profiles(specs, axes, tiers, kv)
    assert len(phases["prefill"]) == 6 and len(phases["decode"]) == 1 and len(profiles) == 7
    assert [p.index for p in profiles] == list(range(7))
    decode = profiles[phases["decode"][0]]
    assert (decode.axes["seq"].min, decode.axes["seq"].max) == (1, 1) and decode.axes["past"].max == 4096
    assert decode.shapes["past_key_0"][2] == (4, 2, 4096, 16)
    first = select_phase_profile(profiles, phases, "prefill", 128, 0)
    assert first.axes["past"].max == 0 and first.axes["seq"].max == 128
    assert select_phase_profile(profiles, phases, "prefill", 300, 2048).axes["past"].min == 1025
    # A one-token step is served by the decode profile in the decode phase, by a prefill one in prefill.
    assert select_phase_profile(profiles, phases, "decode", 1, 1500).index == decode.index
    assert select_phase_profile(profiles, phases, "prefill", 1, 1500).index in phases["prefill"]
    # Default tiers come from the export's kv_cache section.
    default, ph = plan_kv_profiles(specs, axes, {}, kv)
    assert [(p.axes["past"].min, p.axes["past"].max) for p in default] == [(0, 0), (1, 4096), (1, 4096)]


def test_phase_profile_errors_say_what_to_rebuild():
    specs, axes, kv = _kv_setup()
    profiles, phases = plan_kv_profiles(specs, axes, {}, kv)
    with pytest.raises(UserError, match=r"chunk 600 is larger than the prefill seq max of the engine \(512\); pass --chunk 512"):
        select_phase_profile(profiles, phases, "prefill", 600, 0)
    with pytest.raises(
        UserError,
        match=r"cache of 5000 tokens .* past max of the engine is 4096; add a past tier of 5120 "
        r"\(rebuild with --tiers 'past=0,4096,5120'\)",
    ):
        select_phase_profile(profiles, phases, "prefill", 128, 5000)
    with pytest.raises(UserError, match="re-export with kv_cache.past.max >= 5120"):
        select_phase_profile(profiles, phases, "decode", 1, 5000, where="the export of m.onnx", engine=False)
    assert suggest_tier(900) == 1024 and suggest_tier(300) == 512 and suggest_tier(4097) == 5120


def test_kv_cache_on_a_model_without_cache_is_a_user_error(tmp_path):
    proc = run_cli("export", "--model", "zoo/models.py:bert", "--kv-cache", "-o", str(tmp_path / "b.onnx"))
    assert_user_error(proc, "zoo/models.py:bert", "is not a causal decoder with a key/value cache", "GPT2LMHeadModel")
    assert not (tmp_path / "b.onnx").exists()


def test_cache_engine_builds_with_prefill_and_decode_profiles(llama_kv, tmp_path):
    """CI done-when: tensorrt-rtx builds the cache engine (past 0 profiles included) with both phases."""
    require("tensorrt_rtx")
    engine = tmp_path / "llama.kv.engine"
    proc = run_cli("build", str(llama_kv), "--tiers", "seq=64,128;past=0,512,1536", "-o", str(engine), "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    side = json.loads(proc.stdout)
    assert side["backend"] == "tensorrt_rtx" and engine.stat().st_size == side["engine_bytes"]
    phases = side["phases"]
    assert len(phases["prefill"]) == 6 and len(phases["decode"]) == 1
    by_index = {p["index"]: p for p in side["profiles"]}
    assert sorted(
        (by_index[i]["axes"]["seq"][2], by_index[i]["axes"]["past"][0], by_index[i]["axes"]["past"][2]) for i in phases["prefill"]
    ) == [(64, 0, 0), (64, 1, 512), (64, 513, 1536), (128, 0, 0), (128, 1, 512), (128, 513, 1536)]
    decode = by_index[phases["decode"][0]]
    assert decode["axes"]["seq"] == [1, 1, 1] and decode["shapes"]["past_key_0"]["max"] == [4, 2, 1536, 16]
    io = {t["name"]: t for t in side["io"]}
    assert io["present_value_1"]["mode"] == "output" and io["past_key_0"]["dtype"] == "float32"


def test_an_fp16_cache_engine_fuses_attention_in_prefill_and_decode(llama_kv, tmp_path):
    """TensorRT-RTX fuses the cache engine's attentions in every profile, the decode profile (one query against the
    cache) with its own kernel; the build counts them per profile from the engine's layers."""
    require("tensorrt_rtx")
    proc = run_cli(
        "build", str(llama_kv), "--precision", "fp16", "--tiers", "seq=64;past=0,512", "-o", str(tmp_path / "kv16.engine"), "--json"
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = json.loads(proc.stdout)["attention_fusion"]
    engine = record["engine"]
    assert record["route"] == "native" and len(record["attentions"]) == 2
    assert engine["profiles"] == 3 and engine["by_profile"] == [2, 2, 2] and engine["complete"], engine  # 2 prefill, 1 decode
    assert set(engine["kinds"]) == {"_gemm_mha_v2", "_gemv_mha_v1"}
