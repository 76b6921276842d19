"""``modelpatch sign`` and ``verify --key`` as a user runs them, each in its own process: what
they import. Signing costs milliseconds once the process is up, so its wall time is start-up;
the tensor libraries, the hub client and the bundle models (pydantic) stay out of it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from signing_helpers import small_model, variant, write_key

REPO = Path(__file__).resolve().parents[2]

# Run as `python -m patcher.cli` runs, then report the modules loaded once it is done.
PROBE = """
import atexit, json, os, runpy, sys
def report():
    with open(os.environ["MODULES_OUT"], "w") as f:
        json.dump(sorted(sys.modules), f)
atexit.register(report)
sys.argv = ["modelpatch", *sys.argv[1:]]
runpy.run_module("patcher.cli", run_name="__main__", alter_sys=True)
"""

NEVER = ("torch", "numpy", "transformers", "huggingface_hub", "safetensors", "yaml", "ray",
         "pydantic", "sigstore_models", "sigstore")


def _modules(tmp_path: Path, *args) -> set[str]:
    out = tmp_path / "modules.json"
    env = dict(os.environ, MODULES_OUT=str(out),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", PROBE, *map(str, args)], cwd=REPO, env=env,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return set(json.loads(out.read_text()))


@pytest.fixture(scope="module")
def signed(tmp_path_factory):
    root = tmp_path_factory.mktemp("start-up")
    keys = write_key(root, "quick")
    return variant(small_model(root / "base"), root / "variant"), keys


def test_sign_imports_only_what_signing_with_a_key_uses(tmp_path, signed):
    out, (private, _) = signed
    loaded = _modules(tmp_path, "sign", out, "--key", private)
    assert (out / "model.sig").is_file()
    heavy = sorted(m for m in loaded if m.split(".")[0] in NEVER)
    assert not heavy, heavy
    # Neither the header readers nor certificate handling: a bare key signs from the manifest.
    assert "patcher.model.model_dir" not in loaded
    assert "cryptography.x509" not in loaded


def test_verify_with_a_key_imports_no_tensor_library_nor_the_bundle_models(tmp_path, signed):
    out, (_, public) = signed
    loaded = _modules(tmp_path, "verify", out, "--key", public)
    heavy = sorted(m for m in loaded if m.split(".")[0] in NEVER)
    assert not heavy, heavy
