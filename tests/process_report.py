"""``pytest --report-processes``: which tests start an OS process, and what the run cost.

Every way a test (its fixtures included) can start a process is wrapped for the run:
``subprocess.Popen`` (trio's ``open_process`` and ``run_process`` go through it, from a
worker thread), ``os.fork``, ``os.posix_spawn``/``posix_spawnp`` and the
``_posixsubprocess.fork_exec`` that ``multiprocessing``'s spawn uses. A start is charged to
the test running when it happens. At the end the report says how many of the tests that are
not ``e2e`` or ``container`` started one, their share of the tests' wall time, the files with
the most of them, and the CPU the run used: this process and every child it waited for
(``resource.getrusage`` of self and children), so a test that hands work to a subprocess
still pays for it.
"""

from __future__ import annotations

import _posixsubprocess
import os
import resource
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import Any

import preloaded
import pytest

OPTION = "--report-processes"
# Tests of these marks are left out of the counts: they exist to run real programs.
PROCESS_MARKS = ("e2e", "container")
# How many files the report lists: all that start processes, the costliest of the rest.
TOP_FILES = 60
TOP_IN_MEMORY = 10


def cpu_seconds() -> float:
    """User and system CPU of this process and of every child it has waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@dataclass
class TestCost:
    """What one test (setup, call and teardown) took and started."""

    wall: float = 0.0
    cpu: float = 0.0
    processes: int = 0


@dataclass
class ProcessReport:
    """The plugin: counts process starts per test while it is registered."""

    costs: dict[str, TestCost] = field(default_factory=dict)
    current: TestCost | None = None  # None: no counted test is running
    in_test: bool = False
    stray: int = 0  # starts outside any test (collection, session fixtures)
    _restore: list[Callable[[], None]] = field(default_factory=list)
    _wall_start: float = 0.0
    _cpu_start: float = 0.0

    # ------------------------------------------------------------ counting

    def _started(self) -> None:
        if self.current is not None:
            self.current.processes += 1
        elif not self.in_test:
            self.stray += 1

    def _wrap(self, owner: Any, name: str) -> None:
        original = getattr(owner, name, None)
        if original is None:
            return

        def counted(*args: Any, **kwargs: Any) -> Any:
            self._started()
            return original(*args, **kwargs)

        setattr(owner, name, counted)
        self._restore.append(lambda: setattr(owner, name, original))

    def install(self) -> None:
        # Popen's own path to fork_exec or posix_spawn: one start per Popen.
        self._wrap(subprocess.Popen, "_execute_child")
        for name in ("fork", "forkpty", "posix_spawn", "posix_spawnp"):
            self._wrap(os, name)
        # multiprocessing's spawn calls it directly (subprocess holds its own reference).
        self._wrap(_posixsubprocess, "fork_exec")
        # A bridge forked by the preloaded server: a start, and CPU this process's own
        # accounting sees only once the server has exited.
        self._wrap(preloaded, "_request_fork")
        charge_cpu = preloaded.charge_cpu

        def charged(seconds: float) -> None:
            if self.current is not None:
                self.current.cpu += seconds
            charge_cpu(seconds)

        preloaded.charge_cpu = charged
        self._restore.append(lambda: setattr(preloaded, "charge_cpu", charge_cpu))

    def uninstall(self) -> None:
        while self._restore:
            self._restore.pop()()

    # ------------------------------------------------------------ pytest hooks

    @pytest.hookimpl(tryfirst=True)
    def pytest_sessionstart(self, session: pytest.Session) -> None:
        self._wall_start = time.perf_counter()
        self._cpu_start = cpu_seconds()
        self.install()

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Generator[None, object, object]:
        self.in_test = True
        try:
            if any(item.get_closest_marker(mark) for mark in PROCESS_MARKS):
                return (yield)
            cost = self.current = self.costs.setdefault(item.nodeid, TestCost())
            wall, cpu = time.perf_counter(), cpu_seconds()
            try:
                return (yield)
            finally:
                cost.wall += time.perf_counter() - wall
                cost.cpu += cpu_seconds() - cpu
                self.current = None
        finally:
            self.in_test = False

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        self.uninstall()
        write = terminalreporter.write_line
        wall = time.perf_counter() - self._wall_start
        cpu = cpu_seconds() - self._cpu_start
        tests = len(self.costs)
        starting = {node: c for node, c in self.costs.items() if c.processes}
        tests_wall = sum(c.wall for c in self.costs.values()) or 1.0
        tests_cpu = sum(c.cpu for c in self.costs.values()) or 1.0
        starting_wall = sum(c.wall for c in starting.values())
        starting_cpu = sum(c.cpu for c in starting.values())
        terminalreporter.section("OS processes started by tests")
        share = 100 * len(starting) / tests if tests else 0.0
        write(
            f"{len(starting)} of {tests} tests (not {'/'.join(PROCESS_MARKS)}) started an OS "
            f"process ({share:.0f} %); {sum(c.processes for c in starting.values())} starts"
            + (f", {self.stray} outside tests" if self.stray else "")
        )
        write(
            f"their share: {100 * starting_wall / tests_wall:.0f} % of the tests' wall time "
            f"({starting_wall:.1f} of {tests_wall:.1f} s), {100 * starting_cpu / tests_cpu:.0f} % "
            f"of their CPU ({starting_cpu:.1f} of {tests_cpu:.1f} s)"
        )
        write(f"run: {wall:.1f} s wall, {cpu:.1f} s CPU (this process and its children)")
        write("files of the tests that started one, by CPU:")
        self._by_file(write, starting, TOP_FILES, starts=True)
        in_memory = {node: c for node, c in self.costs.items() if not c.processes}
        write("files of the tests that started none, by CPU:")
        self._by_file(write, in_memory, TOP_IN_MEMORY, starts=False)

    @staticmethod
    def _by_file(
        write: Callable[[str], None], costs: dict[str, TestCost], top: int, *, starts: bool
    ) -> None:
        by_file: dict[str, list[TestCost]] = defaultdict(list)
        for node, cost in costs.items():
            by_file[node.split("::", 1)[0]].append(cost)
        ranked = sorted(by_file.items(), key=lambda kv: -sum(c.cpu for c in kv[1]))
        for path, file_costs in ranked[:top]:
            started = f"{sum(c.processes for c in file_costs)} starts, " if starts else ""
            write(
                f"  {path}: {len(file_costs)} tests, {started}"
                f"{sum(c.wall for c in file_costs):.1f} s wall, "
                f"{sum(c.cpu for c in file_costs):.1f} s CPU"
            )
