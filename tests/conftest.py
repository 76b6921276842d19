"""Shared fixtures: the example model directories, generated once per test session.

The directories are shared by every test in the session: a test that changes files must copy the
directory first (``shutil.copytree``). ``examples.generate`` (and so torch) is imported only when
a test asks for one of these fixtures.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))


@pytest.fixture(scope="session")
def examples_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A session directory holding every example model, one subdirectory per name."""
    from examples import generate

    out = tmp_path_factory.mktemp("examples")
    generate.make_all(out)
    return out


@pytest.fixture(scope="session")
def kimi_dir(examples_dir: Path) -> Path:
    """The nvidia/Kimi-K2.5-NVFP4 look-alike (ModelOpt NVFP4, FP8 KV cache, 4 shards)."""
    from examples import generate

    return examples_dir / generate.KIMI


@pytest.fixture(scope="session")
def deepseek_fp8_dir(examples_dir: Path) -> Path:
    """The DeepSeek-V3 look-alike with 128x128 block FP8 weights (3 shards)."""
    from examples import generate

    return examples_dir / generate.DEEPSEEK_FP8


@pytest.fixture(scope="session")
def tiny_bf16_dir(examples_dir: Path) -> Path:
    """A tiny transformers DeepseekV3ForCausalLM saved by save_pretrained (bf16, 3 shards)."""
    from examples import generate

    return examples_dir / generate.TINY_BF16


@pytest.fixture(autouse=True, scope="session")
def _private_digest_cache(tmp_path_factory):
    """Keep the tests' digest cache out of the user's ~/.cache (tests may still override it)."""
    import os

    path = tmp_path_factory.mktemp("digest-cache")
    old = os.environ.get("MODELPATCH_CACHE_DIR")
    os.environ["MODELPATCH_CACHE_DIR"] = str(path)
    yield
    if old is None:
        os.environ.pop("MODELPATCH_CACHE_DIR", None)
    else:
        os.environ["MODELPATCH_CACHE_DIR"] = old
