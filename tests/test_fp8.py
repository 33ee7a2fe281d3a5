"""FP8 GEMMs (trtforge.fusion.fp8, `build --gemm-precision fp8`, issue 11): the GEMM plugins' nodes become
TrtforgeGemmFp8 with per-tensor scales from observed peaks. ORT cannot run the plugin: each node is emulated by its
contract (tests/attention_emulation.py: e4m3 rounding written in ONNX ops for x, ml_dtypes for W) and the graph
compared with the fp32 original on feeds the scales never saw."""

import numpy as np
import onnx
import pytest
from attention_emulation import (
    e4m3_nodes,
    emulate_fp8_plugins,
    emulate_gelu_plugins,
    emulate_gemm_gelu_plugins,
    emulate_gemm_plugins,
    emulate_skip_layernorm_plugins,
    fp16_plugin_chain,
    rel_l2,
    zoo_sizes,
)
from conftest import ROOT, assert_user_error, export_zoo, run_cli
from onnx import helper, numpy_helper

from trtforge.backends.onnxruntime import OrtRunner
from trtforge.fusion import fp8
from trtforge.graph.index import io_specs
from trtforge.runtime.feeds import random_feeds


def test_quantize_e4m3_rounds_to_nearest_even_and_saturates():
    x = np.array([0.3, 1.0, 0.0664, 500.0, -1000.0, 447.0, 1e-5], np.float32)
    got = fp8.quantize_e4m3(x, 1.0)
    # e4m3 steps: 0.3 -> 0.3125 (step 1/32 in [0.25, 0.5)); 0.0664 ties between 0.0625 and 0.0703 -> even 0.0625;
    # beyond 448 saturates; 1e-5 is under the smallest subnormal 2^-9 / 2 -> 0
    assert got.tolist() == [0.3125, 1.0, 0.0625, 448.0, -448.0, 448.0, 0.0]
    assert fp8.quantize_e4m3(np.array([3.0], np.float32), 0.5).tolist() == [6.0]  # x / scale


def test_the_emulation_rounds_as_ml_dtypes_does():
    """The ONNX-op e4m3 rounding the graph tests use equals ml_dtypes' cast (and so ONNX's own FLOAT8E4M3FN Cast)."""
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [rng.normal(0, s, 20000) for s in (1e-3, 0.1, 1, 30, 300)]
        + [2.0 ** np.arange(-12, 9), -(2.0 ** np.arange(-12, 9)) * 1.0625, [0.0, 447.9, 449, 465, 1e4]]
    ).astype(np.float32)
    inits = []

    def const(name, value):
        inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    nodes, out = e4m3_nodes("x", np.float32(1 / 0.7), "q_", const)
    graph = helper.make_graph(
        nodes,
        "e4m3",
        [helper.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [None])],
        [helper.make_tensor_value_info(out, onnx.TensorProto.FLOAT, [None])],
        inits,
    )
    got = OrtRunner(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString()).run({"x": x})[out]
    np.testing.assert_array_equal(got, fp8.quantize_e4m3(x, 0.7))


def test_scales_put_the_peaks_where_e4m3_can_hold_them():
    w = np.array([[0.5, -2.24], [1.0, 0.0]], np.float16)
    assert fp8.weight_scale(w) == pytest.approx(2.24 / 448, rel=1e-3)
    assert fp8.weight_scale(np.zeros((2, 2), np.float16)) == 1.0
    assert fp8.activation_scale(10.0) == pytest.approx(fp8.HEADROOM * 10.0 / 448)
    x = np.linspace(-10, 10, 101, dtype=np.float32)  # the observed peak is represented, not clipped
    assert np.abs(fp8.quantize_e4m3(x, fp8.activation_scale(10.0))).max() * fp8.activation_scale(10.0) == pytest.approx(10.0)


def test_fp8_gemm_is_close_to_the_fp32_product_but_not_equal():
    rng = np.random.default_rng(0)
    x, w, b = rng.normal(size=(64, 256)).astype(np.float32), rng.normal(0, 0.05, (256, 128)).astype(np.float32), rng.normal(size=128)
    exact = x @ w + b
    got = fp8.fp8_gemm(x, w, b, False, fp8.activation_scale(np.abs(x).max()), fp8.weight_scale(w)).astype(np.float32)
    assert 1e-3 < rel_l2(got, exact) < 0.05
    # a scale far too small saturates most of x: the product is wrong, and the error shows it
    clipped = fp8.fp8_gemm(x, w, b, False, fp8.activation_scale(np.abs(x).max()) / 100, fp8.weight_scale(w)).astype(np.float32)
    assert rel_l2(clipped, exact) > 0.3


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return export_zoo(tmp_path_factory.mktemp("fp8"), [("bert", "legacy")])[("bert", "legacy")]


