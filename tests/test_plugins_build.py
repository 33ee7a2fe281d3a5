"""`trtforge plugins build`: discovery on fake directory trees (flag, environment, wheels, system, in that order), the
cache key and directory, which cached library build and run load, doctor's report, and every "missing X" error of the
real command. The compile runs trtforge/native/build.sh for real with a fake nvcc and a fake C++ compiler that record
their arguments: no CUDA compile of the plugins happens here."""

import json
import stat
from pathlib import Path

import pytest
from conftest import assert_user_error, run_cli

from trtforge.backends import plugin_libraries as trt_backend
from trtforge.backends.plugin_libraries import cudnn_lib_dirs
from trtforge.backends.tensorrt import TrtModule
from trtforge.build.plugins import compile as plugins_build
from trtforge.build.plugins.discovery import (
    LIBRARY_NAME,
    SIDECAR_KIND,
    Inputs,
    cache_key,
    cache_root,
    cache_state,
    chosen_libraries,
    discover,
    library_path,
    parse_arch,
    sources_digest,
)
from trtforge.core.artifacts import sha256_file
from trtforge.core.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
NATIVE = ROOT / "trtforge" / "native"

RECORDER = """#!/usr/bin/env bash
echo "{name} $*" >> "$FAKE_LOG"
if [ -n "${{FAKE_FAIL:-}}" ] && [ "{name}" = nvcc ]; then echo "fp8_quantize.cu(12): error: fake failure" >&2; exit 1; fi
while [ $# -gt 0 ]; do if [ "$1" = -o ]; then shift; echo built > "$1"; fi; shift; done
"""


