"""Doctor's targets and fixes: --gpu validated, rule text kept whole,
fix commands a shell can run, info fixes, GGUF models, stale quantization configs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from examples.generate import make_kimi_nvfp4
from patcher import api
from patcher.cli import main
from patcher.doctor.rules import load_rules
from patcher.errors import RecipeError


@pytest.fixture(scope="module")
def kimi(tmp_path_factory) -> Path:
    return make_kimi_nvfp4(tmp_path_factory.mktemp("doctor") / "kimi")


@pytest.mark.parametrize("gpu", ["sm1200", "sm13", "sm91", "12.3", "sm_999"])
def test_gpu_that_no_nvidia_gpu_has_is_refused_in_one_line(kimi, gpu):
    out = CliRunner().invoke(main, ["doctor", str(kimi), "--engine", "vllm==0.15.1",
                                    "--gpu", gpu])
    assert out.exit_code == 2, out.output
    assert f"--gpu {gpu}: no NVIDIA GPU has compute capability" in out.output
    assert len(out.output.strip().splitlines()) <= 2       # the error (and its hint)
    assert "Traceback" not in out.output


@pytest.mark.parametrize("gpu, name", [("sm120", "sm120"), ("sm_90a", "sm90"), ("8.9", "sm89"),
                                       ("sm121", "sm121"), ("sm70", "sm70"), ("sm103", "sm103")])
def test_real_compute_capabilities_are_taken(kimi, gpu, name):
    assert api.doctor(kimi, gpu=gpu).to_json()["target"]["gpu"] == name


def test_rule_naming_an_unknown_gpu_is_refused(kimi, tmp_path):
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "r.yaml").write_text(
        "doctor: 1\nid: r\nseverity: info\nsummary: s\nevidence:\n"
        "  - {source: x, versions: any}\nwhen:\n  gpu: [sm120, sm1210]\n")
    with pytest.raises(RecipeError, match=r"r\.yaml:8:\d+: gpu: cannot read"):
        api.doctor(kimi, rules=(str(rules),))


def _plain_scalars_followed_by_comment(text: str) -> list[str]:
    """``line:col value`` of each unquoted scalar that a ``#`` comment follows on its line:
    YAML ends a plain scalar at `` #``, so what looks like its tail is dropped."""
    import yaml

    lines, found = text.splitlines(), []

    def walk(node):
        if isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                walk(key)
                walk(value)
        elif isinstance(node, yaml.SequenceNode):
            for item in node.value:
                walk(item)
        elif node.style is None:        # plain: neither quoted nor a block scalar
            end = node.end_mark
            if lines[end.line][end.column:].lstrip().startswith("#"):
                found.append(f"{end.line + 1}:{node.start_mark.column + 1} {node.value!r}")

    walk(yaml.compose(text))
    return found


def test_no_builtin_rule_value_is_cut_by_a_comment():
    from patcher.doctor.rules import builtin_rules_dir

    cut = {p.name: _plain_scalars_followed_by_comment(p.read_text())
           for p in sorted(builtin_rules_dir().glob("*.yaml"))}
    assert {name: c for name, c in cut.items() if c} == {}
    assert _plain_scalars_followed_by_comment("a:\n  versions: x (PR #1 in 0.4)\n") == \
        ["2:13 'x (PR'"]


def test_evidence_versions_are_the_whole_text_of_the_rule_file():
    for rule in load_rules():
        raw = Path(rule.source).read_text()
        for evidence in rule.evidence:
            line = next(ln for ln in raw.splitlines()
                        if "versions:" in ln and evidence["versions"] in ln)
            shown = line.split("versions:", 1)[1].strip().rstrip("}").strip().strip("\"'")
            assert shown == evidence["versions"], (rule.id, line)


# --- the fix command, info fixes, --fix output -----------------------