def _fused(path):
    """The zoo BERT as build fuses it for fp16 (GELU with its GEMM, skip-LayerNorm, then the GEMM pass)."""
    model, converted, stages, specs, axes = fp16_plugin_chain(path)
    return model, converted, stages["gemm"][0], specs, axes


def _emulate(model):
    return emulate_gelu_plugins(emulate_skip_layernorm_plugins(emulate_gemm_plugins(emulate_gemm_gelu_plugins(emulate_fp8_plugins(model)))))


def test_every_gemm_plugin_becomes_fp8_and_the_graph_stays_close_to_fp32(bert):
    model, converted, fused, specs, axes = _fused(bert)
    gemms = fp8.plugin_gemms(fused)
    assert {g.node.op_type for g in gemms} == {"TrtforgeGemm", "TrtforgeGemmGelu"}
    scale_feeds = [random_feeds(specs, zoo_sizes(axes, 32), seed) for seed in (0, 1)]
    peaks = fp8.observe_peaks(converted, scale_feeds, [g.x for g in gemms])
    assert set(peaks) == {g.x for g in gemms} and all(v > 0 for v in peaks.values())
    out, report = fp8.to_fp8(fused, peaks)
    assert len(report.replaced) == len(gemms) and not report.refused
    assert [n.op_type for n in out.graph.node].count(fp8.PLUGIN) == len(gemms)
    assert not fp8.plugin_gemms(out)
    for r in report.replaced:
        assert r["x_scale"] == pytest.approx(fp8.HEADROOM * peaks[r["x"]] / 448)
    unseen = random_feeds(specs, dict(zoo_sizes(axes, 23), batch=3), seed=9)
    want = OrtRunner(model.SerializeToString()).run(unseen)
    fp16 = OrtRunner(_emulate(fused).SerializeToString()).run(unseen)
    got = OrtRunner(_emulate(out).SerializeToString()).run(unseen)
    for name, ref in want.items():
        err, err16 = rel_l2(got[name], ref), rel_l2(fp16[name], ref)
        # e4m3 keeps 3 mantissa bits: ~3% per GEMM on random operands, 5.5% on the pooled output after 2 layers
        assert err < 0.08, (name, err)
        assert err > err16, (name, err, err16)  # the emulation quantizes: FP8 is less exact than fp16
    # Scales 50x too small saturate the activations, and the emulated graph shows it.
    for node in out.graph.node:
        for a in node.attribute:
            if a.name == "x_scale":
                a.f /= 50
    bad = OrtRunner(_emulate(out).SerializeToString()).run(unseen)
    assert rel_l2(bad["last_hidden_state"], want["last_hidden_state"]) > 0.2


def test_gemms_fp8_cannot_take_stay_fp16_with_the_reason(bert):
    _, converted, fused, specs, axes = _fused(bert)
    gemms = fp8.plugin_gemms(fused)
    peaks = fp8.observe_peaks(converted, [random_feeds(specs, zoo_sizes(axes, 16))], [g.x for g in gemms])
    unobserved = gemms[0].x
    del peaks[unobserved]
    out, report = fp8.to_fp8(fused, peaks)
    assert [r["node"] for r in report.refused] == [g.node.name for g in gemms if g.x == unobserved]  # Q, K and V read one x
    assert "not a tensor of the observed graph" in report.refused[0]["reason"]
    assert next(n for n in out.graph.node if n.name == gemms[0].node.name).op_type == gemms[0].node.op_type
    # K or N off cuBLASLt's multiple of 16
    odd = fp8.PluginGemm(gemms[0].node, "x", np.zeros((24, 64), np.float16), None, False)
    assert "multiples of 16" in fp8.refusal(odd, 1.0)
    assert "non-zero peak" in fp8.refusal(gemms[0], 0.0)


