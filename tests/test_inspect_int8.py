"""What `trtforge inspect` can say about INT8 on TensorRT 8.6 (issue 10): the layer report's second format,
int8 kernel names, and Myelin layers reported as opaque instead of as 'no INT8'."""

from trtforge.backends.engine_layers import int8_kernel, parse_layer_log, runs_int8, summarize_layers
from trtforge.build.engine_record import add_tactic_names

# SAMPLE INPUT (written for this test in the format TensorRT 8.6 GA / 9.x print: "name (Dtype[dims])"). On
# the H200 the bracketed parser read every layer of BERT-base and ResNet-50 with empty I/O: this format.
LOG_PAREN = """Engine Layer Information:
Layer(Reformat): /q/QuantizeLinear, Tactic: 0x00000000000003ea, x (Float[-1,3,224,224]) -> /q/QuantizeLinear_output_0 (Int8[-1,3,224,224])
Layer(CaskConvolution): /conv1/Conv + /relu/Relu, Tactic: 0x4727434768e46395, /q/QuantizeLinear_output_0 (Int8[-1,3,224,224]) -> /relu/Relu_output_0 (Int8[-1,64,112,112])
Layer(Myelin): {ForeignNode[/encoder/MatMul.../encoder/LayerNorm]}, Tactic: 0x0000000000000000, input_ids (Int32[-1,-1]), attention_mask (Int32[-1,-1]) -> last_hidden_state (Float[-1,-1,768])
Layer(ShapeHostToDevice): [ShapeHostToDeviceCopy 0], Tactic: 0x0000000000000000,  -> """


def test_paren_format_gives_types_and_dims():
    layers = parse_layer_log("[12/01/2026-05:13:00] [V] [TRT] " + LOG_PAREN)
    assert [l["LayerType"] for l in layers] == ["Reformat", "CaskConvolution", "Myelin", "ShapeHostToDevice"]
    conv, myelin = layers[1], layers[2]
    assert conv["Inputs"] == [{"Name": "/q/QuantizeLinear_output_0", "Datatype": "Int8", "Dimensions": [-1, 3, 224, 224]}]
    assert [t["Name"] for t in myelin["Inputs"]] == ["input_ids", "attention_mask"]
    assert myelin["Outputs"][0]["Datatype"] == "Float" and layers[3]["Outputs"] == []


def test_int8_kernel_names():
    for name in (
        "sm90_xmma_gemm_i8i8_i8i32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1",
        "sm80_xmma_fprop_implicit_gemm_interleaved_i8i8_i8i32_f32_nchw_vect_c_32kcrs_vect_c_32_nchw",
        "volta_int8_i8816cudnn_int8_256x64_ldg16_relu_singleBuffer_medium_nt_v1",
        "imma_gemm_nt",
    ):
        assert int8_kernel(name), name
    for name in (
        "sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x256x64",
        "ampere_h16816gemm_256x128_ldg8_stages_32x3_tn",
        "cutlass_80_tensorop_s1688gemm_128x128_16x4_tn_align4",
        "__myl_GathMulAddCastMeanSubMul_myl0_0",
        "",
    ):
        assert not int8_kernel(name), name
    assert runs_int8({"LayerType": "CaskGemmConvolution", "TacticName": "sm90_xmma_gemm_i8i8_i8i32_f32_tn_n", "Inputs": []})


def test_myelin_layers_are_opaque_not_float():
    summary = summarize_layers(parse_layer_log(LOG_PAREN))
    assert summary["int8_layers"] == ["/conv1/Conv + /relu/Relu"]
    assert summary["opaque_layers"] == ["{ForeignNode[/encoder/MatMul.../encoder/LayerNorm]}"]
    assert summary["opaque_boundary_types"] == ["Float", "Int32"]
    verdict = summary["int8_verdict"]
    assert verdict.startswith("1 of 4 layers run INT8") and "1 Myelin layer(s) are opaque" in verdict
    assert "cannot be told from the engine" in verdict
    # A Myelin layer whose kernel is named (TensorRT >= 10 lists them) is not opaque.
    named = summarize_layers([{"Name": "__myl_gemm_myl0_3", "LayerType": "Myelin", "TacticName": "sm90_xmma_gemm_i8i8_i8i32_f32"}])
    assert named["opaque_layers"] == [] and named["int8_layers"] == ["__myl_gemm_myl0_3"]
    assert named["int8_verdict"] == "1 of 1 layers run INT8 (int8 inputs or an int8 kernel)"


def test_inspector_tactic_names_complete_the_build_log():
    layers = parse_layer_log(LOG_PAREN)
    inspector = [
        {
            "Name": "/conv1/Conv + /relu/Relu",
            "TacticName": "sm80_xmma_fprop_implicit_gemm_i8i8_i8i32_f32",
            "Inputs": [{"Format/Datatype": "N/A due to dynamic shapes"}],
        },
        "a bare name",
    ]
    add_tactic_names(layers, [l for l in inspector if isinstance(l, dict)])
    assert layers[1]["TacticName"].startswith("sm80_xmma") and "TacticName" not in layers[2]