def _model(path: Path, tensors: dict, **files) -> Path:
    from patcher.model.safetensors_io import OutputTensor, encode_header

    path.mkdir()
    header, layout = encode_header([OutputTensor(n, d, s) for n, (d, s) in tensors.items()],
                                   {"format": "pt"})
    (path / "model.safetensors").write_bytes(header + bytes(sum(t.nbytes for t in layout)))
    for name, doc in files.items():
        (path / name).write_text(json.dumps(doc, indent=2))
    return path


def _eos_model(path: Path) -> Path:
    """A Llama whose tokenizer ends turns with <|eot_id|> (128009), which the configs omit."""
    return _model(path, {"model.embed_tokens.weight": ("BF16", (4, 2))}, **{
        "config.json": {"model_type": "llama", "eos_token_id": 128001},
        "generation_config.json": {"eos_token_id": 128001},
        "tokenizer_config.json": {"eos_token": "<|eot_id|>", "added_tokens_decoder": {
            "128001": {"content": "<|end_of_text|>"}, "128009": {"content": "<|eot_id|>"}}}})


def _deepseek_mtp(path: Path) -> Path:
    return _model(path, {f"model.layers.{i}.mlp.down_proj.weight": ("BF16", (4, 4))
                         for i in range(3)}, **{"config.json": {
                             "model_type": "deepseek_v3", "num_hidden_layers": 2,
                             "num_nextn_predict_layers": 1}})


def _fix_lines(output: str) -> list[str]:
    return [ln.strip()[len("fix: "):] for ln in output.splitlines()
            if ln.strip().startswith("fix: ")]


