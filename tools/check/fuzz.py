"""Seeded random-shape differential fuzzer of every ``torch.ops.dsv4`` CPU op against ``dsv4.reference``.

Every op runs on every CPU tier this machine has, for a bounded wall time (``--seconds``, default ``$FUZZ_SECONDS``
or 150, start-up included), shared fairly among the (op, tier) pairs: the pair with the least time spent runs the
next case, and no case starts that would end past the budget. Cases run in worker processes (at most 2) under a
watchdog: a case that crashes its worker or runs past ``--case-timeout`` fails like a mismatch, and the worker is
replaced. Case n of every (op, tier) pair has seed ``--seed + n``; a failure prints a reproducer that re-runs that one
case in-process and shows its inputs and every difference:

    python tools/check/fuzz.py                              # fuzz everything for $FUZZ_SECONDS (or 150) seconds
    python tools/check/fuzz.py --op topk_transform --tier avx2 --seconds 30
    python tools/check/fuzz.py --op topk_transform --tier avx2 --seed 123456   # one case, in-process, with details
    python tools/check/fuzz.py --list

The generators and checkers of the ops are in fuzz_cases.py beside this file. Exits non-zero on any failure.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import importlib
import multiprocessing
import multiprocessing.connection
import os
import resource
import signal
import sys
import time
import traceback
from dataclasses import dataclass

ALL_TIERS = ("amx", "avx512", "avx512dot", "avx2", "generic")  # dsv4.CPU_ISAS, without importing torch here
DEFAULT_SECONDS = 150.0
DEFAULT_SEED = 1
DEFAULT_CASE_TIMEOUT = 30.0  # seconds; cases are sized to take well under one
STARTUP_TIMEOUT = 120.0  # seconds for a worker to import torch and dsv4
FIRST_CASE_ESTIMATE = 0.5  # seconds a pair's case is assumed to take before one has run
MIN_FUZZ_SECONDS = 1.0  # fuzzing time after the first worker is ready, however long the start-up took
MAX_SHOWN_PER_PAIR = 3  # failures printed in full per (op, tier); the rest are counted


def cases_module():
    """fuzz_cases (torch, dsv4 and the per-op code): imported on first use, so workers start before it loads. It sits
    beside this file: a top-level module when this runs as a script, ``tools.check.fuzz_cases`` when this is imported
    as ``tools.check.fuzz``."""
    return importlib.import_module(f"{__package__}.fuzz_cases" if __package__ else "fuzz_cases")


def one_line(exc: BaseException) -> str:
    """The first line of a failure: a mismatch as it is, anything else (the op raising, say) with its type."""
    text = str(exc).strip().splitlines()
    first = text[0] if text else ""
    return first if type(exc).__name__ == "Mismatch" else f"{type(exc).__name__}: {first}"


# ---------------------------------------------------------------------------------------------
# Worker process
# ---------------------------------------------------------------------------------------------


def serve(conn) -> None:
    """Worker loop: runs the (op, tier, seed) cases the parent sends, answers (verdict, message, seconds)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides when to stop
    with contextlib.suppress(ValueError, OSError):
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # a crash is reported, not dumped
    faulthandler.enable()  # a crash prints the Python stack of the case
    cases = cases_module()
    conn.send(("ready", "", 0.0))
    while True:
        try:
            op, tier, seed = conn.recv()
        except EOFError:  # the parent is gone
            return
        start = time.monotonic()
        try:
            cases.run_case(op, tier, seed)
            verdict, message = "pass", ""
        except Exception as exc:  # a mismatch, or the op rejecting a valid input
            verdict, message = "fail", one_line(exc)
        conn.send((verdict, message, time.monotonic() - start))


class WorkerError(RuntimeError):
    """A worker that cannot run cases at all (it failed while importing torch and dsv4)."""


@dataclass
class Pair:
    """One (op, tier): its next seed and what its cases did."""

    op: str
    tier: str
    next_seed: int
    cases: int = 0
    failures: int = 0
    seconds: float = 0.0  # run time of its finished cases
    longest: float = FIRST_CASE_ESTIMATE  # its longest case so far
    in_flight: int = 0

    def estimate(self) -> float:
        return self.seconds / self.cases if self.cases else FIRST_CASE_ESTIMATE

    def load(self) -> float:
        """Seconds spent, counting cases in flight at their estimate: the pair with the least runs next."""
        return self.seconds + self.in_flight * self.estimate()


