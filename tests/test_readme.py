"""The README's code blocks: every one is of a kind checked here.

A fenced block whose info string is ``bash runnable`` or ``python runnable`` is run, in README
order, in one temporary clone-like directory: ``examples/out/kimi-k25-nvfp4`` as the first command
generates it, and a ``.venv`` whose ``bin/`` holds this test environment's python and modelpatch
(nothing is installed; ``bin/pip`` does nothing). The first command's own modelpatch step is run
too, so later blocks meet the state it leaves. The one ``bash placeholders`` block (commands for a
real model, cluster or hub) is parsed by the command line; ``text`` blocks are output, checked
against what the command prints for the example; ``yaml`` blocks are loaded as recipes.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
BLOCK = re.compile(r"^```(bash|python) runnable\n(.*?)^```$", re.M | re.S)
ANY_BLOCK = re.compile(r"^```(.*?)\n(.*?)^```$", re.M | re.S)
KINDS = {"bash runnable", "python runnable", "bash placeholders", "text", "yaml"}


def runnable_blocks(text: str) -> list[tuple[str, str]]:
    return BLOCK.findall(text)


def first_command_modelpatch_steps(text: str) -> list[str]:
    """The ``.venv/bin/modelpatch ...`` steps of the README's first command."""
    first = text[text.index("```bash\n") + 8:].splitlines()[0]
    return [step.strip() for step in first.split("&&")
            if step.strip().startswith(".venv/bin/modelpatch ")]


def _fake_venv(root: Path) -> None:
    """``.venv/bin`` with this environment's interpreter and modelpatch; ``activate`` puts it
    first on PATH and this checkout first on PYTHONPATH."""
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    scripts = {"python": f'exec {sys.executable} "$@"',
               "modelpatch": f'exec {sys.executable} -c "import sys; from patcher.cli import '
                             f'main; sys.argv[0] = \'modelpatch\'; sys.exit(main())" "$@"',
               "pip": "exit 0"}
    for name, body in scripts.items():
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    (bin_dir / "python3").symlink_to("python")
    (bin_dir / "activate").write_text(f'export PATH="{bin_dir}:$PATH"\n')


def test_the_readme_marks_its_runnable_blocks():
    blocks = runnable_blocks((REPO / "README.md").read_text())
    languages = [lang for lang, _ in blocks]
    assert languages.count("bash") >= 2 and languages.count("python") >= 1
    commands = "\n".join(body for _, body in blocks)
    for command in ("inspect", "plan", "apply", "verify", "revert", "--in-place", "hub serve",
                    "publish --base", "pull"):
        assert f" {command} " in commands or f" {command}\n" in commands, command


