"""The vLLM plugin's switches, without vLLM's engine: mode parsing, the tested range, doing nothing when off."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys

import pytest

from dsv4.integrations import vllm as plugin


@pytest.mark.parametrize(("value", "mode"), [("", "kernels"), ("off", "off"), ("Metadata", "metadata"),
                                             (" full ", "full"), ("kernels", "kernels")])
def test_mode_from_env(monkeypatch, value, mode):
    monkeypatch.setenv(plugin.ENV_VAR, value)
    assert plugin.mode_from_env().value == mode


def test_mode_unset_is_kernels(monkeypatch):
    monkeypatch.delenv(plugin.ENV_VAR, raising=False)
    assert plugin.mode_from_env() is plugin.Mode.KERNELS


def test_bad_mode_names_the_choices(monkeypatch):
    monkeypatch.setenv(plugin.ENV_VAR, "everything")
    with pytest.raises(ValueError, match="DSV4_VLLM='everything': expected one of off, metadata, kernels, full"):
        plugin.mode_from_env()


@pytest.mark.parametrize(("version", "ok"), [("0.32.0", True), ("0.32.5.dev3+gabc", True), ("0.31.9", False),
                                             ("0.33.0", False), ("1.0.0", False), ("dev", False)])
def test_tested_range(version, ok):
    assert plugin.tested(version) is ok


def test_entry_point_names_register():
    """The installed distribution's vllm.general_plugins entry point is this module's register()."""
    points = importlib.metadata.entry_points(group="vllm.general_plugins")
    dsv4_points = [p for p in points if p.name == "dsv4"]
    if not dsv4_points:
        pytest.skip("dsv4 is installed without its entry points (an in-tree run)")
    assert dsv4_points[0].value == "dsv4.integrations.vllm:register"


def test_off_touches_nothing():
    """DSV4_VLLM=off: register() returns before importing vLLM or installing anything, and stays idempotent."""
    code = ("import os, sys; os.environ['DSV4_VLLM'] = 'off'\n"
            "from dsv4.integrations import vllm as p\n"
            "p.register(); p.register()\n"
            "print(p.taken_over(), 'vllm' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["[]", "False"]