def test_fp8_skip_names_what_is_missing():
    assert "precision best" in fp8.fp8_skip("best", "tensorrt", "8.6.1", "9.0", True)
    assert "TensorRT 8.x" in fp8.fp8_skip("fp16", "tensorrt_rtx", "1.2.0", "9.0", True)
    assert "no FP8 tensor cores" in fp8.fp8_skip("fp16", "tensorrt", "8.6.1", "8.0", True)
    assert "--plugin-library" in fp8.fp8_skip("fp16", "tensorrt", "8.6.1", "9.0", False)
    assert fp8.fp8_skip("fp16", "tensorrt", "8.6.1", "8.9", True) is None


def test_build_refuses_fp8_where_it_cannot_run(bert, tmp_path):
    """CI builds with TensorRT-RTX: no GEMM plugins there, so --gemm-precision fp8 is a user error (exit 2), and an
    unknown value is one too."""
    r = run_cli("build", str(bert), "--precision", "fp16", "--gemm-precision", "fp8", "-o", str(tmp_path / "e.engine"))
    assert_user_error(r, "--gemm-precision fp8 cannot apply", "TensorRT 8.x")
    r = run_cli("build", str(bert), "--precision", "fp16", "--gemm-precision", "int4", "-o", str(tmp_path / "e.engine"))
    assert_user_error(r, "--gemm-precision must be 'fp16' or 'fp8', got 'int4'")
    assert not (tmp_path / "e.engine").exists()


class _Engine:
    """A stand-in engine: the reference ONNX's outputs, plus noise of a given size."""

    def __init__(self, onnx_path, noise):
        self.ort, self.noise = OrtRunner(onnx.load(onnx_path).SerializeToString()), noise
        self.input_names, self.output_names = self.ort.input_names, self.ort.output_names

    def run(self, feeds):
        rng = np.random.default_rng(1)
        return {k: v + self.noise * rng.normal(size=v.shape).astype(np.float32) * np.abs(v).mean() for k, v in self.ort.run(feeds).items()}


@pytest.mark.parametrize("noise, status", [(0.01, "passed"), (3.0, "failed")])
def test_the_fp8_engine_check_gates_on_the_engine(bert, tmp_path, noise, status):
    from trtforge.calibrate.engine_check import EngineHooks, after_fp8_build

    model = onnx.load(bert)
    specs, axes, _ = io_specs(bert, model)
    feeds = [random_feeds(specs, zoo_sizes(axes, 16), seed) for seed in (100, 101)]
    hooks = EngineHooks(lambda: (True, "tensorrt"), None, lambda engine, side: _Engine(bert, noise))
    side = {"reference_onnx": str(bert), "backend": "tensorrt", "tensorrt_version": "8.6.1"}
    check = after_fp8_build(tmp_path / "m.engine", side, feeds, 0.99, hooks)
    assert check["status"] == status, check
    assert (status == "failed") == bool(check["failures"]) and check["engine"]["samples"] == 2 * feeds[0]["input_ids"].shape[0]
    if status == "failed":
        assert "build.fp8_min_cosine" in check["failures"][0]
    hooks = EngineHooks(lambda: (False, "no GPU"), None, None)
    assert after_fp8_build(tmp_path / "m.engine", side, feeds, 0.99, hooks)["status"] == "skipped"


def test_builds_fp8_step_converts_the_fused_graph_and_records_it(bert, monkeypatch):
    """build's --gemm-precision fp8 step on a TensorRT 8.6 / sm_90 build (the registry and GPU stood in for): the
    fused graph's GEMM plugins become fp8, the sidecar record names scales and where they came from, and the gate's
    feeds include two random feeds the scales never saw."""
    from types import SimpleNamespace

    from trtforge.build import step as build_mod
    from trtforge.core.errors import UserError

    monkeypatch.setattr("trtforge.backends.plugin_libraries.plugin_registered", lambda mod, name, version: True)
    model, converted, fused, specs, axes = _fused(bert)
    mod = SimpleNamespace(flavour="tensorrt", version="8.6.1")
    out, record, feeds = build_mod.gemm_fp8(mod, {"compute_capability": "9.0"}, fused, converted, model, "fp16", bert, specs, axes, 0.99)
    assert [n.op_type for n in out.graph.node].count(fp8.PLUGIN) == len(fp8.plugin_gemms(fused)) == len(record["replaced"])
    assert record["precision"] == "fp8" and record["gate"]["min_cosine"] == 0.99
    assert record["magnitudes_from"].startswith(("random feeds", "calibration data"))
    assert "seeds 100, 101" in record["gate"]["feeds"] and len(feeds) >= 2
    assert all(r["x_scale"] > 0 and r["w_scale"] > 0 for r in record["replaced"])
    with pytest.raises(UserError, match="found no GEMM plugin node"):
        build_mod.gemm_fp8(mod, {"compute_capability": "9.0"}, None, converted, model, "fp16", bert, specs, axes, 0.99)
    with pytest.raises(UserError, match="no FP8 tensor cores"):
        build_mod.gemm_fp8(mod, {"compute_capability": "8.6"}, fused, converted, model, "fp16", bert, specs, axes, 0.99)


