#!/usr/bin/env python
"""Where the threads of one in-process ``modelpatch`` command spend their time: a sampling
profiler for the threaded shard writer, Python frames only.

Every ``--interval`` seconds a sampling thread reads every thread's current frame and counts its
innermost frame from ``patcher/`` (or the innermost one when none is ours), per role: ``main``,
``shard`` (the thread computing a shard), ``read`` and ``write`` (the pipeline's stages). A
thread inside a C call that released the GIL (a torch kernel, hashlib, a read or write) shows
the line that called it, so waiting and working lines both show up. Prints JSON: the wall time
and per role the most frequent lines with their share of that role's samples.

Usage: python benchmarks/sample_stacks.py [--interval 0.005] [--switch S] -- apply RECIPE ...
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import threading
import time


def _role(name: str) -> str:
    if name == "MainThread":
        return "main"
    for prefix, role in (("shard-read", "read"), ("shard-write", "write"), ("shard", "shard")):
        if name.startswith(prefix):
            return role
    return "other"


def _where(frame) -> str:
    leaf = frame
    while frame is not None:
        if "/patcher/" in frame.f_code.co_filename:
            path = frame.f_code.co_filename.split("/patcher/")[-1]
            return f"{path}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return f"{leaf.f_code.co_filename.split('/')[-1]}:{leaf.f_lineno} {leaf.f_code.co_name}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--interval", type=float, default=0.005)
    p.add_argument("--switch", type=float, help="sys.setswitchinterval for the command")
    p.add_argument("--top", type=int, default=8)
    p.add_argument("argv", nargs=argparse.REMAINDER)
    args = p.parse_args()
    if args.switch:
        sys.setswitchinterval(args.switch)
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    done = threading.Event()

    def sample() -> None:
        me = threading.get_ident()
        while not done.wait(args.interval):
            names = {t.ident: t.name for t in threading.enumerate()}
            for ident, frame in sys._current_frames().items():
                if ident != me:
                    counts[_role(names.get(ident, ""))][_where(frame)] += 1

    sampler = threading.Thread(target=sample, daemon=True)
    from patcher.cli import main as cli

    start = time.perf_counter()
    sampler.start()
    sys.argv = ["modelpatch"] + [a for a in args.argv if a != "--"]
    try:
        cli()
    except SystemExit:
        pass
    wall = time.perf_counter() - start
    done.set()
    sampler.join()
    report = {"argv": sys.argv[1:], "wall_s": round(wall, 2), "switch": args.switch,
              "roles": {role: {"samples": sum(c.values()),
                               "top": [f"{v / sum(c.values()):.3f} {k}"
                                       for k, v in c.most_common(args.top)]}
                        for role, c in counts.items()}}
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
