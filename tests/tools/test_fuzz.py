"""tools/check/fuzz.py: a short run of one op passes, and planted faults (a wrong output element, a crash, a hang)
each fail the run with a reproducer, which re-runs the failing case in-process."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from tools.check import fuzz

FUZZ = Path(fuzz.__file__)  # run as a script, as make fuzz does
ROOT = FUZZ.parents[2]
TIER = "generic"  # every machine has it

# A stand-in for tools/check/fuzz.py whose ops are broken on purpose, importing it as tools.check.fuzz (the repository
# root is on its PYTHONPATH). Spawned workers run this file's top level again, so they get the broken ops too.
PLANTED_FAULTS = """
import os, sys, time
import torch
import dsv4
from tools.check import fuzz

real_map = torch.ops.dsv4.map_local_to_global_slots


def off_by_one(*args):
    out = real_map(*args)
    out.view(-1)[:1] += 1
    return out


torch.ops.dsv4.map_local_to_global_slots = off_by_one
torch.ops.dsv4.inverse_rope = lambda *args: os.abort()
torch.ops.dsv4.indexer_k_quant_insert = lambda *args: time.sleep(3600)

if __name__ == "__main__":
    sys.exit(fuzz.main(sys.argv[1:]))
"""


def run(script: Path, *args: str) -> subprocess.CompletedProcess:
    pythonpath = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, str(script), *args], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": pythonpath})


def test_short_run_passes():
    result = run(FUZZ, "--op", "map_local_to_global_slots", "--tier", TIER, "--seconds", "5", "--workers", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = re.search(r"^map_local_to_global_slots\s+(\d+)\s*$", result.stdout, re.MULTILINE)
    assert summary and int(summary.group(1)) > 0, result.stdout


def test_planted_faults_fail_with_reproducers(tmp_path):
    script = tmp_path / "fuzz_with_faults.py"
    script.write_text(PLANTED_FAULTS)
    ops = "map_local_to_global_slots,inverse_rope,indexer_k_quant_insert"
    result = run(script, "--op", ops, "--tier", TIER, "--seconds", "6", "--case-timeout", "1")
    out = result.stdout
    assert result.returncode != 0, out
    for op, symptom in [("map_local_to_global_slots", "elements differ"), ("inverse_rope", "crash: .*SIGABRT"),
                        ("indexer_k_quant_insert", "hang: no answer after 1 s")]:
        assert re.search(rf"^FAIL {op} on {TIER}, seed \d+, \d+ threads: .*{symptom}", out, re.MULTILINE), out
        assert re.search(rf"^  reproduce: \S+ \S*fuzz.py --op {op} --tier {TIER} --seed \d+$", out, re.MULTILINE)
    seed = re.search(rf"--op map_local_to_global_slots --tier {TIER} --seed (\d+)", out).group(1)
    again = run(script, "--op", "map_local_to_global_slots", "--tier", TIER, "--seed", seed)
    assert again.returncode == 1, again.stdout
    assert "elements differ" in again.stdout and "local_indices:" in again.stdout, again.stdout


def test_fuzzer_knows_every_tier():
    import dsv4

    assert fuzz.ALL_TIERS == dsv4.CPU_ISAS