def test_pipeline_honours_the_configs_gemm_precision(bert, tmp_path):
    """`pipeline` builds from the config's build section through build.options_from_config: build.gemm_precision fp8
    reaches the build, which refuses it on CI's TensorRT-RTX as `build --gemm-precision fp8` does. (Before, pipeline
    built its own options and dropped the key: an fp16 engine came out of an fp8 config.)"""
    import shutil

    from trtforge.core.config import apply_overrides, load_config
    from trtforge.core.errors import UserError
    from trtforge.pipeline import Pipeline

    cfg = apply_overrides(load_config(ROOT / "zoo" / "configs" / "bert.yaml"), {"build.gemm_precision": "fp8"})
    pipe = Pipeline(cfg, tmp_path, backend="auto")
    shutil.copy(bert, pipe.paths["clean"])
    shutil.copy(f"{bert}.json", f"{pipe.paths['clean']}.json")  # the export's axes and inputs
    with pytest.raises(UserError, match="--gemm-precision fp8 cannot apply"):
        pipe._build()


def test_chained_ffn_pairs_hand_fc2_e4m3_values_and_stay_close_to_fp32(bert):
    """--fp8-chain-ffn: each TrtforgeGemmGelu whose output FC2 alone reads writes e4m3 values at FC2's x_scale, and FC2
    reads them as they are. The emulated graph stays as close to fp32 as the unchained one; scales that disagree
    between the two ends of a pair show."""
    model, converted, fused, specs, axes = _fused(bert)
    gemms = fp8.plugin_gemms(fused)
    peaks = fp8.observe_peaks(converted, [random_feeds(specs, zoo_sizes(axes, 32), seed) for seed in (0, 1)], [g.x for g in gemms])
    plain, _ = fp8.to_fp8(fused, peaks)
    out, report = fp8.to_fp8(fused, peaks, chain=True)
    by_node = {r["node"]: r for r in report.replaced}
    pairs = fp8.fp8_chains(fused, set(by_node))
    assert len(pairs) == 2  # one FFN per layer of the zoo BERT
    attrs = {n.name: {a.name: helper.get_attribute_value(a) for a in n.attribute} for n in out.graph.node}
    for fc1, fc2 in pairs:
        assert attrs[fc1.name]["out_scale"] == pytest.approx(attrs[fc2.name]["x_scale"]) and attrs[fc2.name]["in_fp8"] == 1
        assert "in_fp8" not in attrs[fc1.name] and "out_scale" not in attrs[fc2.name]
    unseen = random_feeds(specs, dict(zoo_sizes(axes, 23), batch=3), seed=9)
    want = OrtRunner(model.SerializeToString()).run(unseen)
    plain_out = OrtRunner(_emulate(plain).SerializeToString()).run(unseen)
    got = OrtRunner(_emulate(out).SerializeToString()).run(unseen)
    for name, ref in want.items():
        assert rel_l2(got[name], ref) < 0.08 and abs(rel_l2(got[name], ref) - rel_l2(plain_out[name], ref)) < 0.02, name
    for node in out.graph.node:  # FC1 writing at another scale than FC2 reads
        for a in node.attribute:
            if a.name == "out_scale":
                a.f *= 4
    bad = OrtRunner(_emulate(out).SerializeToString()).run(unseen)
    assert rel_l2(bad["last_hidden_state"], want["last_hidden_state"]) > 0.2


def test_a_gelu_output_read_twice_is_not_chained(bert):
    _, _, fused, _, _ = _fused(bert)
    names = {g.node.name for g in fp8.plugin_gemms(fused)}
    fc1 = next(g.node for g in fp8.plugin_gemms(fused) if g.gelu)
    assert fc1.name in {a.name for a, _ in fp8.fp8_chains(fused, names)}
    fused.graph.node.append(helper.make_node("Identity", [fc1.output[0]], ["extra_reader"]))
    fused.graph.output.append(onnx.helper.make_tensor_value_info("extra_reader", onnx.TensorProto.FLOAT16, None))
    assert fc1.name not in {a.name for a, _ in fp8.fp8_chains(fused, names)}
    assert fc1.name not in {a.name for a, _ in fp8.fp8_chains(fused, names - {fc1.name})}


