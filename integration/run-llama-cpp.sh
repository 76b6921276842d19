#!/usr/bin/env bash
# Check a metadata-only GGUF patch against llama.cpp (integration/llama_cpp_gguf.py).
#
#   integration/run-llama-cpp.sh [--work DIR]
#
# Creates integration/.venv-llama (git-ignored) on first use, or uses LLAMA_VENV if set:
# llama-cpp-python has no CPU wheel on PyPI, so pip builds llama.cpp from source (cmake and a C++
# compiler; about 30-40 minutes on two cores at low priority). GGML_NATIVE=OFF keeps the build
# portable. Then gguf and numpy, and the small dependencies of this project, which runs from this
# checkout (PYTHONPATH; no torch: GGUF patches never import it).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
venv="${LLAMA_VENV:-$here/.venv-llama}"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import llama_cpp, gguf" 2>/dev/null; then
    python3 -m venv "$venv"
    CMAKE_ARGS="${CMAKE_ARGS:--DGGML_NATIVE=OFF}" CMAKE_BUILD_PARALLEL_LEVEL="${CMAKE_BUILD_PARALLEL_LEVEL:-2}" \
        nice -n 19 "$venv/bin/pip" install -q llama-cpp-python
    "$venv/bin/pip" install -q "gguf>=0.17" numpy
fi
if ! "$venv/bin/python" -c "import click, jsonpatch, ruamel.yaml, packaging, tqdm" 2>/dev/null; then
    "$venv/bin/pip" install -q "click>=8.1" "jsonpatch>=1.33" "ruamel.yaml>=0.18" "packaging>=23" \
        "tqdm>=4.60"
fi
export PYTHONPATH="$repo${PYTHONPATH:+:$PYTHONPATH}"
exec "$venv/bin/python" "$here/llama_cpp_gguf.py" --modelpatch "$venv/bin/python -m patcher.cli" "$@"