@dataclass
class Worker:
    """A worker process and the case it runs (None while idle)."""

    context: multiprocessing.context.BaseContext
    process: multiprocessing.process.BaseProcess | None = None
    conn: multiprocessing.connection.Connection | None = None
    ready: bool = False
    since: float = 0.0  # start of the process, or of its case
    job: tuple[Pair, int] | None = None
    restarts: int = 0

    def start(self) -> None:
        parent_end, child_end = self.context.Pipe()
        self.process = self.context.Process(target=serve, args=(child_end,), daemon=True)
        self.process.start()
        child_end.close()
        self.conn, self.ready, self.since, self.job = parent_end, False, time.monotonic(), None

    def run(self, pair: Pair) -> None:
        seed = pair.next_seed
        pair.next_seed += 1
        pair.in_flight += 1
        self.job, self.since = (pair, seed), time.monotonic()
        self.conn.send((pair.op, pair.tier, seed))

    def stop(self) -> None:
        """Ends the process at once: a worker holds nothing worth a clean exit, and torch's takes a while."""
        if self.process is not None:
            self.process.kill()
            self.process.join()
            self.process = None

    def replace(self) -> None:
        """Kills the process (crashed or hung) and starts a fresh one."""
        self.process.kill()
        self.process.join()
        self.restarts += 1
        self.start()

    def waitables(self) -> list:
        return [self.conn, self.process.sentinel]


# ---------------------------------------------------------------------------------------------
# The fuzzing run
# ---------------------------------------------------------------------------------------------


class Run:
    """One fuzzing run: which pair runs next on an idle worker, and what each answer (or silence) of a worker means."""

    def __init__(self, pairs: list[Pair], deadline: float, case_timeout: float, script: str):
        self.pairs, self.deadline, self.case_timeout, self.script = pairs, deadline, case_timeout, script
        self.shown: dict[tuple[str, str], int] = {}  # failures printed per (op, tier)
        self.any_ready = False

    def next_pair(self, now: float) -> Pair | None:
        """The pair with the least time spent whose next case should end before the deadline, were it its longest."""
        fitting = [p for p in self.pairs if now + p.longest <= self.deadline]
        return min(fitting, key=Pair.load, default=None)

    def record(self, worker: Worker, verdict: str, message: str, seconds: float) -> None:
        pair, seed = worker.job
        worker.job = None
        pair.in_flight -= 1
        pair.cases += 1
        pair.seconds += seconds
        pair.longest = max(pair.longest if pair.cases > 1 else 0.0, seconds)
        if verdict == "pass":
            return
        pair.failures += 1
        key = (pair.op, pair.tier)
        self.shown[key] = self.shown.get(key, 0) + 1
        if self.shown[key] <= MAX_SHOWN_PER_PAIR:
            threads = cases_module().case_threads(seed)
            print(f"FAIL {pair.op} on {pair.tier}, seed {seed}, {threads} threads: {message}", flush=True)
            print(f"  reproduce: {self.script} --op {pair.op} --tier {pair.tier} --seed {seed}", flush=True)

    def poll(self, worker: Worker, now: float) -> None:
        """Collects what the worker did: got ready, answered, crashed or hung."""
        if worker.conn.poll():
            try:
                verdict, message, seconds = worker.conn.recv()
            except (EOFError, OSError):  # the pipe closed: the process is ending
                worker.process.join(timeout=5)
            else:
                if verdict == "ready":
                    if not self.any_ready:  # a slow start-up still leaves some time to fuzz
                        self.deadline = max(self.deadline, now + MIN_FUZZ_SECONDS)
                    worker.ready = self.any_ready = True
                else:
                    self.record(worker, verdict, message, seconds)
                return
        if failure := self.failure(worker, now):
            if worker.job is None:  # died or stuck while starting: nothing to blame on a case
                raise WorkerError(f"a worker could not start ({failure}; its error is above)")
            self.record(worker, "fail", failure, now - worker.since)
            worker.replace()

    def failure(self, worker: Worker, now: float) -> str | None:
        """Why the worker is gone (a crash) or stuck (a hang), or None while it is fine."""
        if not worker.process.is_alive():
            code = worker.process.exitcode
            if code is not None and code < 0:
                return f"crash: the worker died of {signal.Signals(-code).name}"
            return f"crash: the worker exited with status {code}"
        limit = self.case_timeout if worker.job else STARTUP_TIMEOUT
        if now - worker.since > limit:
            return f"hang: no answer after {limit:g} s" if worker.job else f"no answer after {limit:g} s"
        return None

    def loop(self, workers: list[Worker]) -> None:
        while True:
            now = time.monotonic()
            for w in workers:
                if w.ready and w.job is None and (pair := self.next_pair(now)) is not None:
                    w.run(pair)
            running = [w for w in workers if w.job is not None]
            starting = [w for w in workers if not w.ready]
            if not running and (not starting or now >= self.deadline or self.next_pair(now) is None):
                return
            watched = running + starting
            limits = [w.since + (self.case_timeout if w.job else STARTUP_TIMEOUT) for w in watched]
            wait = min([*limits, self.deadline] if not running else limits) - now
            multiprocessing.connection.wait([x for w in watched for x in w.waitables()], timeout=max(0.0, wait))
            now = time.monotonic()
            for w in watched:
                self.poll(w, now)