@pytest.mark.parametrize("mode, says", [("on", "--gemm-precision fp8"), ("always", "must be 'auto', 'on' or 'off', got 'always'")])
def test_chaining_on_without_fp8_or_an_unknown_mode_is_a_user_error(bert, tmp_path, mode, says):
    r = run_cli("build", str(bert), "--precision", "fp16", "--fp8-chain-ffn", mode, "-o", str(tmp_path / "e.engine"))
    assert_user_error(r, "--fp8-chain-ffn", says)


def test_an_engine_that_cannot_execute_fails_its_fp8_gate(bert, tmp_path):
    """A plugin error at execution (w37: cuBLASLt refused every FP8 matmul) is a failed gate with the reason, recorded
    in the sidecar by build, not a traceback that leaves the engine looking ungated."""
    from trtforge.calibrate.engine_check import EngineHooks, after_fp8_build

    class Broken:
        input_names, output_names = ["input_ids", "attention_mask"], ["last_hidden_state", "pooler_output"]

        def run(self, feeds):
            raise RuntimeError("TensorRT execution failed on profile 0")

    model = onnx.load(bert)
    specs, axes, _ = io_specs(bert, model)
    hooks = EngineHooks(lambda: (True, "tensorrt"), None, lambda engine, side: Broken())
    side = {"reference_onnx": str(bert), "backend": "tensorrt", "tensorrt_version": "8.6.1"}
    check = after_fp8_build(tmp_path / "m.engine", side, [random_feeds(specs, zoo_sizes(axes, 16))], 0.99, hooks)
    assert check["status"] == "failed" and "did not execute (TensorRT execution failed on profile 0)" in check["failures"][0]


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--gemm-precision", "fp8", "--fp8-min-cosine", "0"], "must be greater than 0, got 0"),
        (["--gemm-precision", "fp8", "--fp8-min-cosine", "nan"], "got nan"),
        (["--fp8-min-cosine", "0.9"], "gates FP8 GEMMs"),
    ],
)
def test_fp8_gates_that_cannot_fail_or_gate_nothing_are_user_errors(bert, tmp_path, flags, says):
    r = run_cli("build", str(bert), "--precision", "fp16", *flags, "-o", str(tmp_path / "e.engine"))
    assert_user_error(r, says)


def test_chaining_is_the_default_and_on_without_a_pair_says_so(bert, monkeypatch):
    """--fp8-chain-ffn auto (the default) chains every pair there is and says where there is none; on, where no FC2 is
    an FP8 GEMM (here: the graph before the GEMM pass, FC2 still a MatMul), is a user error, not a silent no-op; off
    chains nothing."""
    from types import SimpleNamespace

    import trtforge.backends.tensorrt as trt_backend
    from trtforge.build import step as build_mod
    from trtforge.core.errors import UserError

    monkeypatch.setattr("trtforge.backends.plugin_libraries.plugin_registered", lambda mod, name, version: True)
    model, converted, stages, specs, axes = fp16_plugin_chain(bert)
    mod = SimpleNamespace(flavour="tensorrt", version="8.6.1")

    def fp8_record(stage, chain):
        return build_mod.gemm_fp8(
            mod, {"compute_capability": "9.0"}, stages[stage][0], converted, model, "fp16", bert, specs, axes, 0.99, chain=chain
        )[1]

    def chained(record):
        return sum(bool(r.get("in_fp8")) for r in record["replaced"])

    with pytest.raises(UserError, match="found no FC1 -> FC2 pair"):
        fp8_record("skip_layernorm", "on")
    unpaired = fp8_record("skip_layernorm", "auto")
    assert unpaired["replaced"] and chained(unpaired) == 0
    assert any("chaining: no pair" in line for line in fp8.describe_fp8(unpaired))
    for chain, pairs in (("on", 2), ("auto", 2), ("off", 0)):
        record = fp8_record("gemm", chain)
        assert record["chain_ffn"] == chain and chained(record) == pairs, chain
        assert not any("chaining: no pair" in line for line in fp8.describe_fp8(record)), chain
    assert trt_backend.BuildOptions().fp8_chain_ffn == "auto"