def test_suggested_fix_command_runs_in_a_shell_with_the_model_path(tmp_path):
    """The printed command, run by bash, hands modelpatch exactly the recipe, the --set values
    (``<|eot_id|>`` is no redirection) and the model's real path (with its space)."""
    import subprocess
    import sys

    model = _eos_model(tmp_path / "my model")
    out = CliRunner().invoke(main, ["doctor", str(model)])
    [line] = _fix_lines(out.output)
    command, _, also = line.partition("  (")
    assert also == "or doctor --fix)"
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "modelpatch").write_text(
        f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    (bindir / "modelpatch").chmod(0o755)
    ran = subprocess.run(["bash", "-c", command], capture_output=True, text=True, check=True,
                         env={"PATH": f"{bindir}:/usr/bin:/bin"}, cwd=tmp_path / "bin")
    assert json.loads(ran.stdout) == [
        "apply", "fix-eos", "--set", "eos_token_id=128009,128001",
        "--set", "eos_token=<|eot_id|>", str(model)]


def test_info_fix_is_not_offered_as_doctor_fix_and_fix_says_it_wrote_nothing(tmp_path):
    model = _deepseek_mtp(tmp_path / "ds")
    shown = CliRunner().invoke(main, ["doctor", str(model)]).output
    assert _fix_lines(shown) == [f"modelpatch apply strip-mtp {model}"]
    assert "layers: 2" in shown                                   # the detail labelled
    fixed = CliRunner().invoke(main, ["doctor", str(model), "--fix", "-o",
                                      str(tmp_path / "out")])
    assert fixed.exit_code == 0
    assert fixed.output.splitlines()[-1] == (
        "--fix: nothing written: only info findings have a fix (strip-mtp), a choice left to "
        "you (apply it as shown)")
    assert not (tmp_path / "out").exists()


def test_fix_twice_needs_force_and_writes_model_doctor(tmp_path):
    model = _eos_model(tmp_path / "llama")
    first = CliRunner().invoke(main, ["doctor", str(model), "--fix"])
    assert first.exit_code == 0, first.output
    assert f"fixed with fix-eos: {tmp_path / 'llama-doctor'}" in first.output
    again = CliRunner().invoke(main, ["doctor", str(model), "--fix"])
    assert again.exit_code == 2 and "--force replaces it" in again.output
    forced = CliRunner().invoke(main, ["doctor", str(model), "--fix", "--force"])
    assert forced.exit_code == 0, forced.output
    assert api.verify(tmp_path / "llama-doctor").ok
    assert CliRunner().invoke(main, ["doctor", str(model), "--force"]).exit_code == 2


# --- a stale hf_quant_config.json -------------------------------------------

def test_compressed_tensors_config_beside_a_modelopt_hf_quant_config_disagrees(tmp_path):
    """The pair modelopt-to-compressed-tensors left before it dropped hf_quant_config.json:
    config.json says compressed-tensors NVFP4, hf_quant_config.json ModelOpt NVFP4."""
    from patcher.model.inspect_model import quantization_summary
    from patcher.model.model_dir import ModelDir

    base = Path(__file__).parent.parent / "fixtures" / "modelopt" / "llama-nvfp4"
    ct = api.apply("modelopt-to-compressed-tensors", base, out=tmp_path / "ct").output
    assert not (ct / "hf_quant_config.json").exists()
    assert "quant-config-disagreement" not in {f.rule for f in api.doctor(ct).findings}
    stale = tmp_path / "stale"
    stale.mkdir()
    for name in ("config.json", "hf_quant_config.json"):
        (stale / name).write_bytes(((ct if name == "config.json" else base) / name).read_bytes())
    expected = ("format: config.json quant_method compressed-tensors (nvfp4-pack-quantized) vs "
                "hf_quant_config.json ModelOpt NVFP4 (a ModelOpt file describing other tensors)")
    assert quantization_summary(ModelDir.open(stale))["disagreements"][0] == expected
    [finding] = [f for f in api.doctor(stale).to_json()["findings"]
                 if f["rule"] == "quant-config-disagreement"]
    assert finding["details"][0] == expected
    assert quantization_summary(ModelDir.open(base))["disagreements"] == []


# --- GGUF models --------------------------------------------------------------

def test_gguf_with_nextn_blocks_is_reported_and_gguf_strip_mtp_clears_it(tmp_path):
    pytest.importorskip("gguf")
    from gguf_fixtures import write_tiny

    (tmp_path / "g").mkdir()
    model = write_tiny(tmp_path / "g" / "mtp.gguf", arch="glm4moe", nextn=1)
    report = api.doctor(model, engine="vllm==0.15.1", gpu="sm120").to_json()
    [finding] = report["findings"]
    assert (finding["rule"], finding["severity"], finding["fix"]) == \
        ("gguf-mtp-layers-unused", "info", {"recipe": "gguf-strip-mtp"})
    assert finding["details"] == ["mtp.gguf: glm4moe.nextn_predict_layers = 1, the last 1 of 3 "
                                  "blocks"]
    shown = CliRunner().invoke(main, ["doctor", str(model)]).output
    assert f"fix: modelpatch apply gguf-strip-mtp {model}" in shown
    stripped = api.apply("gguf-strip-mtp", model, out=tmp_path / "stripped").output
    assert api.doctor(stripped).findings == ()


def test_gguf_model_is_never_reported_clean_silently(tmp_path):
    pytest.importorskip("gguf")
    from gguf_fixtures import write_tiny

    (tmp_path / "g").mkdir()
    model = write_tiny(tmp_path / "g" / "tiny.gguf")
    shown = CliRunner().invoke(main, ["doctor", str(model), "--engine", "vllm==0.15.1",
                                      "--gpu", "sm120"]).output
    assert "note       a GGUF model: only the rules that read GGUF metadata " \
           "(gguf-mtp-layers-unused, gguf-eos-inconsistent) checked it" in shown
    assert shown.splitlines()[-1] == "no findings"


def test_gguf_eos_that_is_not_the_tokenizers_is_fixed_by_doctor_fix(tmp_path):
    pytest.importorskip("gguf")
    from gguf_fixtures import write_tiny

    model = tmp_path / "g"                          # a directory: the GGUF and its tokenizer
    model.mkdir()
    write_tiny(model / "tiny.gguf")                 # eos_token_id 2
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": "t7"}))
    [finding] = api.doctor(model).to_json()["findings"]
    assert (finding["rule"], finding["severity"], finding["fix"]) == \
        ("gguf-eos-inconsistent", "warning", {"recipe": "gguf-fix-eos"})
    assert finding["details"] == ["tiny.gguf: tokenizer.ggml.eos_token_id is 2, but "
                                  "tokenizer_config.json's eos_token 't7' is token 7: "
                                  "generation does not stop at it"]
    fixed = CliRunner().invoke(main, ["doctor", str(model), "--fix", "--json"])
    assert fixed.exit_code == 0, fixed.output
    report = json.loads(fixed.output)
    assert report["fix"]["recipes"] == ["gguf-fix-eos"]
    assert report["fix"]["after"]["findings"] == []
    (model / "tokenizer_config.json").write_text(json.dumps({"eos_token": "t2"}))
    assert api.doctor(model).findings == ()


# --- doctor --fix with two fixes --------------------------------------------------------------

def _eos_and_tied_model(path: Path, lm_head: str) -> Path:
    """Two warnings with fixes: eos-inconsistent (fix-eos) and tied-lm-head-ignored
    (tie-embeddings, which drops only a top-level ``lm_head.weight``)."""
    model = _eos_model(path)
    config = json.loads((model / "config.json").read_text())
    config["tie_word_embeddings"] = True
    (model / "config.json").write_text(json.dumps(config, indent=2))
    from patcher.model.safetensors_io import OutputTensor, encode_header

    tensors = [OutputTensor("model.embed_tokens.weight", "BF16", (4, 2)),
               OutputTensor(lm_head, "BF16", (4, 2))]
    header, layout = encode_header(tensors, {"format": "pt"})
    (model / "model.safetensors").write_bytes(header + bytes(sum(t.nbytes for t in layout)))
    return model


def _tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_fix_with_two_fixes_can_force_over_its_own_output(tmp_path):
    model = _eos_and_tied_model(tmp_path / "llama", "lm_head.weight")
    first = CliRunner().invoke(main, ["doctor", str(model), "--fix"])
    assert first.exit_code == 0, first.output
    assert "fixed with fix-eos, tie-embeddings" in first.output, first.output
    out = tmp_path / "llama-doctor"
    again = CliRunner().invoke(main, ["doctor", str(model), "--fix", "--force"])
    assert again.exit_code == 0, again.output
    assert api.verify(out).ok
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama", "llama-doctor"]
    other = _eos_and_tied_model(tmp_path / "other", "lm_head.weight")
    stranger = CliRunner().invoke(main, ["doctor", str(other), "--fix", "--force", "-o",
                                         str(out)])       # stacked on another base: kept
    assert stranger.exit_code == 2 and "revert data of its own" in stranger.output
    assert api.verify(out).ok


@pytest.mark.parametrize("in_place", [False, True])
def test_fix_whose_second_recipe_refuses_leaves_nothing_half_fixed(tmp_path, in_place):
    model = _eos_and_tied_model(tmp_path / "gemma", "language_model.lm_head.weight")
    fixes = [fix.recipe for fix in api.doctor(model).fixes()]
    assert fixes == ["fix-eos", "tie-embeddings"], fixes        # the refusing one comes second
    before = _tree(model)
    args = ["--in-place"] if in_place else ["-o", str(tmp_path / "out")]
    result = CliRunner().invoke(main, ["doctor", str(model), "--fix", *args])
    assert result.exit_code == 1, result.output
    assert result.exc_info[0] is SystemExit and "Traceback" not in result.output
    errors = [line for line in result.output.splitlines() if line.startswith("modelpatch: ")]
    assert len(errors) == 1 and "no lm_head.weight to drop" in errors[0], result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gemma"]
    assert _tree(model) == before
