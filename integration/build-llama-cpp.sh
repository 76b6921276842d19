#!/usr/bin/env bash
# Build llama.cpp's llama-simple on the CPU for the consumer matrix's llama.cpp column
# (integration/llama_cpp_rows.py).
#
#   integration/build-llama-cpp.sh [DIR]        # default: $LLAMA_CPP_DIR or /tmp/llama.cpp
#
# The source is the llama.cpp tree vendored in llama-cpp-python's source distribution on PyPI
# (pinned version and sha256 below; llama.cpp commit 0c1e57098), unpacked to DIR outside the
# checkout. Only llama-simple and the libraries it links are built (static, GGML_NATIVE=ON: the
# binary is for this machine), at low priority. The converter's one extra module
# (sentencepiece, which convert_hf_to_gguf.py imports for every Llama) goes to DIR/build/pydeps.
# Prints the LLAMA_CPP_BIN to export for integration/consumer_matrix.py.
set -euo pipefail
LCP_VERSION=0.3.36
LCP_SHA256=832db0699007f1be95a7e41ef12e88926b02ba836461e36a36372db2760c1a2e
here="$(cd "$(dirname "$0")" && pwd)"
py="${PYTHON:-$(dirname "$here")/.venv/bin/python}"
[ -x "$py" ] || py=python3
dir="${1:-${LLAMA_CPP_DIR:-/tmp/llama.cpp}}"
if [ ! -f "$dir/convert_hf_to_gguf.py" ]; then
    tmp="$(mktemp -d)"
    trap 'rm -rf "$tmp"' EXIT
    "$py" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$LCP_VERSION" -d "$tmp"
    sdist="$tmp/llama_cpp_python-$LCP_VERSION.tar.gz"
    echo "$LCP_SHA256  $sdist" | sha256sum -c --quiet -
    tar -xzf "$sdist" -C "$tmp"
    mkdir -p "$(dirname "$dir")"
    mv "$tmp/llama_cpp_python-$LCP_VERSION/vendor/llama.cpp" "$dir"
    rm -f "$dir/.git"       # a submodule's gitdir link into llama-cpp-python's repository
fi
# -march=native turns on AMX where the CPU lists it, and ggml's AMX kernels then die with an
# illegal instruction (tilezero) on a Q8_0 matmul where the kernel gives no AMX state (as on
# this project's machines): AMX off, the rest native.
noamx="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
cmake -S "$dir" -B "$dir/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=OFF \
    -DCMAKE_C_FLAGS="$noamx" -DCMAKE_CXX_FLAGS="$noamx" >/dev/null
nice -n 10 cmake --build "$dir/build" -j "${JOBS:-2}" --target llama-simple
if [ ! -d "$dir/build/pydeps/sentencepiece" ]; then
    "$py" -m pip install -q --target "$dir/build/pydeps" "sentencepiece==0.2.1"
fi
echo "export LLAMA_CPP_BIN=$dir/build/bin"
