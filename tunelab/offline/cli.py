"""``python -m tunelab.offline ...``: the minimal command line for hosts without the tunelab CLI's dependencies
and for build scripts (``gpu/host_setup.sh``, ``docs/gpu_hosts.md``).
"""

from __future__ import annotations

import sys
from pathlib import Path


from tunelab.offline.manifest import (
    BundleManifest,
    DEFAULT_PART_SIZE_MIB,
    MIB,
    OfflineBundleError,
)
from tunelab.offline.pack import (
    bundle_orchestrator,
    bundle_runtime,
)
from tunelab.offline.install import (
    install_bundle,
)
from tunelab.offline.parts import (
    bundle_dir_of,
    resplit_bundle,
)


def main(argv: list[str] | None = None) -> int:
    """Minimal command line for hosts without the tunelab CLI's dependencies and for build scripts::

        python -m tunelab.offline install MANIFEST_OR_DIR DEST [--parts-dir DIR ...] [--python PY]
        python -m tunelab.offline bundle-runtime vllm==0.25.1 OUT_DIR [--no-fastokens] [--wheel-dir DIR]
        python -m tunelab.offline bundle-orchestrator OUT_DIR [--python-version 3.12]
        python -m tunelab.offline resplit BUNDLE_DIR [--part-size-mib N]   # new part size, no rebuild

    Prints the runtime record path or the manifest summary; returns a process exit code.
    """
    import argparse

    ap = argparse.ArgumentParser(prog="python -m tunelab.offline")
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("install")
    a.add_argument("manifest")
    a.add_argument("dest")
    a.add_argument("--parts-dir", action="append", default=None)
    a.add_argument("--python", default=sys.executable)
    b = sub.add_parser("bundle-runtime")
    b.add_argument("vllm_spec")
    b.add_argument("out_dir")
    b.add_argument("--python-version", default="3.12")
    b.add_argument("--no-fastokens", action="store_true")
    b.add_argument("--wheel-dir", default=None)
    b.add_argument("--part-size-mib", type=int, default=DEFAULT_PART_SIZE_MIB)
    c = sub.add_parser("bundle-orchestrator")
    c.add_argument("out_dir")
    c.add_argument("--python-version", default="3.12")
    c.add_argument("--wheel-dir", default=None)
    c.add_argument("--part-size-mib", type=int, default=DEFAULT_PART_SIZE_MIB)
    r = sub.add_parser("resplit", help="re-split a built bundle folder into parts of another size (no rebuild)")
    r.add_argument("bundle_dir")
    r.add_argument("--part-size-mib", type=int, default=DEFAULT_PART_SIZE_MIB)
    ns = ap.parse_args(argv)
    try:
        if ns.cmd == "resplit":
            bundle = bundle_dir_of(Path(ns.bundle_dir))  # a path to manifest.json means its folder, as in resplit_bundle
            try:  # the old parts, for the summary only: resplit_bundle checks the folder and reports what is wrong
                old_parts: list | None = BundleManifest.load(bundle / "manifest.json").parts
            except OfflineBundleError:
                old_parts = None
            m = resplit_bundle(bundle, ns.part_size_mib)
            was = (f"{len(old_parts)} parts of at most {max((p.size_bytes for p in old_parts), default=0) / MIB:.2f} MiB"
                   if old_parts is not None else "parts")
            print(f"{m.name}: {was} -> {len(m.parts)} parts of at most {ns.part_size_mib} MiB "
                  f"(largest {max((p.size_bytes for p in m.parts), default=0) / MIB:.2f} MiB); archive "
                  f"{m.archive_name} {m.archive_bytes / MIB:.2f} MiB, sha256 {m.archive_sha256} unchanged; "
                  f"manifest rewritten: {bundle / 'manifest.json'}")
            return 0
        if ns.cmd == "install":
            rec = install_bundle(Path(ns.manifest), Path(ns.dest), [Path(d) for d in ns.parts_dir or []] or None,
                                 python=ns.python)
            print(rec)
            print(rec.read_text())
            return 0
        if ns.cmd == "bundle-runtime":
            m = bundle_runtime(ns.vllm_spec, Path(ns.out_dir), python_version=ns.python_version,
                               extra=[] if ns.no_fastokens else ["fastokens"], part_size_mib=ns.part_size_mib,
                               wheel_dir=Path(ns.wheel_dir) if ns.wheel_dir else None)
        else:
            m = bundle_orchestrator(Path(ns.out_dir), python_version=ns.python_version, part_size_mib=ns.part_size_mib,
                                    wheel_dir=Path(ns.wheel_dir) if ns.wheel_dir else None)
    except (OfflineBundleError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(f"{m.name}: {len(m.wheels)} wheels, {m.unpacked_bytes / MIB:.1f} MiB unpacked -> "
          f"{m.archive_bytes / MIB:.2f} MiB xz in {len(m.parts)} parts: "
          + ", ".join(f"{p.name} {p.size_bytes / MIB:.2f} MiB" for p in m.parts))
    return 0
