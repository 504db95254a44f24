"""``--report-processes`` charges a process start to the test that made it, and only to it."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

TESTS = """
import os
import subprocess
import sys

import pytest


def test_in_memory():
    assert sum(range(10)) == 45


def test_starts_a_process():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_forks():
    pid = os.fork()
    if pid == 0:
        os._exit(0)
    os.waitpid(pid, 0)


@pytest.mark.e2e
def test_real_agent():
    subprocess.run([sys.executable, "-c", "pass"], check=True)
"""


def test_report_counts_the_tests_that_started_a_process(pytester: pytest.Pytester) -> None:
    pytester.makeconftest(
        "import process_report\n"
        "def pytest_configure(config):\n"
        "    config.addinivalue_line('markers', 'e2e: a real agent')\n"
        "    config.pluginmanager.register(process_report.ProcessReport(), 'process-report')\n"
    )
    pytester.makepyfile(test_mixed=TESTS)
    result = pytester.runpytest_inprocess()
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(
        [
            "2 of 3 tests (not e2e/container) started an OS process (67 %); 2 starts",
            "their share: * % of the tests' wall time *",
            "run: * s wall, * s CPU (this process and its children)",
            "files of the tests that started one, by CPU:",
            "  test_mixed.py: 2 tests, 2 starts, *",
            "files of the tests that started none, by CPU:",
            "  test_mixed.py: 1 tests, * s wall, * s CPU",
        ]
    )