# (model, FFN pairs chained, GEMMs kept fp16): CLIP's quick-GELU and GPT-2's Gemm -> Reshape -> GELU leave FC1 a plain
# TrtforgeGemm; ViT's 10-class head (N not a multiple of 16) stays fp16
ZOO_FP8 = [("vit", 2, 1), ("roberta", 2, 0), ("distilbert", 2, 0), ("deberta", 2, 0), ("clip-vision", 0, 0), ("gpt2", 0, 0)]


@pytest.fixture(scope="module")
def zoo_exports(tmp_path_factory):
    return export_zoo(tmp_path_factory.mktemp("fp8zoo"), [(name, "legacy") for name, _, _ in ZOO_FP8])


@pytest.mark.parametrize("name, pairs, kept", ZOO_FP8, ids=[n for n, _, _ in ZOO_FP8])
def test_fp8_across_the_zoo(zoo_exports, name, pairs, kept):
    """Models trtforge did not write, through the fp16 plugin chain and the FP8 pass with chaining: every GEMM plugin
    node converts (GPT-2's are ONNX Gemms), the FFN pairs chain where FC1 applies the GELU, and the emulated graph
    stays within FP8's error of fp32 on unseen feeds. CPU figures, rel-L2 (fp16 -> fp8): ViT 0.0002 -> 0.021, RoBERTa
    0.0006 -> 0.031, DistilBERT 0.0005 -> 0.035, DeBERTa 0.0004 -> 0.028, CLIP 0.0003 -> 0.019, GPT-2 0.0004 -> 0.031."""
    model, converted, stages, specs, axes = fp16_plugin_chain(zoo_exports[(name, "legacy")])
    fused = stages["gemm"][0]
    gemms = fp8.plugin_gemms(fused)
    peaks = fp8.observe_peaks(converted, [random_feeds(specs, zoo_sizes(axes, 32), seed) for seed in (0, 1)], [g.x for g in gemms])
    out, report = fp8.to_fp8(fused, peaks, chain=True)
    assert gemms and len(report.refused) == kept and len(report.replaced) + kept == len(gemms), report.refused
    assert all("must be multiples of 16" in r["reason"] for r in report.refused), report.refused
    assert sum(bool(r.get("in_fp8")) for r in report.replaced) == pairs
    feeds = random_feeds(specs, dict(zoo_sizes(axes, 23), batch=3), seed=9)
    want = OrtRunner(model.SerializeToString()).run(feeds)
    fp16 = OrtRunner(_emulate(fused).SerializeToString()).run(feeds)
    got = OrtRunner(_emulate(out).SerializeToString()).run(feeds)
    for key, ref in want.items():
        assert rel_l2(fp16[key], ref) < rel_l2(got[key], ref) < 0.08, key


def test_a_graph_without_gemm_plugin_nodes_gets_no_fp8_engine(zoo_exports, monkeypatch):
    """Where the GEMM passes replaced nothing (here: GPT-2's graph before them), fp8 has nothing to convert, and the
    build says where to look instead of building an fp16 engine under an fp8 name."""
    from types import SimpleNamespace

    from trtforge.build import step as build_mod
    from trtforge.core.errors import UserError

    monkeypatch.setattr("trtforge.backends.plugin_libraries.plugin_registered", lambda mod, name, version: True)
    path = zoo_exports[("gpt2", "legacy")]
    model, converted, _, specs, axes = fp16_plugin_chain(path)
    assert not fp8.plugin_gemms(converted)
    with pytest.raises(UserError, match="found no GEMM plugin node"):
        build_mod.gemm_fp8(
            SimpleNamespace(flavour="tensorrt", version="8.6.1"),
            {"compute_capability": "9.0"},
            converted,
            converted,
            model,
            "fp16",
            path,
            specs,
            axes,
            0.99,
        )


