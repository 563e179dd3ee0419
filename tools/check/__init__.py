"""Checks that make and CI run, no GPU needed: compile checks, the sanitizer run, the fuzzer, the peer fetch."""
