"""Hipifies the portable CUDA tier (and, with --bindings, the CUDA glue of _C_cuda) with torch.utils.hipify.

Usage: hipify_portable.py CSRC_DIR OUT_DIR [--bindings]. Copies the sources into OUT_DIR/csrc (the original tree
is never touched), hipifies them there and prints the hipified translation units, one per line: the portable
kernels (csrc/hip/portable/**/*.hip) and, with --bindings, the binding sources. Include them with -I OUT_DIR/csrc.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

# The portable tier and every header it includes; the CUDA runtime calls of these must all have HIP names.
PORTABLE_FILES = ("cuda/portable/**/*.cu", "cuda/portable/**/*.cuh", "cuda/launchers.h", "common/*.h")
# The _C_cuda glue: bindings (compiled per backend), the kernel table and the module entry point.
BINDING_FILES = ("api/*.cpp", "api/*.h", "cuda/kernel_table.cpp", "cuda/kernel_table.h", "cuda/module.cpp")


def load_hipify():
    try:
        from torch.utils.hipify import hipify_python
    except ImportError as exc:
        sys.exit(f"hipify_portable: this Python's torch has no torch.utils.hipify ({exc})")
    return hipify_python


def stage(csrc: Path, out_csrc: Path, patterns: tuple[str, ...]) -> list[Path]:
    """Copies the files matching patterns (relative to csrc) to the same places under out_csrc."""
    staged = []
    for pattern in patterns:
        for src in sorted(csrc.glob(pattern)):
            dst = out_csrc / src.relative_to(csrc)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, dst)
            staged.append(dst)
    return staged


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("csrc", type=Path, help="the repository's csrc folder")
    parser.add_argument("out", type=Path, help="where the hipified tree is written (its csrc/ is replaced)")
    parser.add_argument("--bindings", action="store_true", help="also hipify the _C_cuda bindings")
    args = parser.parse_args()
    hipify_python = load_hipify()
    csrc = args.csrc.resolve()
    out = args.out.resolve()
    out_csrc = out / "csrc"
    shutil.rmtree(out_csrc, ignore_errors=True)  # a source removed upstream must not linger here
    patterns = PORTABLE_FILES + (BINDING_FILES if args.bindings else ())
    staged = stage(csrc, out_csrc, patterns)
    if not any(p.suffix == ".cu" for p in staged):
        sys.exit(f"hipify_portable: no portable sources under {csrc}/cuda/portable")
    # hip_clang_launch keeps <<<...>>> launches (hip-clang compiles them); is_pytorch_extension renames out of
    # place: cuda/ -> hip/, .cu -> .hip, and a changed header x.h -> x_hip.h, with every include rewritten.
    results = hipify_python.hipify(
        project_directory=str(out),
        output_directory=str(out),
        includes=[str(p) for p in staged],
        header_include_dirs=["csrc"],
        is_pytorch_extension=True,
        hip_clang_launch=True,
        show_progress=False,
    )
    units = []
    for path in staged:
        if path.suffix not in (".cu", ".cpp"):
            continue
        hipified = results[str(path)].hipified_path
        units.append(Path(hipified) if hipified else path)
    print("\n".join(str(u) for u in units))
    return 0


if __name__ == "__main__":
    sys.exit(main())
