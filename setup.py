"""Builds dsv4's native modules with CMake + Ninja (metadata lives in pyproject.toml).

`pip install --no-build-isolation .` (or `-e .`) builds `dsv4._C` for the torch already installed, and
`dsv4._C_cuda` too when that torch is a CUDA build and nvcc is found (DSV4_ENABLE_CUDA=0 / 1 forces it off / on).
DSV4_CUDA_ARCHS (default "80;90") lists the portable tier's targets; DSV4_CUDA_SM90=0 drops the Hopper tier.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def cuda_requested() -> bool:
    """DSV4_ENABLE_CUDA if set, else whether the installed torch is a CUDA (ROCm) build and nvcc (hipcc) is on
    the path."""
    forced = os.environ.get("DSV4_ENABLE_CUDA", "")  # empty: decide from torch and the compilers
    if forced:
        return forced not in ("0", "OFF", "off")
    try:
        import torch
    except ImportError:
        return False
    if torch.version.hip is not None:
        return shutil.which("hipcc") is not None
    return torch.version.cuda is not None and shutil.which("nvcc") is not None


def rocm_torch() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.version.hip is not None


class CMakeExtension(Extension):
    def __init__(self, name: str):
        super().__init__(name, sources=[], py_limited_api=True)


class CMakeBuild(build_ext):
    def build_extension(self, ext: Extension) -> None:
        out_dir = Path(self.get_ext_fullpath(ext.name)).resolve().parent
        build_dir = Path(self.build_temp).resolve() / "cmake"
        build_dir.mkdir(parents=True, exist_ok=True)
        cmake = shutil.which("cmake") or "cmake"
        generator = ["-G", "Ninja"] if shutil.which("ninja") else []
        cuda = cuda_requested()
        configure = [
            cmake, str(ROOT), *generator,
            f"-DDSV4_PYTHON={sys.executable}",
            f"-DDSV4_OUTPUT_DIR={out_dir}",
            f"-DDSV4_ENABLE_CUDA={'ON' if cuda else 'OFF'}",
            f"-DCMAKE_BUILD_TYPE={os.environ.get('DSV4_BUILD_TYPE', 'Release')}",
        ]
        if cuda and rocm_torch():
            configure += ["-DDSV4_ENABLE_ROCM=ON"]  # the portable tier, hipified at configure time
        elif cuda:
            configure += [
                f"-DDSV4_CUDA_ARCHS={os.environ.get('DSV4_CUDA_ARCHS', '80;90')}",
                f"-DDSV4_CUDA_SM90={'OFF' if os.environ.get('DSV4_CUDA_SM90') == '0' else 'ON'}",
            ]
        subprocess.check_call(configure, cwd=build_dir)
        jobs = os.environ.get("MAX_JOBS", str(os.cpu_count() or 2))
        subprocess.check_call([cmake, "--build", ".", "--parallel", jobs], cwd=build_dir)


setup(
    ext_modules=[CMakeExtension("dsv4._C")],
    cmdclass={"build_ext": CMakeBuild},
    options={"bdist_wheel": {"py_limited_api": "cp310"}},
)
