"""The GPU A/B log table (tools/perf/gpu_ab_time.py) reads every build's rounds, compares medians with the first
build's and says where the outputs are not the same bits."""

from tools.perf import gpu_ab_time

LOG = """base r1 pf64 819.6 us hash a2921dbcb1a5
base r1 B128 39.8 us hash 3a9e6acf3476
knock r1 pf64 763.7 us hash c66200bcb1a5
knock r1 B128 40.0 us hash 3a9e6acf3476
=== knock round 1: exit 124
some warning line
base r2 pf64 819.4 us hash a2921dbcb1a5
base r2 B128 39.6 us hash 3a9e6acf3476
knock r2 pf64 763.5 us hash c66200bcb1a5
"""


def test_rounds_and_hashes_per_case_and_build():
    times, hashes = gpu_ab_time.parse(LOG.splitlines())
    assert times[("pf64", "base")] == [819.6, 819.4]
    assert times[("pf64", "knock")] == [763.7, 763.5]
    assert times[("B128", "knock")] == [40.0]
    assert hashes[("B128", "knock")] == {"3a9e6acf3476"}
    assert ("B128", "other") not in times


def test_table_ratios_against_the_first_build_and_other_bits():
    table = gpu_ab_time.table(*gpu_ab_time.parse(LOG.splitlines()))
    lines = table.splitlines()
    assert lines[0].split() == ["case", "base", "knock"]
    pf64 = next(line for line in lines if line.startswith("pf64"))
    assert "819.6 / 819.4" in pf64 and "763.7 / 763.5 (0.932x, other bits)" in pf64
    b128 = next(line for line in lines if line.startswith("B128"))
    assert "40.0 (1.008x)" in b128 and "other bits" not in b128


def test_every_default_case_is_defined():
    assert set(gpu_ab_time.DEFAULT_CASES) <= set(gpu_ab_time.CASES)
    assert gpu_ab_time.main(["nothing"]) == 2


def test_run_takes_a_known_case_only(capsys):
    """`run` (the profiler's entry) refuses an unknown case or a missing one with the usage, before any import."""
    assert gpu_ab_time.main(["run", "build/python", "no_such_case"]) == 2
    assert gpu_ab_time.main(["run", "build/python"]) == 2
    assert "run PYTHON_DIR CASE" in capsys.readouterr().err


def test_time_refuses_an_unknown_case_before_timing_any(capsys):
    """`time` checks every label first: a typo among them must not cost the device time of the cases before it."""
    assert gpu_ab_time.main(["time", "build/python", "base", "1", "B1", "B64"]) == 2
    err = capsys.readouterr().err
    assert "unknown case(s) B64" in err and "B128" in err
