"""Build, tier selection and package-level contracts."""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import dsv4
from conftest import SUPPORTED_ISAS

ROOT = Path(__file__).resolve().parents[1]


def run_python(code: str, **env) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=120)


def test_version_and_build_info():
    info = dsv4.build_info()
    assert info["version"] == dsv4.__version__
    assert info["torch"] == torch.__version__
    assert info["selected_cpu_isa"] in info["supported_cpu_isas"]
    assert set(info["compiled_cpu_isas"]) == {"amx", "avx512", "avx512dot", "avx2", "generic"}
    assert info["num_threads"] == torch.get_num_threads()
    assert info["cuda_kernels"] is dsv4.cuda_available()
    assert all(hasattr(torch.ops.dsv4, op) for op in info["reference_backed_cpu_ops"])


def test_auto_selects_best_supported_tier():
    result = run_python("import dsv4; print(dsv4.cpu_isa())", DSV4_CPU_ISA="auto")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == SUPPORTED_ISAS[0]


@pytest.mark.parametrize("isa", dsv4.CPU_ISAS)
def test_env_forces_tier(isa):
    result = run_python("import dsv4; print(dsv4.cpu_isa())", DSV4_CPU_ISA=isa)
    if isa in SUPPORTED_ISAS:
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == isa
    else:
        assert "does not support it" in result.stderr


@pytest.mark.parametrize("isa", ["sse9", *[i for i in dsv4.CPU_ISAS if i not in SUPPORTED_ISAS]])
def test_env_tier_this_cpu_cannot_run_fails_at_import(isa):
    result = run_python("import dsv4", DSV4_CPU_ISA=isa)
    assert result.returncode != 0
    assert f"ImportError: DSV4_CPU_ISA='{isa}': dsv4: " in result.stderr
    assert "supported: " in result.stderr or "unknown CPU ISA" in result.stderr


def test_unknown_tier_is_a_clear_error():
    with pytest.raises(RuntimeError, match="unknown CPU ISA 'sse9'"):
        torch.ops.dsv4._set_cpu_isa("sse9")
    assert dsv4.cpu_isa() in SUPPORTED_ISAS


def test_unsupported_tier_is_a_clear_error():
    missing = [isa for isa in dsv4.CPU_ISAS if isa not in SUPPORTED_ISAS]
    if not missing:
        pytest.skip("this CPU supports every tier")
    with pytest.raises(RuntimeError, match="does not support it"):
        torch.ops.dsv4._set_cpu_isa(missing[0])


def test_cli_info_and_demo():
    info = subprocess.run([sys.executable, "-m", "dsv4", "info", "--json"], capture_output=True, text=True)
    assert info.returncode == 0, info.stderr
    assert '"selected_cpu_isa"' in info.stdout
    demo = subprocess.run([sys.executable, "-m", "dsv4", "demo", "--preset", "tiny", "--prompts", "200,40",
                           "--decode-steps", "2", "--layers", "3", "--step-tokens", "256"],
                          capture_output=True, text=True)
    assert demo.returncode == 0, demo.stderr
    assert "check passed" in demo.stdout


def test_native_sources_follow_the_build_rules():
    cmake_code = [line.split("#")[0] for line in (ROOT / "CMakeLists.txt").read_text().splitlines()]
    assert not any("-march=native" in line for line in cmake_code)
    for source in (ROOT / "csrc").rglob("*"):
        if source.is_file():
            text = source.read_text()
            assert "PYBIND11_MODULE" not in text and "pybind11::module" not in text, source


def test_extension_is_abi3():
    assert Path(dsv4._C.__file__).name == "_C.abi3.so"
