"""Every string from a model, a recipe or a rule reaches the terminal escaped: a model whose
every name holds ESC, OSC 52 (clipboard), OSC 8 (link), CSI (clear screen) and their C1 forms
goes through every command, and no control byte but a newline or tab reaches stdout or
stderr (CliRunner's streams are pipes: OSC was never stripped there). ``--json`` output
stays valid JSON that gives the names back exactly. And no module writes to a terminal past
``patcher.cli.output``."""

from __future__ import annotations

import ast
import io
import json
import logging
import re
from pathlib import Path

import click
import numpy as np
import pytest
from click.testing import CliRunner
from gguf_fixtures import gguf, needs_gguf
from hostile_helpers import S1, S2, make_model

from patcher.cli import main
from patcher.cli.output import echo_json, escape_log_lines

# OSC 52 sets the clipboard to "rm -rf ~"; OSC 8 plants a link; CSI clears the screen; C1 CSI
# and OSC (one byte each) do the same on terminals that read 8-bit controls; DEL last.
EVIL = ("\x1b]52;c;cm0gLXJmIH4=\x07\x1b]8;;https://evil.example/\x1b\\click\x1b]8;;\x1b\\"
        "\x1b[2J\x1b[H\x9b2J\x9d0;title\x9c\x7f")
YAML_EVIL = EVIL.encode("unicode_escape").decode().replace("\\x1b", "\\e")  # a YAML "..." escape
RAW_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
TENSOR = f"model.layers.0.mlp{EVIL}\nOK  a fake line.weight"
FAKE = "OK  a fake line"


def _clean(text: str, what: str) -> None:
    found = RAW_CONTROL.search(text)
    assert found is None, f"{what}: raw {found.group()!r} at {found.start()}: {text!r}"


def run(*args, code: int | None = 0) -> tuple[str, str]:
    result = CliRunner().invoke(main, [str(a) for a in args])
    assert "Traceback" not in result.output, result.output
    assert not any(line.startswith(FAKE) for line in result.output.splitlines()), result.output
    if code is not None:
        assert result.exit_code == code, (args, result.exit_code, result.output)
    _clean(result.stdout, f"{args[0]} stdout")
    _clean(result.stderr, f"{args[0]} stderr")
    return result.stdout, result.stderr


@pytest.fixture(autouse=True)
def _digest_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MODELPATCH_CACHE_DIR", str(tmp_path / "digest-cache"))