def select(ops: list[str], tiers: list[str]) -> tuple[list[str], list[str]] | None:
    """The ops and the tiers of this machine to fuzz; prints what is skipped, and None when nothing is left."""
    cases = cases_module()
    unknown = [op for op in ops if op not in cases.FUZZERS] + [t for t in tiers if t not in ALL_TIERS]
    if unknown:
        print(f"fuzz: unknown op or tier: {', '.join(unknown)} (see --list)")
        return None
    uncovered = [op for op in cases.dsv4_op_names()
                 if op not in cases.FUZZERS and op not in cases.NOT_FUZZED and op not in cases.FUZZED_OVERLOADS]
    if uncovered:
        print(f"fuzz: dsv4 ops without a fuzzer: {', '.join(uncovered)}")
    supported = cases.supported_tiers()
    wanted = tiers or list(ALL_TIERS)
    lacking = [t for t in wanted if t not in supported]
    if lacking:
        print(f"fuzz: tiers this machine lacks (not fuzzed): {', '.join(lacking)}")
    tiers = [t for t in wanted if t in supported]
    return (ops or list(cases.FUZZERS), tiers) if tiers else None


def fuzz(ops: list[str], tiers: list[str], seconds: float, seed: int, case_timeout: float, workers: int,
         started: float) -> int:
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no fork of torch's thread pools
    pool = [Worker(context) for _ in range(workers)]
    for w in pool:
        w.start()  # the workers import torch while this process does
    try:
        if (selected := select(ops, tiers)) is None:
            return 2
        ops, tiers = selected
        print(f"fuzz: {len(ops)} ops on {', '.join(tiers)} for {seconds:g} s, seed {seed}, {workers} workers",
              flush=True)
        pairs = [Pair(op, tier, seed) for op in ops for tier in tiers]
        Run(pairs, started + seconds, case_timeout, reproducer_prefix()).loop(pool)
    except WorkerError as exc:
        print(f"fuzz: {exc}")
        return 1
    finally:
        for w in pool:
            w.stop()
    print_summary(pairs, tiers, time.monotonic() - started, sum(w.restarts for w in pool))
    total, failed = sum(p.cases for p in pairs), sum(p.failures for p in pairs)
    if total == 0:
        print("fuzz: no case ran (the time budget is too small)")
        return 1
    return 1 if failed else 0


def print_summary(pairs: list[Pair], tiers: list[str], elapsed: float, restarts: int) -> None:
    width = max(len(p.op) for p in pairs) + 2
    cells = {(p.op, p.tier): f"{p.cases}" + (f" ({p.failures} FAILED)" if p.failures else "") for p in pairs}
    column = max(12, *(len(c) + 2 for c in cells.values()))
    ops = list(dict.fromkeys(p.op for p in pairs))
    total, failed = sum(p.cases for p in pairs), sum(p.failures for p in pairs)
    print()
    print(f"fuzz summary: {total} cases, {failed} failed, {elapsed:.1f} s, {restarts} worker restarts")
    print("op".ljust(width) + "".join(t.ljust(column) for t in tiers))
    for op in ops:
        print(op.ljust(width) + "".join(cells[(op, t)].ljust(column) for t in tiers))


