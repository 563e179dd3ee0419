"""tools/fuzz.py: a short run of one op passes, and planted faults (a wrong output element, a crash, a hang) each fail
the run with a reproducer, which re-runs the failing case in-process."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FUZZ = ROOT / "tools" / "fuzz.py"
TIER = "generic"  # every machine has it

# A stand-in for tools/fuzz.py whose ops are broken on purpose. Spawned workers run this file's top level again, so
# they get the broken ops too.
PLANTED_FAULTS = """
import os, sys, time
sys.path.insert(0, {tools!r})
import torch
import dsv4
import fuzz

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
    return subprocess.run([sys.executable, str(script), *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_short_run_passes():
    result = run(FUZZ, "--op", "map_local_to_global_slots", "--tier", TIER, "--seconds", "5", "--workers", "1")
    assert result.returncode == 0, result.stdout + result.stderr
    summary = re.search(r"^map_local_to_global_slots\s+(\d+)\s*$", result.stdout, re.MULTILINE)
    assert summary and int(summary.group(1)) > 0, result.stdout


def test_planted_faults_fail_with_reproducers(tmp_path):
    script = tmp_path / "fuzz_with_faults.py"
    script.write_text(PLANTED_FAULTS.format(tools=str(FUZZ.parent)))
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
