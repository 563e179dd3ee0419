"""The decode A/B log table (tools/perf/decode_ab_table.py) reads every tree's rounds and marks what a tree lacks."""

from tools.perf import decode_ab_table

LOG = """=== base round 1
B=128 H=64 128+512 parts=132 pieces=128
  portable       352.2 us      2752 ns/token     7.6 TFLOP/s   0.15 TB/s  max|dout|/(1+|out|) 0  max|dlse| 0
  sm90            41.8 us       327 ns/token    61.8 TFLOP/s   1.21 TB/s  max|dout|/(1+|out|) 0.02  max|dlse| 0.003
B=1 H=64 128+512 parts=132 pieces=10
  sm90            23.2 us     23200 ns/token     1.7 TFLOP/s   0.01 TB/s  max|dout|/(1+|out|) 0  max|dlse| 0
=== variant round 1
B=128 H=64 128+512 parts=132 pieces=128
  sm90            41.4 us       323 ns/token    61.8 TFLOP/s   1.21 TB/s  max|dout|/(1+|out|) 0.02  max|dlse| 0.003
=== variant round 1: exit 124
=== base round 2
B=128 H=64 128+512 parts=132 pieces=128
  sm90            41.7 us       326 ns/token    61.8 TFLOP/s   1.21 TB/s  max|dout|/(1+|out|) 0.02  max|dlse| 0.003
"""


def test_rounds_per_case_and_tree():
    times = decode_ab_table.parse(LOG.splitlines())
    assert times[("B=128 H=64 128+512", "base")] == [41.8, 41.7]
    assert times[("B=128 H=64 128+512", "variant")] == [41.4]
    assert times[("B=1 H=64 128+512", "base")] == [23.2]
    assert ("B=1 H=64 128+512", "variant") not in times  # the timed-out run left no row


def test_table_columns():
    lines = decode_ab_table.table(decode_ab_table.parse(LOG.splitlines())).splitlines()
    assert lines[0].split() == ["case", "base", "variant"]
    assert "41.8 / 41.7" in lines[1] and lines[1].rstrip().endswith("41.4")
    assert lines[2].rstrip().endswith("-")