# ---------------------------------------------------------------------------------------------
# Command line
# ---------------------------------------------------------------------------------------------


def reproducer_prefix() -> str:
    """How to run this script again from the current directory."""
    python = os.path.relpath(sys.executable)
    return f"{'python' if python.startswith('..') else python} {os.path.relpath(os.path.abspath(__file__))}"


def reproduce(op: str, tier: str, seed: int) -> int:
    """Runs one case in this process and prints its inputs and the whole failure."""
    cases = cases_module()
    print(f"{op} on {tier}, seed {seed}")
    try:
        cases.run_case(op, tier, seed, log=lambda line: print(f"  {line}"))
    except Exception:
        print("FAIL")
        traceback.print_exc(file=sys.stdout)
        return 1
    print("pass")
    return 0


def list_everything(cases, tiers: list[str], lacking: list[str]) -> None:
    print("fuzzed ops:")
    for op in cases.FUZZERS:
        print(f"  {op}")
    for op, why in cases.NOT_FUZZED.items():
        print(f"  ({op}: not fuzzed on its own, {why})")
    print(f"tiers: {', '.join(tiers)}" + (f" (not on this machine: {', '.join(lacking)})" if lacking else ""))


def seed_value(text: str) -> int | str:
    """--seed: an integer, or 'random' for one drawn now (and printed)."""
    return text if text == "random" else int(text)


def names(values: list[str] | None) -> list[str]:
    """--op / --tier values, repeated or comma-separated."""
    return [n for v in values or [] for n in v.split(",") if n]


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--op", action="append", help="op(s) to fuzz (repeat or comma-separate; default: all)")
    parser.add_argument("--tier", action="append", help=f"CPU tier(s) {', '.join(ALL_TIERS)} (default: all here)")
    parser.add_argument("--seed", type=seed_value,
                        help=f"base seed, or 'random' (default {DEFAULT_SEED}); with one --op and one --tier and no "
                             "--seconds: run that one case in-process, with details")
    parser.add_argument("--seconds", type=float, help="total wall time (default: $FUZZ_SECONDS, else "
                                                      f"{DEFAULT_SECONDS:g})")
    parser.add_argument("--case-timeout", type=float, default=DEFAULT_CASE_TIMEOUT,
                        help=f"seconds before a case counts as hung (default {DEFAULT_CASE_TIMEOUT:g})")
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                        help="worker processes (default: 2, or 1 on one core)")
    parser.add_argument("--list", action="store_true", help="list the fuzzed ops and the tiers, then exit")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    started = time.monotonic()
    args = parse_args(argv)
    ops, tiers = names(args.op), names(args.tier)
    single_case = args.seed not in (None, "random") and len(ops) == 1 and len(tiers) == 1 and args.seconds is None
    if args.list or single_case:
        cases = cases_module()
        supported = cases.supported_tiers()
        if args.list:
            list_everything(cases, supported, [t for t in ALL_TIERS if t not in supported])
            return 0
        if ops[0] not in cases.FUZZERS:
            print(f"fuzz: no fuzzer for {ops[0]!r} (see --list)")
            return 2
        if tiers[0] not in supported:
            print(f"fuzz: tier {tiers[0]!r} is not on this machine (it has {', '.join(supported)})")
            return 2
        return reproduce(ops[0], tiers[0], args.seed)
    seed = int.from_bytes(os.urandom(4), "little") if args.seed == "random" else args.seed
    if seed is None:
        seed = DEFAULT_SEED
    seconds = args.seconds if args.seconds is not None else float(os.environ.get("FUZZ_SECONDS", DEFAULT_SECONDS))
    return fuzz(ops, tiers, seconds, seed, args.case_timeout, max(1, args.workers), started)


if __name__ == "__main__":
    sys.exit(main())
