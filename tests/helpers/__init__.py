"""Case builders and harnesses the tests share (no tests here)."""
