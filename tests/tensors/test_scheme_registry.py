"""The registry of quantization schemes (``patcher.tensors.schemes.SCHEMES``): recipe validation
reads its names and the tensor computations dispatch through its objects, so a new format is one
new object."""

from __future__ import annotations

import subprocess
import sys

import torch

from patcher.model.safetensors_io import OutputTensor
from patcher.recipe.tensor_ops.schema import DEQUANT_SCHEMES, QUANT_COMBINATIONS, QUANT_SCHEMES
from patcher.tensors import compute as compute_module
from patcher.tensors.schemes import SCHEMES, QuantScheme
from patcher.tensors.tasks import TensorJob, TensorSource


def test_recipe_validation_reads_the_scheme_names_from_the_registry():
    assert DEQUANT_SCHEMES == (*SCHEMES, "auto")
    assert QUANT_SCHEMES == ("fp8-tensor", "fp8-block", "nvfp4-compressed-tensors")
    assert QUANT_COMBINATIONS == (("fp8-tensor", "modelopt"), ("fp8-tensor", "compressed-tensors"),
                                  ("fp8-block", "deepseek"), ("fp8-block", "compressed-tensors"),
                                  ("nvfp4-compressed-tensors", "compressed-tensors"))
    assert all(isinstance(s, QuantScheme) and s.name == n for n, s in SCHEMES.items())


def test_the_registry_imports_no_torch():
    code = ("import sys\nimport patcher.tensors.schemes, patcher.recipe.tensor_ops.schema\n"
            "assert 'torch' not in sys.modules, 'torch imported'\n")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


class _Halves(QuantScheme):
    """A made-up format: the weight, halved."""

    name = "halves"

    def dequantize(self, inputs, out_dtype, device, block=None):
        return (inputs[0].to(torch.float32) / 2).to(out_dtype)


def test_a_new_scheme_is_one_object_in_the_registry(monkeypatch):
    monkeypatch.setitem(SCHEMES, "halves", _Halves())
    source = TensorSource(path="m.safetensors", shard="m.safetensors", name="w", dtype="F32",
                          shape=(2,), offset=0, nbytes=8)
    job = TensorJob(out=OutputTensor("w", "BF16", (2,)), op="dequantize", inputs=(source,),
                    params=(("scheme", "halves"), ("to", "BF16")))
    out = compute_module.compute(job, lambda: [torch.tensor([2.0, 6.0])], {}, "cpu")
    assert out.dtype is torch.bfloat16 and out.tolist() == [1.0, 3.0]


def test_a_quantization_computes_once_and_each_scale_job_takes_its_part():
    """The weight job computes every output and leaves the scales in the cache; each scale job
    takes its own; a scale job run alone (no cache) computes it again, the same bytes."""
    calls = []
    scheme = SCHEMES["nvfp4-compressed-tensors"]
    source = TensorSource(path="m.safetensors", shard="m.safetensors", name="x.weight",
                          dtype="F32", shape=(4, 32), offset=0, nbytes=512)
    w = torch.randn(4, 32, generator=torch.Generator().manual_seed(1))

    def read():
        calls.append(1)
        return [w]

    jobs = [TensorJob(out=OutputTensor(n, d, s), op="quantize", inputs=(source,),
                      params=(("scheme", scheme.name), ("layout", "compressed-tensors"),
                              ("block", None), ("role", r)))
            for n, d, s, r in scheme.quantized_outputs("x.weight", (4, 32), "compressed-tensors",
                                                       None)]
    assert [j.out.name for j in jobs] == ["x.weight_packed", "x.weight_scale",
                                          "x.weight_global_scale"]
    cache: dict = {}
    together = [compute_module.compute(j, read, cache, "cpu") for j in jobs]
    assert len(calls) == 1 and cache == {}
    alone = [compute_module.compute(j, read, {}, "cpu") for j in jobs]
    assert len(calls) == 4
    for a, b, job in zip(together, alone, jobs):
        assert a.shape == job.out.shape and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
