"""pytest's JUnit XML report as JSON lines (tools/gpu_run.sh's tests.jsonl).

    python3 tools/junit_jsonl.py REPORT.xml [PYTEST_LOG] > tests.jsonl

One line per test: ``{"test": "tests/test_x.py::test_y[cuda]", "outcome": "passed" |
"failed" | "error" | "skipped", "seconds": ...}``, then one summary line ``{"summary":
{"passed": N, ...}, "source": "junit"}``. When the report is missing or cut short (pytest
stopped at its time cap before writing it), the outcomes are read from PYTEST_LOG, the
output of ``pytest -v`` (no seconds then; ``"source": "log"``).
"""

import json
import re
import sys
import xml.etree.ElementTree as ElementTree
from collections import Counter

# `pytest -v` result lines: "[gw3] [ 10%] PASSED tests/x.py::t[cpu]" under pytest-xdist,
# "tests/x.py::t[cpu] PASSED [ 10%]" without it.
OUTCOMES = "PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS"
LOG_LINE = re.compile(rf"(?:\b({OUTCOMES}) (tests/\S+::\S+))|(?:^(tests/\S+::\S+) ({OUTCOMES})\b)")


def junit_cases(path: str) -> list[dict]:
    """The report's test cases. Raises OSError / ParseError when it cannot be read."""
    cases = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        result = "passed"
        for tag in ("failure", "error", "skipped"):
            if case.find(tag) is not None:
                result = "failed" if tag == "failure" else tag
                break
        module = case.get("classname", "").replace(".", "/")  # tests.test_x -> tests/test_x
        test = f"{module}.py::{case.get('name', '')}"
        cases.append({"test": test, "outcome": result, "seconds": float(case.get("time", 0))})
    return cases


def log_cases(path: str) -> list[dict]:
    """The outcomes that ``pytest -v`` printed into ``path``, one per test (its first: the
    short summary repeats failures); empty if none or no file."""
    try:
        text = open(path, errors="replace").read()
    except OSError:
        return []
    outcomes: dict[str, str] = {}
    for line in text.splitlines():
        m = LOG_LINE.search(line)
        if m:
            outcome, test = (m[1], m[2]) if m[1] else (m[4], m[3])
            outcomes.setdefault(test, outcome.lower())
    return [{"test": test, "outcome": outcome} for test, outcome in outcomes.items()]


def main(report: str, log: str | None = None) -> None:
    try:
        cases, source = junit_cases(report), "junit"
    except (OSError, ElementTree.ParseError):
        cases, source = (log_cases(log) if log else []), "log"
    for case in cases:
        print(json.dumps(case))
    print(json.dumps({"summary": dict(Counter(c["outcome"] for c in cases)), "source": source}))


if __name__ == "__main__":
    main(*sys.argv[1:3])