@pytest.fixture
def evil_model(tmp_path) -> Path:
    shards = {S1: {"model.embed_tokens.weight": ("BF16", [8, 4], 64),
                   TENSOR: ("BF16", [4, 4], 32)},
              S2: {f"lm_head{EVIL}.weight": ("BF16", [8, 4], 64)}}
    config = {"architectures": [f"Llama{EVIL}ForCausalLM"], "model_type": f"llama{EVIL}",
              "eos_token_id": 2, "note": EVIL}
    root = make_model(tmp_path / "evil", shards=shards, config=config)
    (root / "generation_config.json").write_text(json.dumps({"eos_token_id": 2}))
    eos = f"<eos{EVIL}>"
    (root / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": eos, "added_tokens_decoder": {"7": {"content": eos}}}))
    return root


RECIPE = f"""\
modelpatch: 1
name: evil
description: "drops a tensor {YAML_EVIL}"
config:
  config.json:
    - set: "/note{YAML_EVIL}"
      value: "{YAML_EVIL}"
tensors:
  - select: {{regex: 'mlp'}}
    drop: true
"""


def test_every_command_escapes_the_names_it_prints(evil_model, tmp_path):
    recipe = tmp_path / "evil.yaml"
    recipe.write_text(RECIPE)

    out, _ = run("inspect", evil_model)
    assert "Llama\\x1b]52;c;" in out and "\\x9b2J" in out   # shown, escaped
    data = json.loads(run("inspect", "--json", evil_model)[0])
    assert data["architectures"][0]["architectures"] == [f"Llama{EVIL}ForCausalLM"]

    out, _ = run("plan", recipe, evil_model)
    assert "mlp\\x1b]52;c;" in out
    plan = json.loads(run("plan", "--json", recipe, evil_model)[0])
    assert any(c.get("tensor") == TENSOR for c in plan["changes"])

    variant = tmp_path / "variant"
    run("apply", recipe, evil_model, "-o", variant)
    run("verify", variant)
    (variant / "generation_config.json").unlink()
    (variant / "generation_config.json").write_text(json.dumps({"eos": EVIL}))
    run("verify", variant, code=1)
    run("verify", "--json", variant, code=1)
    run("revert", variant, "-o", tmp_path / "reverted", "--ignore-changes")

    guarded = tmp_path / "guarded.yaml"
    guarded.write_text(RECIPE.replace("config:\n", f"""requires:
  - {{file: config.json, path: /missing, exists: true,
     message: "needs {YAML_EVIL}\\nmodelpatch: fine"}}
config:
""", 1))
    _, err = run("apply", guarded, evil_model, "-o", tmp_path / "refused", code=1)
    assert "needs \\x1b]52" in err and len(err.splitlines()) == 1
    run("--json", "apply", guarded, evil_model, "-o", tmp_path / "refused", code=1)

    out, _ = run("doctor", evil_model, "--engine", "vllm==0.15.1", "--gpu", "sm90")
    assert "eos_token=<eos\\x1b]52" in out                  # the printed fix
    rules = tmp_path / "rules"
    rules.mkdir()
    (rules / "evil.yaml").write_text(f"""\
doctor: 1
id: evil-rule
severity: warning
summary: "a summary {YAML_EVIL}"
evidence:
  - {{source: "notes {YAML_EVIL}", versions: "any {YAML_EVIL}"}}
when:
  {{file: config.json, path: /note, exists: true}}
""")
    out, _ = run("doctor", evil_model, "--rules", rules, code=None)
    assert "a summary \\x1b]52" in out
    run("doctor", "--json", evil_model, "--rules", rules, code=None)

    (tmp_path / "shown.yaml").write_text(f"# {EVIL}\n" + RECIPE)
    run("recipes", "show", tmp_path / "shown.yaml", code=None)  # printed, then refused
    run("recipes", "list")


@needs_gguf
def test_gguf_keys_values_and_tensor_names_are_escaped(tmp_path):
    root = tmp_path / "g"
    root.mkdir()
    w = gguf.GGUFWriter(root / "evil.gguf", f"llama{EVIL}")
    w.add_name(f"tiny{EVIL}")
    w.add_key_value(f"general.evil{EVIL}", f"value {EVIL}", gguf.GGUFValueType.STRING)
    w.add_tensor(f"blk.0{EVIL}.weight", np.ones((4, 4), dtype=np.float32))
    w.add_tensor("output.weight", np.ones((4, 4), dtype=np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    out, _ = run("inspect", root)
    assert "general.evil\\x1b]52" in out and "blk.0" not in out and "\\x9b2J" in out
    run("inspect", "--json", root)


def test_log_lines_are_escaped(monkeypatch):
    """The command line's log handler (``logging.basicConfig``'s) escapes what a warning names."""
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    monkeypatch.setattr(logging.getLogger(), "handlers", [handler])
    escape_log_lines("modelpatch: %(message)s")
    logging.getLogger("modelpatch.test").warning("cannot read %s: %s", TENSOR, "x\ny")
    line = stream.getvalue()
    _clean(line, "log line")
    assert line.count("\n") == 1
    assert line.startswith("modelpatch: cannot read model.layers.0.mlp\\x1b")


def test_json_output_escapes_every_control_as_json():
    """C1 controls too: ``json.dumps`` escapes only C0 unless ``ensure_ascii``."""
    out = CliRunner().invoke(click.command()(lambda: echo_json({"name": EVIL}))).stdout
    _clean(out, "json")
    assert "\\u009b" in out and json.loads(out) == {"name": EVIL}


_WRITERS = {"print", "echo", "secho"}
_OWNER = Path(__file__).resolve().parents[2] / "patcher"


def test_no_module_writes_to_a_terminal_past_the_escape():
    """``print``, ``click.echo``/``secho`` and ``sys.stdout/stderr.write`` appear only in
    ``patcher/cli/output.py``: a new output path cannot forget ``printable``."""
    found = []
    for path in sorted(_OWNER.rglob("*.py")):
        rel = path.relative_to(_OWNER).as_posix()
        if rel == "cli/output.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            if isinstance(f, ast.Name) and f.id == "print":
                found.append(f"{rel}:{node.lineno} print")
            elif isinstance(f, ast.Attribute) and f.attr in _WRITERS and \
                    isinstance(f.value, ast.Name) and f.value.id == "click":
                found.append(f"{rel}:{node.lineno} click.{f.attr}")
            elif isinstance(f, ast.Attribute) and f.attr == "write" and \
                    isinstance(f.value, ast.Attribute) and f.value.attr in ("stdout", "stderr"):
                found.append(f"{rel}:{node.lineno} sys.{f.value.attr}.write")
    assert found == []