class _LiftedRunnerUp:
    """An engine whose logits equal ORT's but, in the batches `lift` names (those of 8 rows: the random feeds here;
    "all": every batch), each row's runner-up lifted just past the top: the cosine stays high and the top-1 agrees
    nowhere there (what FP8 did to a random-init ViT's nearly flat logits, w40)."""

    def __init__(self, onnx_path, lift):
        self.ort, self.lift = OrtRunner(onnx.load(onnx_path).SerializeToString()), lift
        self.input_names, self.output_names = self.ort.input_names, self.ort.output_names

    def run(self, feeds):
        out = self.ort.run(feeds)
        logits = out["logits"].copy()
        if self.lift == "all" or (self.lift == "random" and logits.shape[0] == 8):
            rows = np.arange(logits.shape[0])
            second, top = np.argsort(logits, axis=-1)[:, -2:].T
            logits[rows, second] = logits[rows, top] + 1e-3 * (np.abs(logits[rows, top]) + 1e-3)
        return {**out, "logits": logits}


@pytest.mark.parametrize(
    "lift, min_top1, real, status, top1, says",
    [
        (None, 0.99, 1, "passed", 1.0, None),
        ("random", 0.99, 1, "passed", 1.0, None),  # judged on the real batch alone
        ("all", 0.99, 1, "failed", 0.0, "of the real inputs, under the gate 0.99"),
        ("random", None, 0, "passed", 0.2, None),  # reported on every feed: 4 of 20 rows agree
        ("random", 0.99, 0, "failed", 0.2, "judged on real inputs, and this build had none"),
    ],
)
def test_the_fp8_gate_reports_a_classifiers_top1_and_gates_it_on_real_inputs(
    zoo_exports, tmp_path, lift, min_top1, real, status, top1, says
):
    """Top-1 is judged on the real inputs (the first `real` batches: one of 4 images here, then two random feeds of 8)
    only: random ones give flat logits, whose top-1 any rounding flips. Without real inputs it is reported as on random
    feeds, and a gate asked for fails as not evaluated."""
    from trtforge.calibrate.engine_check import EngineHooks, after_fp8_build

    path = zoo_exports[("vit", "legacy")]
    specs, axes, _ = io_specs(path, onnx.load(path))
    feeds = [random_feeds(specs, dict(batch=4), 7)] + [random_feeds(specs, dict(batch=8), seed) for seed in (100, 101)]
    hooks = EngineHooks(lambda: (True, "tensorrt"), None, lambda engine, side: _LiftedRunnerUp(path, lift))
    side = {"reference_onnx": str(path), "backend": "tensorrt", "tensorrt_version": "8.6.1"}
    check = after_fp8_build(tmp_path / "m.engine", side, feeds, 0.9, hooks, min_top1, real)  # the zoo ViT's 10 logits: cosine 0.95
    assert check["status"] == status, check["failures"]
    on = "real inputs" if real else "random feeds"
    assert check["engine"]["mean_cosine"] > 0.9 and check["engine"]["top1_on"] == on
    assert check["engine"]["top1_agreement"] == {"logits": pytest.approx(top1)}
    assert "top1_agreement" not in check["engine"]["per_output"]["logits"]  # one figure, labelled with its inputs
    gate = "-" if min_top1 is None else ">= 0.99"
    assert ["top-1 agreement (logits, %s)" % on, None, pytest.approx(top1), gate] in check["rows"], check["rows"]
    assert (status == "failed") == any("build.fp8_min_top1_agreement" in f for f in check["failures"])
    assert says is None or says in check["failures"][0]


@pytest.mark.parametrize(
    "flags, says",
    [
        (["--gemm-precision", "fp8", "--fp8-min-top1-agreement", "0.9"], "declares none (outputs: last_hidden_state"),
        (["--gemm-precision", "fp8", "--fp8-min-top1-agreement", "0"], "must be greater than 0, got 0"),
        (["--calib-data", "calib_data/minilm", "--precision", "fp32"], "precision fp32 has neither"),
        (["--calib-data", "no/such/folder"], "--calib-data 'no/such/folder' (config key build.calib_data) is not a folder"),
        (["--calib-data", ""], "--calib-data '' (config key build.calib_data) is not a folder"),
    ],
)
def test_a_top1_gate_with_nothing_to_judge_and_calib_data_that_cannot_apply_are_user_errors(bert, tmp_path, flags, says):
    args = ["build", str(bert), *flags, "-o", str(tmp_path / "e.engine")]
    r = run_cli(*(args if "--precision" in flags else args + ["--precision", "fp16"]))
    assert_user_error(r, says)