#: The self-hosted hub's ports in the README; the test serves each on a free one instead.
README_HUB_PORTS = ("8080", "8081")


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_readme_runs_as_written(kimi_dir, tmp_path):
    text = (REPO / "README.md").read_text()
    root = tmp_path / "clone"
    shutil.copytree(REPO / "examples", root / "examples",
                    ignore=shutil.ignore_patterns("out", "__pycache__"))
    shutil.copytree(kimi_dir, root / "examples" / "out" / "kimi-k25-nvfp4")
    _fake_venv(root)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]),
        "HF_HOME": str(tmp_path / "hf-home"), "MODELPATCH_CACHE_DIR": str(tmp_path / "dc")}
    for var in ("HF_TOKEN", "HF_ENDPOINT", "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        env.pop(var, None)
    steps = first_command_modelpatch_steps(text)
    assert steps, "the first command no longer applies a recipe"
    # a block that starts a server in the background: stopped whatever happens
    script = ["set -euo pipefail", "trap 'kill $(jobs -p) 2> /dev/null || true' EXIT", *steps]
    ports = {port: str(_free_port()) for port in README_HUB_PORTS}
    for n, (lang, body) in enumerate(runnable_blocks(text)):
        if lang == "python":
            (root / f"block{n}.py").write_text(body)
            script.append(f".venv/bin/python block{n}.py")
        else:
            for port, free in ports.items():
                body = body.replace(port, free)
            script.append(body)
    result = subprocess.run(["bash", "-c", "\n".join(script)], cwd=root, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    assert "not on PATH" not in result.stderr and "command not found" not in result.stderr
    assert "OK " in result.stdout                         # verify's verdict
    assert (root / "examples/out/kimi-k25-nvfp4-sm120-fp16-kv").is_dir()
    assert not (root / "examples/out/kimi-in-place/.modelpatch").exists()   # reverted
    # the self-hosted hub: from an empty hub to a verified pull of a variant of its base
    assert (root / "examples/out/kimi-sm120-pulled/modelpatch.provenance.json").is_file()
    assert (root / "examples/out/hub/tokens.json").is_file()
    # one .gguf file as MODEL, the variant in a Hugging Face cache, a signed pull
    assert (root / "examples/out/tiny-qwen2-gguf-context/tiny-qwen2.gguf").is_file()
    assert list((root / "examples/out/hf-cache").glob("models--nvidia--Kimi-K2.5-NVFP4/refs/"
                                                        "sm120-fp16-kv"))
    assert (root / "examples/out/kimi-sm120-signed/model.sig").is_file()


@pytest.mark.parametrize("needle", ["pip install 'modelpatch[hub]'", "modelpatch[hub]'"])
def test_no_install_from_an_index_that_has_no_modelpatch(needle):
    """The package is not on an index: the README and the runtime hint say ``-e '.[hub]'``."""
    texts = [(REPO / "README.md").read_text()]
    texts += [p.read_text() for p in (REPO / "patcher").rglob("*.py")]
    assert not any(needle in t for t in texts)


def test_the_readme_recipe_example_loads(tmp_path):
    """"Writing a recipe" opens with a recipe that shows every section: a reader who copies it
    (with the file it reads next to it) gets a recipe the loader accepts, not an error."""
    from patcher.recipe.load import load_recipe

    text = (REPO / "README.md").read_text()
    section = text[text.index("## Writing a recipe"):]
    example = re.search(r"^```yaml\n(.*?)^```$", section, re.M | re.S).group(1)
    (tmp_path / "chat_template.jinja").write_text("{{ messages }}")
    (tmp_path / "recipe.yaml").write_text(example)
    recipe = load_recipe(tmp_path / "recipe.yaml")
    assert recipe.name == "my-fix" and recipe.tensors and recipe.files and recipe.config


def test_every_block_is_of_a_kind_this_test_checks():
    """The first block installs (``bash``); every other block runs, is the one block of
    placeholders, is output or is a recipe: no command is shown that nothing runs or parses."""
    kinds = [info for info, _ in ANY_BLOCK.findall((REPO / "README.md").read_text())]
    assert kinds[0] == "bash"
    assert set(kinds[1:]) <= KINDS, sorted(set(kinds[1:]) - KINDS)
    assert kinds.count("bash placeholders") == 1


def test_the_placeholder_commands_parse():
    """Each ``modelpatch`` line of the placeholder block is a command line modelpatch accepts."""
    import shlex

    from patcher.cli import main

    text = (REPO / "README.md").read_text()
    block = next(body for info, body in ANY_BLOCK.findall(text) if info == "bash placeholders")
    lines = [shlex.split(line, comments=True) for line in block.splitlines()]
    lines = [words[words.index("modelpatch") + 1:] for words in lines if "modelpatch" in words]
    assert len(lines) >= 8
    for words in lines:
        command = main.commands[words[0]]
        command.make_context(words[0], words[1:])       # a usage error raises


def test_the_doctor_sample_is_what_doctor_prints(kimi_dir):
    """The ``text`` block's lines are lines doctor prints for the example, whose path stands
    where the sample names the hub's model."""
    text = (REPO / "README.md").read_text()
    samples = [body for info, body in ANY_BLOCK.findall(text) if info == "text"]
    assert samples
    for sample in samples:
        command, *lines = sample.splitlines()
        words = command.split()
        assert words[:3] == ["$", "modelpatch", "doctor"], command
        hub_name = words[3]
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        result = subprocess.run([sys.executable, "-m", "patcher.cli", "doctor", str(kimi_dir),
                                 *words[4:]], env=env, capture_output=True, text=True,
                                timeout=120)
        printed = result.stdout.replace(str(kimi_dir), hub_name).splitlines()
        assert result.returncode == 1, result.stderr          # the blocker
        for line in lines:
            assert line in printed, line


def test_every_readme_recipe_loads(tmp_path):
    """Each ``yaml`` block loads as a recipe; a fragment gets the header it leaves out, and the
    files it reads are placed beside it."""
    from patcher.recipe.load import load_recipe

    blocks = [body for info, body in ANY_BLOCK.findall((REPO / "README.md").read_text())
              if info == "yaml"]
    assert len(blocks) >= 3
    for name in ("chat_template.jinja", "template.jinja"):
        (tmp_path / name).write_text("{{ messages }}")
    (tmp_path / "extra.yaml").write_text(         # what the include example reads
        "modelpatch: 1\nname: extra\ndescription: An include.\n"
        "params:\n  k: {type: number, default: 1, description: k}\n"
        "config:\n  config.json:\n    - {set: /k, value: \"{k}\"}\n")
    for n, body in enumerate(blocks):
        if not re.search(r"^modelpatch: 1$", body, re.M):
            body = f"modelpatch: 1\nname: readme-{n}\ndescription: A README example.\n{body}"
        (tmp_path / f"recipe{n}.yaml").write_text(body)
        load_recipe(tmp_path / f"recipe{n}.yaml")
