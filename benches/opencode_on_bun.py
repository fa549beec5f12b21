#!/usr/bin/env python3
"""Runs the pinned OpenCode on another Bun, for `cargo bench --bench agents` (docs/BENCHMARKS.md,
"On a Bun without the collection nudge").

OpenCode ships as a Bun executable: its JavaScript sits in the executable's embedded module
graph, run by the Bun it was built with (1.3.14 for OpenCode 1.18.33). To tell what that Bun
costs from what OpenCode itself costs, this writes the graph's files to OUT/root, points their
`/$bunfs/root/` imports there, and writes OUT/opencode, which runs them on BUN with the options
the executable was built with. For example:

    python3 benches/opencode_on_bun.py .tools/bun/node_modules/bun/bin/bun.exe OUT
    TASKBRIDGE_TEST_OPENCODE=OUT/opencode cargo bench --bench agents -- floor

(`.ci/run` installs Bun 1.4.5 there.)

A diagnostic, not a way to run TaskBridge: nothing in TaskBridge uses it.

usage: benches/opencode_on_bun.py BUN OUT [OPENCODE_EXE]
"""
import os
import shlex
import struct
import sys

TRAILER = b"\n---- Bun! ----\n"
# Bun 1.3's standalone graph: before the trailer, the graph's byte count (u64), where its module
# list is (offset, length), the entry module's index, where the build's exec options are, flags.
OFFSETS = struct.Struct("<QIIIIII")
# A module: 6 (offset, length) pairs (name, contents, source map, bytecode, two more), 4 bytes.
MODULE = struct.Struct("<12I4B")
ROOT = "/$bunfs/root/"


def main(argv):
    if len(argv) not in (3, 4):
        sys.exit(__doc__.strip().splitlines()[-1])
    bun, out = os.path.abspath(argv[1]), os.path.abspath(argv[2])
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    exe = argv[3] if len(argv) == 4 else os.path.join(
        here, ".tools/node_modules/opencode-ai/bin/opencode.exe"
    )
    if not os.access(bun, os.X_OK):
        sys.exit(
            f"{bun}: not an executable Bun "
            "(npm i --prefix DIR bun@VERSION puts one in DIR/node_modules/bun/bin/bun.exe)"
        )
    try:
        data = open(exe, "rb").read()
    except OSError as e:
        sys.exit(f"{exe}: {e.strerror} (run .ci/run once, or give the OpenCode executable)")
    end = data.rfind(TRAILER)
    if end < OFFSETS.size:
        sys.exit(f"{exe}: not a Bun executable (no module graph)")
    count, list_at, list_len, entry, argv_at, argv_len, _ = OFFSETS.unpack(
        data[end - OFFSETS.size : end]
    )
    base = end - OFFSETS.size - count
    if list_len % MODULE.size:
        sys.exit(f"{exe}: its module graph is not the layout of Bun 1.3 that this reads")

    def text(at, length):
        return data[base + at : base + at + length]

    modules = []
    for k in range(list_len // MODULE.size):
        at = base + list_at + k * MODULE.size
        f = MODULE.unpack(data[at : at + MODULE.size])
        name = text(f[0], f[1]).decode()
        if not name.startswith(ROOT):
            sys.exit(f"{exe}: module {name!r} is outside {ROOT}; not the layout this reads")
        modules.append((name[len(ROOT) :], text(f[2], f[3])))
    root = os.path.join(out, "root")
    for name, contents in modules:
        path = os.path.join(root, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if name.endswith(".js"):
            contents = contents.replace(ROOT.encode(), (root + "/").encode())
        with open(path, "wb") as f:
            f.write(contents)
    options = text(argv_at, argv_len).decode().split()
    options = [o for o in options if o != "--"]
    launcher = os.path.join(out, "opencode")
    with open(launcher, "w") as f:
        f.write("#!/bin/sh\n")
        words = [bun, *options, os.path.join(root, modules[entry][0])]
        f.write(f"exec {' '.join(map(shlex.quote, words))} \"$@\"\n")
    os.chmod(launcher, 0o755)
    print(f"{len(modules)} modules in {root}; run {launcher}")


if __name__ == "__main__":
    main(sys.argv)