def test_a_top1_gate_without_real_inputs_is_refused_before_the_build(zoo_exports, tmp_path):
    """ViT declares logits, but without --calib-data (or a calibration cache) the gate would judge top-1 on random
    images: refused up front, naming what to give."""
    r = run_cli(
        "build",
        str(zoo_exports[("vit", "legacy")]),
        "--precision",
        "fp16",
        "--gemm-precision",
        "fp8",
        "--fp8-min-top1-agreement",
        "0.9",
        "-o",
        str(tmp_path / "e.engine"),
    )
    assert_user_error(r, "is judged on real inputs", "give --calib-data DIR")


def test_calib_data_sets_the_fp8_scales_and_joins_the_gates_feeds(bert, monkeypatch):
    """build --calib-data: FP8's activation peaks come from those real inputs (not random feeds), which the gate then
    judges on too, beside two random feeds no scale saw."""
    from types import SimpleNamespace

    from trtforge.build import step as build_mod

    monkeypatch.setattr("trtforge.backends.plugin_libraries.plugin_registered", lambda mod, name, version: True)
    model, converted, fused, specs, axes = _fused(bert)
    mod = SimpleNamespace(flavour="tensorrt", version="8.6.1")
    data = ROOT / "calib_data" / "minilm"
    args = (mod, {"compute_capability": "9.0"}, fused, converted, model, "fp16", bert, specs, axes, 0.99)
    _, random_record, random_gate_feeds = build_mod.gemm_fp8(*args)
    _, record, gate_feeds = build_mod.gemm_fp8(*args, data=data)
    assert random_record["magnitudes_from"].startswith("random feeds") and len(random_gate_feeds) == 2
    assert record["magnitudes_from"].startswith(f"calibration data {data}") and len(gate_feeds) > 2
    assert record["gate"]["feeds"].startswith(f"calibration data {data}")
    from trtforge.build.precision import sample_feeds

    samples, _ = sample_feeds(bert, model, specs, axes, data)
    real = record["gate"]["real_batches"]
    assert real == len(samples) == len(gate_feeds) - 2 and random_record["gate"]["real_batches"] == 0
    for got, want in zip(gate_feeds[:real], samples):  # the real batches first, as the top-1 gate reads them
        assert all(np.array_equal(got[k], want[k]) for k in want)
    peaks = {r["node"]: r["x_amax"] for r in record["replaced"]}
    assert any(peaks[r["node"]] != r["x_amax"] for r in random_record["replaced"])  # other inputs, other scales


def test_build_hands_calib_data_and_the_top1_gate_to_each_step(vit_calib, monkeypatch, tmp_path):
    """build() passes --calib-data to the fp16 conversion and the FP8 step, and --fp8-min-top1-agreement with the count
    of real batches to the gate: each step stood in for, its arguments recorded (a dropped argument fails here)."""
    from trtforge.backends.tensorrt import BuildOptions
    from trtforge.build import step as build_mod
    from trtforge.calibrate import engine_check

    path, data = vit_calib
    seen = {}
    real_prepare = build_mod._prepare_precision

    def prepare(model, precision, onnx_path, specs, axes, data=None):
        seen["prepare"] = data
        return real_prepare(model, precision, onnx_path, specs, axes, data)

    def gemm_fp8(
        mod,
        identity,
        fused,
        observe_model,
        source_model,
        precision,
        onnx_path,
        specs,
        axes,
        min_cosine,
        chain="auto",
        data=None,
        min_top1=None,
        sampled=None,
    ):
        seen["fp8"] = (data, min_top1, chain)
        return observe_model, {"precision": "fp8", "replaced": [], "gate": {"real_batches": 3}}, ["feeds"]

    def gate(engine, sidecar, feeds, min_cosine, hooks=None, min_top1=None, real_batches=0):
        seen["gate"] = (feeds, min_top1, real_batches)
        return {"status": "passed", "failures": []}

    monkeypatch.setattr(build_mod, "_prepare_precision", prepare)
    monkeypatch.setattr(build_mod, "gemm_fp8", gemm_fp8)
    monkeypatch.setattr(engine_check, "after_fp8_build", gate)
    options = BuildOptions(gemm_precision="fp8", calib_data=str(data), fp8_min_top1_agreement=0.9)
    build_mod.build(path, tmp_path / "v.engine", "fp16", backend="auto", options=options)
    assert seen["prepare"] == data and seen["fp8"] == (data, 0.9, "auto") and seen["gate"] == (["feeds"], 0.9, 3)


@pytest.fixture(scope="module")
def vit_calib(zoo_exports):
    return zoo_exports[("vit", "legacy")], ROOT / "calib_data" / "images"
