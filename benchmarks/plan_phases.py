"""CPU seconds (``time.process_time``) of each phase of one ``modelpatch`` command, in its own
process: imports, recipe loading, header reading and checks, the shard index, the header
cache's write, planning. Where ``bench_metadata_scale.py``'s cold ``plan`` goes beyond its floor.

    PYTHONPATH=. MODELPATCH_CACHE_DIR=/tmp/empty python benchmarks/plan_phases.py \\
        plan sm120-fp16-kv MODEL > /dev/null

The phases go to stderr. Run with bytecode caching on (unset PYTHONDONTWRITEBYTECODE), as an
installed modelpatch has it.
"""

from __future__ import annotations

import atexit
import importlib
import sys
import time

START = time.process_time()
spent: dict[str, float] = {}


def timed(module: str, attr: str) -> None:
    owner = importlib.import_module(module)
    *path, name = attr.split(".")
    for part in path:
        owner = getattr(owner, part)
    function = getattr(owner, name, None)
    if function is None:            # an older tree, without this phase
        return

    def wrapper(*args, **kwargs):
        t = time.process_time()
        try:
            return function(*args, **kwargs)
        finally:
            spent[attr] = spent.get(attr, 0.0) + time.process_time() - t

    setattr(owner, name, wrapper)


from patcher.cli.commands import main  # noqa: E402

CLI = time.process_time()
import patcher.api  # noqa: E402,F401
import patcher.execute.engine  # noqa: E402,F401
import patcher.plan  # noqa: E402,F401
import patcher.recipe.load  # noqa: E402,F401

IMPORTS = time.process_time()
for module, attr in [("patcher.recipe.load", "load_recipes"),
                     ("patcher.model.model_dir", "ModelDir.open"),
                     ("patcher.model.model_dir", "_read_headers"),
                     ("patcher.model.model_dir", "_CachedReader.shards"),
                     ("patcher.model.model_dir", "_CachedReader.index"),
                     ("patcher.model.model_dir", "index_from_headers"),
                     ("patcher.model.model_dir", "ModelDir._check_index"),
                     ("patcher.model.model_dir", "_CachedReader.save"),
                     ("patcher.plan", "plan")]:
    timed(module, attr)


@atexit.register
def report() -> None:
    phases = {"imports (cli)": CLI - START, "imports (plan)": IMPORTS - CLI, **spent}
    print(f"total {time.process_time() - START:.3f} CPU s after interpreter start; "
          + ", ".join(f"{k} {v:.3f}" for k, v in phases.items()), file=sys.stderr)


sys.argv = ["modelpatch", *sys.argv[1:]]
main()
