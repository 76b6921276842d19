#!/usr/bin/env bash
# Check sm120-fp16-kv against vLLM's own engine configuration (integration/vllm_config.py).
#
#   integration/run-vllm.sh [ARGS for vllm_config.py]      e.g. --only kimi-k25-nvfp4
#   integration/run-vllm.sh --matrix [ARGS for consumer_matrix.py]   the consumer matrix
#
# Creates integration/.venv-vllm (git-ignored) on first use: `pip install vllm` (a CUDA torch of
# several GB; the check itself runs on CPU with VLLM_TARGET_DEVICE=cpu), then this project with
# --no-deps (vLLM pins its own torch; nothing of ours may move it) plus the small dependencies
# vLLM does not bring (jsonpatch, ruamel.yaml; gguf-py for the matrix's GGUF rows). VLLM_SPEC overrides the requirement (default: vllm, the newest release).
# The work directory is a fresh temporary one unless --work is given; it is kept for inspection.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(dirname "$here")"
venv="$here/.venv-vllm"
if [ ! -x "$venv/bin/python" ] || ! "$venv/bin/python" -c "import vllm, patcher" 2>/dev/null; then
    python3 -m venv "$venv"
    "$venv/bin/pip" install -q "${VLLM_SPEC:-vllm}"
    "$venv/bin/pip" install -q "jsonpatch>=1.33" "ruamel.yaml>=0.18" "gguf>=0.17"
    "$venv/bin/pip" install -q --no-deps -e "$repo"
fi
script="$here/vllm_config.py"
if [ "${1:-}" = "--matrix" ]; then
    script="$here/consumer_matrix.py"
    shift
fi
case " $* " in
    *" --work "*) exec "$venv/bin/python" "$script" "$@" ;;
    *) exec "$venv/bin/python" "$script" --work "$(mktemp -d)" "$@" ;;
esac
