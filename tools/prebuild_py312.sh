#!/usr/bin/env bash
# Build the compiled modules (_core and, with nvcc on PATH, _cuda) for CPython 3.12 on this machine
# and copy them into DEST (default: ./out/prebuilt/cuscikit), so a GPU machine with Python 3.12 can
# import them from the tree instead of compiling there. Usage: bash tools/prebuild_py312.sh [DEST]
# Env: PY312 (the interpreter), CUDA=ON|OFF (default ON when nvcc is found), JOBS (default 2).
set -eu
cd "$(dirname "$0")/.."
PY=${PY312:-python3.12}
"$PY" -c "" 2> /dev/null || PY=/root/.pyenv/versions/3.12.1/bin/python3.12
DEST=${1:-out/prebuilt/cuscikit}
CUDA=${CUDA:-$(command -v nvcc > /dev/null && echo ON || echo OFF)}
WHEELS=$(mktemp -d)
"$PY" -m pip install -q nanobind scikit-build-core numpy > /dev/null
CMAKE_BUILD_PARALLEL_LEVEL=${JOBS:-2} "$PY" -m pip wheel -q --no-build-isolation --no-deps . \
  -C cmake.define.CUSCIKIT_CUDA="$CUDA" -C build-dir=build/py312-cuda"$CUDA" -w "$WHEELS"
mkdir -p "$DEST"
"$PY" - "$WHEELS" "$DEST" <<'PYEOF'
import pathlib, sys, zipfile
wheels, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
(whl,) = wheels.glob("*.whl")
with zipfile.ZipFile(whl) as z:
    for name in z.namelist():
        if name.startswith("cuscikit/") and name.endswith(".so"):
            (dest / pathlib.Path(name).name).write_bytes(z.read(name))
            print("prebuilt", dest / pathlib.Path(name).name)
PYEOF
rm -rf "$WHEELS"
