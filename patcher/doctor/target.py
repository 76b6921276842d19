"""What ``doctor`` checks a model against: an engine (name and version) and a GPU.

``--engine vllm==0.15.1`` names both; ``--engine vllm`` reads the installed version
(``importlib.metadata``). ``--gpu sm120`` names a compute capability (major * 10 + minor, as
vLLM's ``DeviceCapability.to_int``), one of ``KNOWN_CAPABILITIES``; ``--gpu auto`` asks torch, then
``nvidia-smi``. What cannot be found is a one-line ``InputError`` saying what to pass instead.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass

from ..errors import InputError

ENGINES = ("vllm", "sglang", "transformers")
GPU_NAME = re.compile(r"sm_?(\d+)(\d)[a-z]?")     # sm120: major 12, minor 0
#: The compute capabilities NVIDIA GPUs report (CUDA's list, Kepler to Blackwell: vLLM builds for
#: 7.0-12.1, with 10.1 renamed 11.0 in CUDA 13). A name outside it is a typo (sm1200), refused.
KNOWN_CAPABILITIES = (30, 32, 35, 37, 50, 52, 53, 60, 61, 62, 70, 72, 75, 80, 86, 87, 89, 90,
                      100, 101, 103, 110, 120, 121)


@dataclass(frozen=True)
class Target:
    engine: str | None = None
    engine_version: str | None = None
    gpu: int | None = None            # compute capability as major * 10 + minor (SM120: 120)

    def facts(self) -> dict:
        return {"engine": self.engine, "engine_version": self.engine_version,
                "gpu": None if self.gpu is None else f"sm{self.gpu}"}


def parse_engine(text: str | None) -> tuple[str | None, str | None]:
    """``vllm==0.15.1`` -> (vllm, 0.15.1); ``vllm`` -> (vllm, the installed version)."""
    if text is None:
        return None, None
    name, _, version = text.partition("==")
    name = name.strip().lower()
    if name not in ENGINES:
        raise InputError(f"unknown engine {name!r}: one of {', '.join(ENGINES)} "
                         f"(optionally ==VERSION)")
    if version:
        return name, _checked_version(version.strip(), name)
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return name, _checked_version(installed(name), name)
    except PackageNotFoundError:
        raise InputError(f"--engine {name}: {name} is not installed in this Python, so its "
                         f"version is unknown", hint=f"give it: --engine {name}==VERSION") from None


def _checked_version(text: str, name: str) -> str:
    from packaging.version import InvalidVersion, Version

    try:
        Version(text)
    except InvalidVersion:
        raise InputError(f"--engine {name}=={text}: not a version number") from None
    return text


def parse_gpu(text: str | None) -> int | None:
    """``sm120``/``sm_90``/``sm90a``/``12.0``/``auto`` -> the capability as an integer."""
    if text is None:
        return None
    text = text.strip().lower()
    if text == "auto":
        return detect_gpu()
    capability = _read_capability(text)
    if capability is None:
        raise InputError(f"--gpu {text}: give a compute capability such as sm90, sm120, 8.9 "
                         f"or auto")
    if capability not in KNOWN_CAPABILITIES:
        raise InputError(f"--gpu {text}: no NVIDIA GPU has compute capability "
                         f"{capability // 10}.{capability % 10} (known: "
                         f"{', '.join(f'sm{c}' for c in KNOWN_CAPABILITIES)}; or auto)")
    return capability


def _read_capability(text: str) -> int | None:
    m = GPU_NAME.fullmatch(text) or re.fullmatch(r"(\d+)\.(\d)", text)
    return int(m[1]) * 10 + int(m[2]) if m else None


def detect_gpu() -> int:
    """The compute capability of GPU 0, from torch, else nvidia-smi (a GPU newer than
    ``KNOWN_CAPABILITIES`` is taken as it reports itself)."""
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability(0)
            return major * 10 + minor
    except (ImportError, RuntimeError):
        pass
    smi = shutil.which("nvidia-smi")
    if smi:
        try:
            out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=30, check=True).stdout
            capability = _read_capability(out.split()[0].strip())
            if capability is not None:
                return capability
        except (OSError, subprocess.SubprocessError, IndexError):
            pass
    raise InputError("--gpu auto: no CUDA GPU found (torch sees none and nvidia-smi gives no "
                     "compute capability)", hint="name it: --gpu sm120 (or sm90, sm89, ...)")
