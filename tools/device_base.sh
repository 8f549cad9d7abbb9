# Sourced by the device scripts that compare this tree with another version of the NNQS package:
# sets out ($OUT, created), root (the tree, on PYTHONPATH), checks that the compiled kernels load,
# prints the GPU, and sets base: a copy of the tree with BASE_NNQS's *.py laid over
# cuscikit/nnqs (empty without BASE_NNQS), for PYTHONPATH=$base runs of the other version.
set -uo pipefail
export PYTHONUNBUFFERED=1
out=${OUT:-out}
mkdir -p "$out"
root=$PWD
export PYTHONPATH=$root
python3 -c "import cuscikit; from cuscikit.backends import cuda; k = cuda(); \
print(cuscikit.__file__, 'kernels sm_' + k.build_arch())" || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader
base=""
if [ -n "${BASE_NNQS:-}" ]; then
  base=$(mktemp -d)
  cp -r "$root/cuscikit" "$root/datasets" "$base/" && cp "$BASE_NNQS"/*.py "$base/cuscikit/nnqs/"
fi
