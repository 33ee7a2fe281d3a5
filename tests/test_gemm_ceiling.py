"""benchmarks/gpu/gemm_ceiling.py's pure parts: its single-GEMM models compute the GEMM they are named for
(ONNX Runtime, each precision variant), and its parsers read TensorRT's tactic log and kernel names."""

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest

_spec = importlib.util.spec_from_file_location("gemm_ceiling", Path(__file__).resolve().parents[1] / "benchmarks/gpu/gemm_ceiling.py")
gemm_ceiling = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gemm_ceiling)


@pytest.mark.parametrize("variant", gemm_ceiling.VARIANTS)
def test_each_variant_computes_its_gemm(variant):
    m, k, n = 32, 64, 48
    model = gemm_ceiling.gemm_model(m, k, n, variant)
    onnx.checker.check_model(model, full_check=True)
    assert model.opset_import[0].version <= 17  # what TensorRT 8.6's parser takes
    x = np.random.default_rng(1).standard_normal((m, k))
    fp16_io = variant in ("fp16", "int8_fp16io")
    x = x.astype(np.float16 if fp16_io else np.float32)
    y = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    assert y.shape == (m, n) and y.dtype == (np.float16 if fp16_io else np.float32)
    w = (np.random.default_rng(0).standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    ref = x.astype(np.float32) @ w
    rel = np.linalg.norm(y.astype(np.float32) - ref) / np.linalg.norm(ref)
    assert rel < (2e-3 if variant == "fp16" else 0.08)  # int8: 4/127 input steps on N(0,1)
    quantized = any(node.op_type == "QuantizeLinear" for node in model.graph.node)
    assert quantized == variant.startswith("int8")


def test_tactic_summary_names_the_fastest_tactic_per_layer():
    log = "\n".join(
        [
            "Tactic Name: sm80_xmma_fprop_implicit_gemm_interleaved_i8f16_i8i32_f32_nchw Tactic: 0x00000000000a1b2c Time: 0.061",
            "Tactic Name: sm90_xmma_fprop_implicit_gemm_i8i8_i8i32_f32_nhwckrsc Tactic: 0x0000000000000002 Time: 0.070",
            "Tactic Name: sm90_xmma_gemm_f16f16_f16f16_f16_nn_n Tactic: 0x0000000000000001 Time: 0.05",
            "Fastest Tactic: 0x00000000000A1B2C Time: 0.061",
            "Fastest Tactic: 0x0000000000000099 Time: 0.001",  # a tactic without a name line (a reformat)
        ]
    )
    summary = gemm_ceiling.tactic_summary(log)
    assert summary["timed_tactics"] == 3
    assert summary["by_arch"] == {"sm80": {"int8": 1}, "sm90": {"int8": 1, "float": 1}}
    assert [f["name"] for f in summary["fastest"]] == ["sm80_xmma_fprop_implicit_gemm_interleaved_i8f16_i8i32_f32_nchw", ""]
    assert gemm_ceiling.tactic_summary("")["timed_tactics"] == 0


def test_kernel_names_by_architecture():
    blob = b"\x00junk sm90_xmma_gemm_i8i8_i8i32_f32_tn_n_tilesize\x00sm80_xmma_fprop_implicit_gemm_f16f16_f16\x00sm90_xmma\x00"
    found = gemm_ceiling.kernel_names(blob)
    assert found == {"sm90": {"sm90_xmma_gemm_i8i8_i8i32_f32_tn_n_tilesize"}, "sm80": {"sm80_xmma_fprop_implicit_gemm_f16f16_f16"}}