def _write(path: Path, text: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _tool(path: Path, name: str) -> Path:
    _write(path, RECORDER.format(name=name))
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _cuda(home: Path, version: int = 12040) -> Path:
    _tool(home / "bin" / "nvcc", "nvcc")
    _write(home / "include" / "cuda_runtime_api.h", f"#define CUDART_VERSION {version}\n")
    _write(home / "lib64" / "libcudart_static.a")
    return home


def _trt(include: Path, version=(8, 6, 1)) -> Path:
    _write(include / "NvInfer.h")
    _write(include / "NvInferVersion.h", "".join(f"#define NV_TENSORRT_{k} {v} //\n" for k, v in zip(("MAJOR", "MINOR", "PATCH"), version)))
    return include


def _site(site: Path, cudnn_major: int = 9) -> Path:
    """The layout `pip install 'trtforge[plugins]'` leaves in a site-packages."""
    _write(site / "nvidia/cudnn/include/cudnn.h")
    _write(
        site / "nvidia/cudnn/include/cudnn_version.h",
        f"#define CUDNN_MAJOR {cudnn_major}\n#define CUDNN_MINOR 1\n#define CUDNN_PATCHLEVEL 0\n",
    )
    _write(site / "nvidia/cudnn/lib/libcudnn.so.9")
    _write(site / "include/cudnn_frontend.h")
    _write(
        site / "include/cudnn_frontend_version.h",
        "#define CUDNN_FRONTEND_MAJOR_VERSION 1\n#define CUDNN_FRONTEND_MINOR_VERSION 14\n#define CUDNN_FRONTEND_PATCH_VERSION 0\n",
    )
    _write(site / "nvidia/cublas/include/cublasLt.h")
    _write(site / "nvidia/cublas/lib/libcublasLt.so.12")
    _write(site / "nvidia/cuda_nvrtc/lib/libnvrtc.so.12")
    return site


@pytest.fixture
def tree(tmp_path):
    """A CUDA toolkit, TensorRT 8.6.1's headers, the plugins extra's wheels, a fake C++ compiler, an empty system root."""
    return {
        "cuda": _cuda(tmp_path / "cuda"),
        "trt": _trt(tmp_path / "trt" / "include"),
        "site": _site(tmp_path / "site"),
        "cxx": _tool(tmp_path / "bin" / "g++", "cxx"),
        "system": tmp_path / "sysroot",
        "root": tmp_path,
    }


def _inputs(tree, flags=None, env=None, path_tools=("nvcc", "g++"), search=None) -> Inputs:
    tools = {"nvcc": str(tree["cuda"] / "bin" / "nvcc"), "g++": str(tree["cxx"])}
    return Inputs(
        flags=flags or {},
        env=env or {},
        search_path=[str(tree["site"])] if search is None else search,
        which=lambda name: tools.get(name) if name in path_tools else None,
        system=(str(tree["system"]),),
    )


# ---------------------------------------------------------------------------------------------------- discovery (pure)


def test_everything_is_found_from_path_and_the_plugins_extras_wheels(tree):
    found = discover(_inputs(tree, flags={"tensorrt_include": str(tree["trt"])}))
    assert found.ok, found.missing
    f = found.found
    assert (f["cuda_home"].path, f["cuda_home"].version) == (tree["cuda"], "12.4")
    assert (f["tensorrt_include"].path, f["tensorrt_include"].source, f["tensorrt_include"].version) == (
        tree["trt"],
        "--tensorrt-include",
        "8.6.1",
    )
    assert (f["cudnn_include"].path, f["cudnn_include"].source, f["cudnn_include"].version) == (
        tree["site"] / "nvidia/cudnn/include",
        "package",
        "9.1.0",
    )
    assert f["cudnn_lib"].path == tree["site"] / "nvidia/cudnn/lib"
    assert (f["cudnn_frontend_include"].path, f["cudnn_frontend_include"].version) == (tree["site"] / "include", "1.14.0")
    assert f["cublas_include"].path == tree["site"] / "nvidia/cublas/include"
    assert found.runtime_libraries == [
        tree["site"] / "nvidia/cublas/lib/libcublasLt.so.12",
        tree["site"] / "nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
    ]


def test_a_flag_beats_the_environment_which_beats_the_wheels(tree, tmp_path):
    other = _site(tmp_path / "other")
    env = {"CUDNN_INCLUDE": str(other / "nvidia/cudnn/include"), "TRT_INCLUDE": str(tree["trt"])}
    f = discover(_inputs(tree, env=env)).found
    assert (f["cudnn_include"].path, f["cudnn_include"].source) == (other / "nvidia/cudnn/include", "$CUDNN_INCLUDE")
    assert f["tensorrt_include"].source == "$TRT_INCLUDE"
    flags = {"cudnn_include": str(tree["site"] / "nvidia/cudnn/include"), "tensorrt_include": str(tree["trt"])}
    f = discover(_inputs(tree, flags=flags, env=env)).found
    assert (f["cudnn_include"].path, f["cudnn_include"].source) == (tree["site"] / "nvidia/cudnn/include", "--cudnn-include")


def test_a_named_directory_without_the_header_is_an_error_not_a_fallback(tree, tmp_path):
    """The wheel has cudnn.h, but the user pointed elsewhere: say so rather than silently build against another cuDNN."""
    empty = tmp_path / "empty"
    empty.mkdir()
    found = discover(_inputs(tree, flags={"tensorrt_include": str(tree["trt"]), "cudnn_include": str(empty)}))
    assert found.missing == [f"cuDNN 9's headers (cudnn.h) were not found (looked in {empty}): fix --cudnn-include."]


def test_cuda_is_found_beside_nvcc_then_in_the_usual_places_newest_first(tree):
    sysroot = tree["system"]
    _cuda(sysroot / "usr/local/cuda-12.1", 12010)
    newest = _cuda(sysroot / "usr/local/cuda-12.6", 12060)
    found = discover(_inputs(tree, path_tools=("g++",)))
    assert (found.found["cuda_home"].path, found.found["cuda_home"].version) == (newest, "12.6")
    assert found.found["nvcc"].path == newest / "bin/nvcc"
    beside_nvcc = discover(_inputs(tree)).found
    assert beside_nvcc["cuda_home"].path == tree["cuda"]
    nvcc_env = discover(_inputs(tree, env={"NVCC": "/opt/nvcc"})).found["nvcc"]
    assert (nvcc_env.path, nvcc_env.source) == (Path("/opt/nvcc"), "$NVCC")


def test_an_old_or_incomplete_toolkit_is_named_with_what_it_lacks(tree, tmp_path):
    old = _cuda(tmp_path / "cuda11", 11080)
    found = discover(_inputs(tree, flags={"cuda_home": str(old)}))
    assert any("is CUDA 11.8" in m and "fix --cuda-home" in m for m in found.missing), found.missing
    (tree["cuda"] / "lib64" / "libcudart_static.a").unlink()
    found = discover(_inputs(tree))
    assert any(f"{tree['cuda']} lacks lib64/libcudart_static.a" in m and "--cuda-home DIR" in m for m in found.missing), found.missing


def test_tensorrt_headers_must_be_8_6_and_match_the_installed_tensorrt(tree):
    sys_include = _trt(tree["system"] / "usr/include/x86_64-linux-gnu", (10, 0, 1))
    found = discover(_inputs(tree))
    [sentence] = [m for m in found.missing if "TensorRT" in m]
    assert f"{sys_include} holds TensorRT 10.0.1" in sentence and "--tensorrt-include DIR" in sentence
    _trt(tree["system"] / "usr/include", (8, 6, 1))  # a second system place with 8.6: taken
    found = discover(_inputs(tree))
    assert found.found["tensorrt_include"].path == tree["system"] / "usr/include" and found.found["tensorrt_include"].source == "system"
    mismatch = discover(_inputs(tree, flags={"tensorrt_include": str(tree["trt"])}), runtime_tensorrt="10.3.0")
    assert any("are 8.6.1 but the installed tensorrt is 10.3.0" in m for m in mismatch.missing), mismatch.missing


def test_cudnn_must_be_9_and_frontend_headers_keep_their_include_name(tree, tmp_path):
    old = _site(tmp_path / "old", cudnn_major=8)
    found = discover(_inputs(tree, flags={"tensorrt_include": str(tree["trt"])}, search=[str(old)]))
    assert any("holds cuDNN 8.1.0" in m for m in found.missing), found.missing
    renamed = tmp_path / "fe_headers"
    (tree["site"] / "include").rename(renamed)
    found = discover(_inputs(tree, flags={"tensorrt_include": str(tree["trt"]), "cudnn_frontend_include": str(renamed)}))
    assert any("must sit in a directory named include/" in m for m in found.missing), found.missing


def test_nothing_found_gives_one_sentence_per_missing_thing(tmp_path):
    inputs = Inputs(flags={}, env={}, search_path=[str(tmp_path / "site")], which=lambda name: None, system=(str(tmp_path),))
    missing = discover(inputs).missing
    assert len(missing) == 7, missing  # CUDA, C++, TensorRT, cuDNN headers, cuDNN library, cudnn-frontend, cuBLASLt
    for sentence, fix in zip(
        missing,
        ("--cuda-home", "set CXX", "--tensorrt-include", "nvidia-cudnn-cu12", "--cudnn-lib", "nvidia-cudnn-frontend", "nvidia-cublas-cu12"),
    ):
        assert fix in sentence and sentence.endswith(".") and sentence.count(": ") >= 1, sentence
        assert "\n" not in sentence


# ---------------------------------------------------------------------------------------------------- the cache (pure)


def test_cache_key_root_and_arch():
    assert cache_key("8.6.1.6", "12.4", 90) == "trt8.6.1-cuda12.4-sm90"
    assert cache_key("8.6.1.post1", "13.0.88", 89) == "trt8.6.1-cuda13.0-sm89"
    home = Path("/home/u")
    assert cache_root({}, home) == home / ".cache" / "trtforge"
    assert cache_root({"XDG_CACHE_HOME": "/x"}, home) == Path("/x/trtforge")
    assert cache_root({"TRTFORGE_CACHE_DIR": "/c", "XDG_CACHE_HOME": "/x"}, home) == Path("/c")
    assert library_path(Path("/c"), "trt8.6.1-cuda12.4-sm90") == Path("/c/plugins/trt8.6.1-cuda12.4-sm90") / LIBRARY_NAME
    assert [parse_arch(a) for a in ("sm_90", "SM89", "9.0", "12.0", "80")] == [90, 89, 90, 120, 80]
    with pytest.raises(ValueError):
        parse_arch("hopper")


def _cached(root: Path, key: str, sources: str, body: bytes = b"lib") -> Path:
    lib = library_path(root, key)
    lib.parent.mkdir(parents=True, exist_ok=True)
    lib.write_bytes(body)
    record = {"kind": SIDECAR_KIND, "key": key, "sha256": sha256_file(lib), "sources_sha256": sources}
    Path(str(lib) + ".json").write_text(json.dumps(record))
    return lib


def _state(root, trt="8.6.1", sm=90, sources="S", driver=None):
    return cache_state(root, trt, sm, sources, driver, plugins_build._read_record, sha256_file)


def test_the_cached_library_is_the_newest_cuda_the_driver_runs_for_this_tensorrt_and_sm(tmp_path):
    assert _state(tmp_path).status == "not built"
    old = _cached(tmp_path, "trt8.6.1-cuda12.4-sm90", "S")
    new = _cached(tmp_path, "trt8.6.1-cuda13.0-sm90", "S")
    _cached(tmp_path, "trt8.6.1-cuda13.0-sm89", "S")  # another GPU
    _cached(tmp_path, "trt8.6.0-cuda13.0-sm90", "S")  # another TensorRT
    assert _state(tmp_path).path == new
    assert _state(tmp_path, trt="8.6.1.6", driver="13.1").path == new
    assert _state(tmp_path, driver="12.8").path == old  # the driver cannot run CUDA 13's static runtime
    assert _state(tmp_path, sm=80).status == "not built"


def test_a_library_from_other_sources_or_altered_bytes_is_stale(tmp_path):
    lib = _cached(tmp_path, "trt8.6.1-cuda12.4-sm90", "OLD")
    state = _state(tmp_path)
    assert (state.status, state.path) == ("stale", lib) and "other plugin sources" in state.detail and "plugins build" in state.detail
    lib = _cached(tmp_path, "trt8.6.1-cuda12.4-sm90", "S")
    lib.write_bytes(b"changed")
    assert "no longer matches the hash" in _state(tmp_path).detail
    Path(str(lib) + ".json").write_text("{not json")
    assert "no readable sidecar" in _state(tmp_path).detail


def test_which_libraries_a_build_loads(tmp_path):
    lib = _cached(tmp_path, "trt8.6.1-cuda12.4-sm90", "S")
    found = _state(tmp_path)
    assert chosen_libraries([], found)[0] == [str(lib)]
    assert chosen_libraries(["/x/other.so"], found)[0] == ["/x/other.so"]
    assert chosen_libraries(["none"], found)[0] == []
    assert chosen_libraries([], _state(tmp_path / "empty"))[0] == []
    with pytest.raises(UserError, match="give it alone"):
        chosen_libraries(["none", "/x/other.so"], found)


def test_sources_digest_follows_the_native_sources(tmp_path):
    for p in NATIVE.iterdir():
        if p.is_file():
            (tmp_path / p.name).write_bytes(p.read_bytes())
    before = sources_digest(tmp_path)
    assert before == sources_digest(NATIVE)
    (tmp_path / "notes.txt").write_text("not a source")
    assert sources_digest(tmp_path) == before
    with open(tmp_path / "gemm_plugin.cpp", "a") as fh:
        fh.write("// changed\n")
    assert sources_digest(tmp_path) != before


# ---------------------------------------------------------------------------------------------------- default loading


@pytest.fixture
def cache_here(tmp_path, monkeypatch):
    """This process sees an sm_90 GPU and a cache under tmp_path/cache with a library built from the shipped sources."""
    monkeypatch.setenv("TRTFORGE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(plugins_build, "gpu_sm", lambda: 90)
    monkeypatch.setattr(plugins_build, "driver_cuda_version", lambda: None)
    return _cached(tmp_path / "cache", "trt8.6.1-cuda12.4-sm90", sources_digest(NATIVE))


def test_build_loads_the_cached_library_unless_told_otherwise(cache_here):
    warnings = []
    assert plugins_build.libraries_for_build("tensorrt", "8.6.1", [], warnings.append) == [str(cache_here)]
    assert plugins_build.libraries_for_build("tensorrt", "8.6.1", ["none"], warnings.append) == []
    assert plugins_build.libraries_for_build("tensorrt", "8.6.1", ["/x/y.so"], warnings.append) == ["/x/y.so"]
    assert plugins_build.libraries_for_build("tensorrt_rtx", "1.7.1", [], warnings.append) == []  # RTX loads no plugins
    assert plugins_build.libraries_for_build("tensorrt", "10.3.0", [], warnings.append) == []
    assert warnings == []
    cache_here.write_bytes(b"altered")
    assert plugins_build.libraries_for_build("tensorrt", "8.6.1", [], warnings.append) == []
    assert len(warnings) == 1 and "plugin library not loaded" in warnings[0] and "trtforge plugins build" in warnings[0]


def test_run_takes_this_machines_cached_library_for_one_recorded_elsewhere(cache_here, tmp_path):
    mod = TrtModule(trt=None, flavour="tensorrt", version="8.6.1")
    elsewhere = f"/other/machine/cache/plugins/trt8.6.1-cuda12.4-sm90/{LIBRARY_NAME}"
    assert trt_backend._cached_in_place_of(mod, elsewhere) == str(cache_here)
    assert trt_backend._cached_in_place_of(mod, "/other/libcustom.so") == "/other/libcustom.so"
    present = _write(tmp_path / "mine" / LIBRARY_NAME)
    assert trt_backend._cached_in_place_of(mod, str(present)) == str(present)


def test_a_cached_library_preloads_what_it_was_built_against(cache_here, tmp_path, monkeypatch):
    record = json.loads(Path(str(cache_here) + ".json").read_text())
    record.update(cudnn={"lib": str(tmp_path / "cudnn_lib")}, runtime_libraries=[str(tmp_path / "gone.so.12")])
    Path(str(cache_here) + ".json").write_text(json.dumps(record))
    assert trt_backend._preload_companions(cache_here) == tmp_path / "cudnn_lib"  # an absent companion is skipped
    assert trt_backend._preload_companions(_write(tmp_path / "libother.so")) is None
    recorded = _write(tmp_path / "cudnn_lib" / "libcudnn.so.9").parent
    wheel = _write(tmp_path / "site" / "nvidia/cudnn/lib/libcudnn.so.9").parent
    assert cudnn_lib_dirs({}, [str(tmp_path / "site")], recorded) == [recorded, wheel]


def test_doctor_reports_the_cache_state(cache_here, monkeypatch):
    from trtforge.build.plugins import compile as doctor

    monkeypatch.setattr(plugins_build, "runtime_tensorrt_version", lambda: "8.6.1")
    state = doctor.plugin_library_state()
    assert (state["state"], state["path"]) == ("found", str(cache_here))
    cache_here.write_bytes(b"altered")
    assert doctor.plugin_library_state()["state"] == "stale"
    monkeypatch.setattr(plugins_build, "gpu_sm", lambda: 80)
    state = doctor.plugin_library_state()
    assert state["state"] == "not built" and "sm_80" in state["detail"] and state["cache_dir"].endswith("plugins")
    monkeypatch.setattr(plugins_build, "runtime_tensorrt_version", lambda: None)
    assert doctor.plugin_library_state()["state"] == "unavailable"


def test_doctor_command_prints_the_plugin_library_line(tmp_path):
    proc = run_cli("doctor", env={"TRTFORGE_CACHE_DIR": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr
    assert "plugin library (libtrtforge_plugins): unavailable" in proc.stdout  # no full TensorRT on CPU machines
    data = json.loads(run_cli("doctor", "--json", env={"TRTFORGE_CACHE_DIR": str(tmp_path)}).stdout)
    assert data["plugin_library"]["cache_dir"] == str(tmp_path / "plugins")


# ---------------------------------------------------------------------------------------------------- the real command


def _flags(tree) -> list[str]:
    site = tree["site"]
    return [
        "--cuda-home",
        str(tree["cuda"]),
        "--tensorrt-include",
        str(tree["trt"]),
        "--cudnn-include",
        str(site / "nvidia/cudnn/include"),
        "--cudnn-lib",
        str(site / "nvidia/cudnn/lib"),
        "--cudnn-frontend-include",
        str(site / "include"),
        "--cublas-include",
        str(site / "nvidia/cublas/include"),
    ]


def _env(tree, **extra) -> dict:
    return {
        "TRTFORGE_CACHE_DIR": str(tree["root"] / "cache"),
        "CXX": str(tree["cxx"]),
        "FAKE_LOG": str(tree["root"] / "tools.log"),
        **extra,
    }


def test_plugins_build_runs_build_sh_with_what_it_found_and_caches_the_result(tree):
    proc = run_cli("plugins", "build", *_flags(tree), "--arch", "sm_90", env=_env(tree))
    assert proc.returncode == 0, proc.stderr
    lib = tree["root"] / "cache/plugins/trt8.6.1-cuda12.4-sm90" / LIBRARY_NAME
    assert f"built {lib} (trt8.6.1-cuda12.4-sm90)" in proc.stdout
    record = json.loads(Path(str(lib) + ".json").read_text())
    assert record["kind"] == SIDECAR_KIND and record["sha256"] == sha256_file(lib) and record["sm"] == 90
    assert record["sources_sha256"] == sources_digest(NATIVE) and record["cudnn"]["version"] == "9.1.0"
    assert record["cudnn_frontend"]["version"] == "1.14.0" and record["tensorrt_include"]["version"] == "8.6.1"
    assert not [p for p in lib.parent.iterdir() if p.name.startswith(".build-")]  # the temp directory is gone
    calls = (tree["root"] / "tools.log").read_text().splitlines()
    nvcc = next(c for c in calls if c.startswith("nvcc "))
    assert "arch=compute_90,code=sm_90" in nvcc and str(NATIVE / "fp8_quantize.cu") in nvcc
    link = next(c for c in calls if c.startswith("cxx ") and "sdpa_plugin.cpp" in c)
    site = tree["site"]
    for part in (
        f"-I{tree['trt']}",
        f"-I{site / 'nvidia/cudnn/include'}",
        f"-I{site / 'include'}",
        f"-I{site / 'nvidia/cublas/include'}",
        f"-L{site / 'nvidia/cudnn/lib'}",
        f"-I{tree['cuda'] / 'include'}",
    ):
        assert part in link, (part, link)
    again = run_cli("plugins", "build", *_flags(tree), "--arch", "sm_90", env=_env(tree))
    assert again.returncode == 0 and "up to date" in again.stdout, again.stderr
    forced = run_cli("plugins", "build", *_flags(tree), "--arch", "sm_90", "--force", "--json", env=_env(tree))
    assert forced.returncode == 0 and json.loads(forced.stdout)["reused"] is False, forced.stderr


def test_a_failed_compile_is_one_sentence_with_the_log_and_leaves_no_library(tree):
    proc = run_cli("plugins", "build", *_flags(tree), "--arch", "sm_90", env=_env(tree, FAKE_FAIL="1"))
    key_dir = tree["root"] / "cache/plugins/trt8.6.1-cuda12.4-sm90"
    assert_user_error(proc, "compiling the plugin library failed (exit 1)", "error: fake failure", str(key_dir / "build.log"))
    assert sorted(p.name for p in key_dir.iterdir()) == ["build.log"]


@pytest.mark.parametrize(
    "flag, what",
    [
        ("--cuda-home", "no CUDA toolkit"),
        ("--tensorrt-include", "TensorRT 8.6's headers"),
        ("--cudnn-include", "cuDNN 9's headers"),
        ("--cudnn-lib", "cuDNN 9's library"),
        ("--cudnn-frontend-include", "cudnn-frontend's headers"),
        ("--cublas-include", "cuBLASLt's header"),
    ],
)
def test_each_missing_requirement_is_one_sentence_and_exit_2(tree, tmp_path, flag, what):
    empty = tmp_path / "empty" / "include"
    empty.mkdir(parents=True)
    args = _flags(tree)
    args[args.index(flag) + 1] = str(empty)
    proc = run_cli("plugins", "build", *args, "--arch", "sm_90", env=_env(tree))
    assert_user_error(proc, what, f"fix {flag}")
    assert not (tree["root"] / "cache").exists()


def test_no_gpu_and_no_arch_and_no_compiler_are_said_each_then_summed_up(tree):
    proc = run_cli("plugins", "build", *_flags(tree), env=_env(tree))
    assert_user_error(proc, "no GPU was found to build for", "--arch sm_90")
    proc = run_cli("plugins", "build", *_flags(tree), env=_env(tree, CXX="no-such-compiler"))
    lines = proc.stderr.strip().splitlines()
    assert [l for l in lines if l.startswith("missing: ")] == [
        "missing: no C++17 compiler was found ($CXX=no-such-compiler is not on PATH): install g++ (e.g. `apt-get install g++`) or set CXX.",
        "missing: no GPU was found to build for (cuda-python sees none): pass --arch with the compute capability of the GPU "
        "that will run the library, e.g. --arch sm_90 for an H100.",
    ]
    assert_user_error(proc, "2 things the plugin library needs are missing (listed above)")
    bad_arch = run_cli("plugins", "build", *_flags(tree), "--arch", "hopper", env=_env(tree))
    assert_user_error(bad_arch, "--arch 'hopper' is not a compute capability")


def test_plugins_status_and_path(tree):
    proc = run_cli("plugins", "status", *_flags(tree), "--json", env=_env(tree))
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["missing"] == [] and data["found"]["cudnn_include"]["source"] == "--cudnn-include"
    assert data["state"] == "unavailable" and data["cache_dir"] == str(tree["root"] / "cache/plugins")
    assert_user_error(run_cli("plugins", "path", env=_env(tree)), "no usable plugin library (unavailable)")


def test_build_turns_plugins_off_with_none_alone(tiny_fcn_clean, tmp_path):
    proc = run_cli(
        "build",
        str(tiny_fcn_clean),
        "-o",
        str(tmp_path / "m.engine"),
        "--plugin-library",
        "none",
        "--plugin-library",
        str(tmp_path / "x.so"),
    )
    assert_user_error(proc, "--plugin-library none turns plugin libraries off", "give it alone")


def test_a_real_build_goes_through_the_default_choice_and_records_no_library_on_tensorrt_rtx(tiny_fcn_clean, tmp_path):
    """CPU CI builds with TensorRT-RTX, which loads no plugins: a cache that holds a library changes nothing."""
    _cached(tmp_path / "cache", "trt8.6.1-cuda12.4-sm90", sources_digest(NATIVE))
    engine = tmp_path / "m.engine"
    proc = run_cli("build", str(tiny_fcn_clean), "-o", str(engine), "--json", env={"TRTFORGE_CACHE_DIR": str(tmp_path / "cache")})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["plugin_libraries"] == [] and "plugin library not loaded" not in proc.stderr


def test_an_installation_without_the_native_sources_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(plugins_build, "NATIVE_DIR", tmp_path / "native")
    with pytest.raises(UserError, match=r"the plugin sources are not in this installation .*trtforge/native/"):
        plugins_build.native_sources()
    monkeypatch.setattr(plugins_build, "gpu_sm", lambda: 90)
    assert plugins_build.state_for("8.6.1", 90).status == "unavailable"


def test_a_cache_that_cannot_be_written_is_one_sentence(tree):
    blocker = tree["root"] / "cache"
    blocker.write_text("a file where the cache directory should be")
    proc = run_cli("plugins", "build", *_flags(tree), "--arch", "sm_90", env=_env(tree))
    assert_user_error(proc, "cannot create output folder", str(blocker))
