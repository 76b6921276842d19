"""Tensor transforms through the command line: failure paths (exit 2, one line naming the tensor,
nothing written), --device, drop-kv-scales on top of sm120-fp16-kv, --jobs, in-place and
revert, Hugging Face cache snapshots, and peak memory bounded by one tensor."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from tensor_helpers import (
    INDEX,
    assert_bits_equal,
    listing,
    random_fp8,
    read_tensors,
    shard_files,
    snapshot,
    tensor_shards,
    write_model,
    write_recipe,
)

from patcher import api
from patcher.cli import main

REPO = Path(__file__).resolve().parents[2]
KV = ("k_proj.k_scale", "v_proj.v_scale", "self_attn.k_scale", "self_attn.v_scale")


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def env() -> dict:
    paths = [str(REPO)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return dict(os.environ, PYTHONPATH=os.pathsep.join(paths))


# --- failure paths ---------------------------------------------------------------------------

def fp8_model(root: Path, *, scale_shape=(2, 2), with_scale=True) -> Path:
    gen = torch.Generator().manual_seed(0)
    second = {"x.other.weight": torch.randn(4, 4, generator=gen)}
    if with_scale:
        second["x.q_proj.weight_scale_inv"] = torch.rand(scale_shape, generator=gen)
    return write_model(root, {
        "model-00001-of-00002.safetensors": {"x.q_proj.weight": random_fp8((200, 130), gen),
                                             "x.norm.weight": torch.ones(130)},
        "model-00002-of-00002.safetensors": second})


DEQUANT_BLOCK = """
    - select: {glob: "*.weight", dtype: [F8_E4M3]}
      dequantize: {scheme: fp8-block, to: bf16}
    """

FAILURES = {
    "missing scale": (dict(with_scale=False), DEQUANT_BLOCK, "x.q_proj.weight",
                      "missing block scale 'x.q_proj.weight_scale_inv'"),
    "scale of the wrong shape": (dict(scale_shape=(1, 2)), DEQUANT_BLOCK, "x.q_proj.weight",
                                 "has shape [1, 2], expected [2, 2]"),
    "rename collision": ({}, """
        - select: {regex: '^x\\.(norm|other)\\.weight$'}
          rename: {pattern: '(norm|other)', to: 'same'}
        """, "x.other.weight", "rename collision"),
    "empty selection": ({}, """
        - select: {glob: "*.k_scale"}
          drop: true
        """, "*.k_scale", "matches no tensor"),
    "cast of FP8 without its scale": ({}, """
        - select: {glob: "x.q_proj.weight"}
          cast: bf16
        """, "x.q_proj.weight", "FP8 data needs its scale; use dequantize"),
    "auto scheme on a bf16 weight": ({}, """
        - select: {glob: "x.other.weight"}
          dequantize: {scheme: auto}
        """, "x.other.weight", "no quantization scheme"),
    "a computed tensor transformed again": ({}, """
        - select: {glob: "x.other.weight"}
          cast: fp16
        - select: {glob: "x.other.weight"}
          cast: fp32
        """, "x.other.weight", "cannot be transformed again"),
}


@pytest.mark.parametrize("case", list(FAILURES))
def test_failure_is_one_line_exit_2_and_nothing_written(tmp_path, case):
    model_kwargs, tensors, names, says = FAILURES[case]
    model = fp8_model(tmp_path / "m", **model_kwargs)
    recipe = write_recipe(tmp_path / "r.yaml", tensors)
    out = tmp_path / "out"
    before, parent = snapshot(model), listing(tmp_path)
    result = run("apply", recipe, model, "-o", out)
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("modelpatch: error: ")
    assert "r.yaml:" in lines[0]                    # the recipe line
    assert names in lines[0] and says in lines[0], lines[0]
    assert not out.exists() and listing(tmp_path) == parent   # no output, no staging, no lock
    assert snapshot(model) == before
    # plan (and apply --dry-run) report the same
    planned = run("plan", recipe, model)
    assert planned.exit_code == 2 and planned.stderr.strip() == lines[0]


@pytest.mark.parametrize("recipe", ["fp8-block-to-bf16", "nvfp4-to-bf16"])
def test_a_selection_holding_the_scales_too_dequantizes_their_weights(
        recipe, deepseek_fp8_dir, kimi_dir, tmp_path):
    """``mlp.down_proj.*`` selects the weight and its scales: the scales are used up with the
    weight (the same output as selecting the weight alone), not dequantized themselves."""
    model = deepseek_fp8_dir if recipe.startswith("fp8") else kimi_dir
    layer = ("model.layers.0.mlp.down_proj" if recipe.startswith("fp8")
             else "language_model.model.layers.1.mlp.experts.0.down_proj")
    scheme = "fp8-block" if recipe.startswith("fp8") else "nvfp4-modelopt"
    outs = {}
    for what, glob in (("weight", f"{layer}.weight"), ("all", f"{layer}.*")):
        r = write_recipe(tmp_path / f"{what}.yaml", f"""
            - select: {{glob: "{glob}"}}
              dequantize: {{scheme: {scheme}, to: bf16}}
            """)
        out = tmp_path / what
        result = run("apply", r, model, "-o", out, "-q")
        assert result.exit_code == 0, result.output
        outs[what] = {p.name: p.read_bytes() for p in shard_files(out)}
    assert outs["weight"] == outs["all"]


def test_empty_selection_allowed_when_the_recipe_says_so(tmp_path):
    model = fp8_model(tmp_path / "m")
    recipe = write_recipe(tmp_path / "r.yaml", """
        - select: {glob: "*.k_scale"}
          allow_empty: true
          drop: true
        """)
    # The plan changes nothing, which apply refuses unless --allow-noop.
    assert run("apply", recipe, model, "-o", tmp_path / "out", "-q").exit_code == 1
    result = run("apply", recipe, model, "-o", tmp_path / "out", "-q", "--allow-noop")
    assert result.exit_code == 0, result.output
    for shard in shard_files(model):                  # nothing to rewrite: all linked
        assert (tmp_path / "out" / shard.name).stat().st_ino == shard.stat().st_ino


def test_nvfp4_scale_of_the_wrong_shape_names_expected_shape(kimi_dir, tmp_path):
    """A ModelOpt NVFP4 block scale that does not match [out, in/16] is caught at plan time."""
    model = tmp_path / "kimi"
    shutil.copytree(kimi_dir, model)
    name = "language_model.model.layers.1.mlp.experts.0.down_proj.weight"
    shard = model / tensor_shards(model)[name[: -len("weight")] + "weight_scale"]
    tensors = read_tensors_of(shard)
    tensors[name[: -len("weight")] + "weight_scale"] = tensors[
        name[: -len("weight")] + "weight_scale"][:, :4].contiguous()
    shard.unlink()
    from safetensors.torch import save_file
    save_file(tensors, shard, metadata={"format": "pt"})
    index = json.loads((model / INDEX).read_text())
    index["metadata"]["total_size"] = sum(
        t.numel() * t.element_size() for t in read_tensors(model).values())
    (model / INDEX).write_text(json.dumps(index))
    result = run("apply", "nvfp4-to-bf16", model)
    assert result.exit_code == 2, result.output
    assert len(result.stderr.strip().splitlines()) == 1
    assert f"tensor '{name}'" in result.stderr
    assert "has shape [256, 4], expected [256, 8]" in result.stderr
    assert not model.with_name("kimi-nvfp4-to-bf16").exists()


def read_tensors_of(shard: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    return load_file(shard)


def test_failure_while_writing_leaves_nothing(tmp_path):
    """An I/O error in a worker process in the middle of a shard (injected with the engine's
    fault points): exit 3, one line, no output and no staging directory."""
    model = fp8_model(tmp_path / "m")
    recipe = write_recipe(tmp_path / "r.yaml", """
        - select: {glob: "*.weight", dtype: [F8_E4M3]}
          dequantize: {scheme: fp8-block, to: bf16}
        - select: {glob: "x.other.weight"}
          cast: fp16
        """)
    parent = listing(tmp_path)
    proc = subprocess.run(
        [sys.executable, "-m", "patcher.cli", "apply", str(recipe), str(model), "-o",
         str(tmp_path / "out"), "--jobs", "2", "-q"],
        env=dict(env(), MODELPATCH_FAULT="eio@tensor:x.other.weight"),
        capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    # the digest cache (this test's, under tmp_path) may have been opened; nothing else is new
    assert [n for n in listing(tmp_path) if n != "digest-cache"] == parent


# --- --device ----------------------------------------------------------------------------------

@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_device_cuda_without_cuda_is_refused_at_plan_time(deepseek_fp8_dir, tmp_path):
    out = tmp_path / "out"
    for command in (["apply", "fp8-block-to-bf16", deepseek_fp8_dir, "-o", out,
                     "--device", "cuda"],
                    ["plan", "fp8-block-to-bf16", deepseek_fp8_dir, "--device", "cuda:1"]):
        result = run(*command)
        assert result.exit_code == 2, result.output
        line, = result.stderr.strip().splitlines()
        assert "CUDA is not available" in line and "--device cpu" in line
        assert not out.exists()
    result = run("plan", "fp8-block-to-bf16", deepseek_fp8_dir, "--device", "gpu0")
    assert result.exit_code == 2
    assert "--device gpu0 is not a device" in result.stderr


def test_device_cpu_0_is_the_cpu(deepseek_fp8_dir, tmp_path):
    """torch accepts cpu:0 for the CPU; the shard writer took any name but "cpu" for a GPU and
    failed in torch.cuda.Stream."""
    outs = []
    for device in ("cpu", "cpu:0"):
        out = tmp_path / device.replace(":", "")
        result = run("apply", "fp8-block-to-bf16", deepseek_fp8_dir, "-o", out, "--device", device,
                     "-q")
        assert result.exit_code == 0, result.output
        outs.append(sorted((p.name, p.read_bytes()) for p in out.glob("*.safetensors")))
    assert outs[0] == outs[1]


# --- drop-kv-scales on top of sm120-fp16-kv --------------------------------------------------

def test_drop_kv_scales_on_top_of_sm120_variant(kimi_dir, tmp_path):
    base_before = snapshot(kimi_dir)
    refused = run("apply", "drop-kv-scales", kimi_dir, "-o", tmp_path / "refused")
    assert refused.exit_code == 1
    assert "apply sm120-fp16-kv first" in refused.stderr
    assert not (tmp_path / "refused").exists()

    fp16_kv = Path(run("apply", "sm120-fp16-kv", kimi_dir, "-o", tmp_path / "v1", "-q")
                   .stdout.strip())
    result = run("apply", "drop-kv-scales", fp16_kv, "-o", tmp_path / "v2", "-q")
    assert result.exit_code == 0, result.output
    out = Path(result.stdout.strip())
    base, after = read_tensors(kimi_dir), read_tensors(out)
    dropped = sorted(n for n in base if n.endswith(KV))
    assert len(dropped) == 6
    assert sorted(set(base) - set(after)) == dropped
    for name, tensor in after.items():
        assert_bits_equal(tensor, base[name], name)
    with_kv = {s for n, s in tensor_shards(kimi_dir).items() if n.endswith(KV)}
    for shard in shard_files(kimi_dir):
        same = (out / shard.name).stat().st_ino == shard.stat().st_ino
        assert same == (shard.name not in with_kv), shard.name
    index = json.loads((out / INDEX).read_text())
    assert index["weight_map"] == tensor_shards(out)
    assert run("inspect", out).exit_code == 0
    assert run("verify", out).exit_code == 0
    assert snapshot(kimi_dir) == base_before
    # revert of the second patch gives back the sm120 variant's files, byte for byte
    rebuilt = tmp_path / "rebuilt"
    assert run("revert", out, "-o", rebuilt).exit_code == 0
    for shard in shard_files(fp16_kv):
        assert (rebuilt / shard.name).read_bytes() == shard.read_bytes()


def test_drop_kv_scales_in_place_then_revert(kimi_dir, tmp_path):
    fp16_kv = tmp_path / "v1"
    assert run("apply", "sm120-fp16-kv", kimi_dir, "-o", fp16_kv, "-q").exit_code == 0
    work = tmp_path / "work"
    shutil.copytree(fp16_kv, work)
    before = {p.name: p.read_bytes() for p in shard_files(work)}
    result = run("apply", "drop-kv-scales", work, "--in-place", "-q")
    assert result.exit_code == 0, result.output
    assert not [n for n in read_tensors(work) if n.endswith(KV)]
    assert api.verify(work).ok
    assert run("revert", work).exit_code == 0
    assert {p.name: p.read_bytes() for p in shard_files(work)} == before


# --- --jobs ------------------------------------------------------------------------------------

def test_jobs_2_writes_the_same_bytes_as_jobs_1(kimi_dir, tmp_path):
    outs = []
    for jobs in ("1", "2"):
        out = tmp_path / f"j{jobs}"
        result = run("apply", "nvfp4-to-bf16", kimi_dir, "-o", out, "--jobs", jobs, "-q")
        assert result.exit_code == 0, result.output
        outs.append(out)
    files = [sorted(p.relative_to(o).as_posix() for p in o.rglob("*") if p.is_file()
                    and ".modelpatch" not in p.parts) for o in outs]
    assert files[0] == files[1]
    for rel in files[0]:
        if rel == "modelpatch.provenance.json":
            subjects = [json.loads((o / rel).read_text())["subject"] for o in outs]
            assert subjects[0] == subjects[1]
        else:
            assert (outs[0] / rel).read_bytes() == (outs[1] / rel).read_bytes(), rel


# --- Hugging Face cache snapshot as the base ---------------------------------------------------

def test_hf_cache_snapshot_base_is_read_never_written(deepseek_fp8_dir, tmp_path):
    from examples.generate import make_hf_cache_snapshot

    snap = make_hf_cache_snapshot(deepseek_fp8_dir, tmp_path / "hub")
    blobs = snap.parents[1] / "blobs"
    before = snapshot(blobs.parent)
    result = run("apply", "fp8-block-to-bf16", snap, "-o", tmp_path / "out", "-q")
    assert result.exit_code == 0, result.output
    assert snapshot(blobs.parent) == before
    expected = read_tensors(api.apply("fp8-block-to-bf16", deepseek_fp8_dir,
                                      out=tmp_path / "plain").output)
    got = read_tensors(tmp_path / "out")
    assert sorted(got) == sorted(expected)
    for name in got:
        assert_bits_equal(got[name], expected[name], name)


# --- memory --------------------------------------------------------------------------------

MEMORY_CHILD = textwrap.dedent("""
    import resource, subprocess, sys
    proc = subprocess.run(sys.argv[1:], capture_output=True, text=True)
    if proc.returncode:
        sys.exit(proc.stderr)
    print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)
""")


def peak_rss(command: list[str]) -> int:
    """Peak RSS of ``command``, measured by a small intermediate interpreter: a child's
    ru_maxrss starts from the RSS of the process that forked it, so pytest (with torch and the
    test data loaded) must not be the one that starts the measured process."""
    out = subprocess.run([sys.executable, "-c", MEMORY_CHILD, *command], env=env(),
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return int(out.stdout.strip())


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="ru_maxrss in KiB is Linux's")
def test_peak_memory_is_bounded_by_a_few_tensors_not_the_shard(tmp_path):
    """One 512 MiB shard of 16 x 32 MiB bf16 tensors. Every tensor is cast to fp16 or copied in
    bulk, and one is dropped. The rewrite's peak RSS must stay far below the shard: interpreter
    + torch (~150-250 MiB) plus the pipeline's few tensors (``patcher.shard_pipeline``: the
    source read ahead, the source and output being computed, the output being written). A
    shard-at-a-time rewrite (load_file/save_file) would need at least 512 MiB more than that.

    The same command on a tiny model measures the fixed cost of the interpreter and torch, so
    the bound on the difference does not depend on how big torch is on this machine."""
    tensor_mb, count = 32, 16
    rows = tensor_mb * 2**20 // 2 // 4096
    pattern = torch.arange(4096, dtype=torch.float32).to(torch.bfloat16)
    shard = {f"layers.{i}.w.weight": pattern.repeat(rows, 1) for i in range(count)}
    big = write_model(tmp_path / "big", {"model-00001-of-00001.safetensors": shard})
    del shard
    small = write_model(tmp_path / "small", {"model-00001-of-00001.safetensors": {
        f"layers.{i}.w.weight": pattern.reshape(1, -1).clone() for i in range(count)}})
    recipe = write_recipe(tmp_path / "r.yaml", """
        - select: {regex: 'layers\\.([0-9]|1[0-3])\\.'}
          cast: fp16
        - select: {glob: "layers.15.*"}
          drop: true
        """)
    mp = [sys.executable, "-m", "patcher.cli", "apply", str(recipe)]
    fixed = peak_rss(mp + [str(small), "-o", str(tmp_path / "small-out"), "-q", "--jobs", "1"])
    peak = peak_rss(mp + [str(big), "-o", str(tmp_path / "big-out"), "-q", "--jobs", "1"])
    shard_bytes = (big / "model-00001-of-00001.safetensors").stat().st_size
    tensor_bytes = tensor_mb * 2**20
    out = read_tensors(tmp_path / "big-out")
    assert sorted(out) == sorted(f"layers.{i}.w.weight" for i in range(15))
    assert out["layers.0.w.weight"].dtype == torch.float16
    assert out["layers.13.w.weight"].dtype == torch.float16
    assert out["layers.14.w.weight"].dtype == torch.bfloat16
    del out
    grew = peak - fixed
    print(f"peak RSS {peak / 2**20:.0f} MiB, fixed {fixed / 2**20:.0f} MiB, "
          f"grew {grew / 2**20:.0f} MiB for a {shard_bytes / 2**20:.0f} MiB shard")
    assert grew < 6 * tensor_bytes, grew    # four tensors in the pipeline, chunk temporaries
    assert peak < shard_bytes, peak


# --- CUDA (runs where a GPU is visible; skipped elsewhere) --------------------------------------

def _cpu_and_cuda_outputs(recipe, model, tmp_path, jobs) -> dict[str, dict[str, bytes]]:
    outs = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / f"{Path(str(recipe)).stem}-{device}"
        result = run("apply", recipe, model, "-o", out, "--device", device, "--jobs", jobs, "-q")
        assert result.exit_code == 0, result.output
        outs[device] = {p.name: p.read_bytes() for p in shard_files(out)}
    return outs


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
@pytest.mark.parametrize("jobs", ["1", "2"])
def test_cuda_dequantize_writes_the_same_bytes_as_cpu(kimi_dir, deepseek_fp8_dir, tmp_path, jobs):
    """The kernels on the GPU (--device cuda; workers spawned for --jobs 2) give the very bytes
    the CPU path gives: the same float32 products, rounded once the same way. (Passed on an
    H200, torch 2.11+cu130.)"""
    cast = write_recipe(tmp_path / "c.yaml", """
        - select: {glob: "*.k_scale"}
          cast: fp16
        """)
    for recipe, model in (("nvfp4-to-bf16", kimi_dir), ("fp8-block-to-bf16", deepseek_fp8_dir),
                          (cast, kimi_dir)):
        outs = _cpu_and_cuda_outputs(recipe, model, tmp_path, jobs)
        assert outs["cpu"] == outs["cuda"], recipe


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_quantize_writes_the_same_bytes_as_cpu(kimi_dir, tmp_path):
    """Scales are ``amax / 448`` with the divisor a 0-dim tensor on the device: PyTorch's CUDA
    kernel turns division by a CPU scalar into a multiplication by its reciprocal, which differed
    from the CPU's correctly rounded division in the last bit on an H200 (torch 2.11+cu130).
    NVFP4 divides its group maxima by a 0-dim tensor for the same reason (not yet run on a
    GPU)."""
    quantize = write_recipe(tmp_path / "q.yaml", """
        - select: {regex: 'mlp\\.(gate|up|down)_proj\\.weight$', dtype: [BF16]}
          quantize: {scheme: fp8-block, layout: deepseek}
        - select: {regex: 'self_attn\\.o_proj\\.weight$', dtype: [BF16]}
          quantize: {scheme: fp8-tensor, layout: modelopt}
        - select: {regex: 'self_attn\\.q_[ab]_proj\\.weight$', dtype: [BF16]}
          quantize: {scheme: nvfp4-compressed-tensors, layout: compressed-tensors}
        """)
    outs = _cpu_and_cuda_outputs(quantize, kimi_dir, tmp_path, "1")
    assert outs["cpu"] == outs["cuda"]


def test_apply_shows_the_plans_warnings(kimi_dir, tmp_path):
    """What `plan` warns about, `apply` says too (on stderr; -q silences it)."""
    recipe = write_recipe(tmp_path / "r.yaml", """
        - select: {glob: "*.weight", dtype: [U8]}
          dequantize: {scheme: nvfp4-modelopt}
        """)
    planned = run("plan", recipe, kimi_dir)
    warnings = [line for line in planned.stdout.splitlines() if line.startswith("warning: ")]
    assert warnings, planned.stdout
    applied = subprocess.run([sys.executable, "-m", "patcher.cli", "apply", str(recipe),
                              str(kimi_dir), "-o", str(tmp_path / "v")],
                             env=env(), capture_output=True, text=True, timeout=300)
    assert applied.returncode == 0, applied.stderr
    shown = [line.removeprefix("modelpatch: ") for line in applied.stderr.splitlines()
             if line.startswith("modelpatch: warning: ")]
    assert shown == warnings
    quiet = subprocess.run([sys.executable, "-m", "patcher.cli", "-q", "apply", str(recipe),
                            str(kimi_dir), "-o", str(tmp_path / "q")],
                           env=env(), capture_output=True, text=True, timeout=300)
    assert quiet.returncode == 0 and "warning" not in quiet.stderr
