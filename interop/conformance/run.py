#!/usr/bin/env python3
"""Run rdma-core's test suite (python3-pyverbs, tests/run_tests.py) and record each test.

The suite is loaded the way its own run_tests.py loads it (its __init__.py as the package
`tests`, whose load_tests() adds every tests/test_*.py module; its args_parser takes
--dev, --port, --gid, -v), and run by unittest's text runner at verbosity 2, so the
console shows what run_tests.py -v shows. Beside it, every test's outcome is written to a
JSON-lines file as it happens, flushed at once: a `start` record when a test begins and a
result record when it ends. A process that dies or hangs in a test (a crash in the verbs
library under test) leaves a `start` with no result, which conformance.py turns into
`crash` or `timeout` before it runs the rest.

    run.py --suite DIR --records FILE [--exclude FILE] [--list] -- SUITE-ARGS...

--list prints the test ids, one a line, without running them. --exclude names a file of
ids (one a line) not to run: those a previous run already recorded.

A test's outcome is one of pass, fail, error, skip, xfail (expected failure), xpass
(unexpected success). A class whose setUpClass raises (SkipTest included) runs none of its
tests: unittest reports the class once; here each of its tests gets that outcome, with
`detail` saying it came from the class (the same for setUpModule).
"""

import argparse
import importlib.machinery
import json
import os
import sys
import traceback
import unittest


def load_suite(suite_dir, suite_args):
    """The suite's package `tests`, loaded as run_tests.py does, with its argument parser
    fed SUITE-ARGS (it rewrites sys.argv to what it leaves to unittest)."""
    sys.path.insert(0, suite_dir)
    sys.argv = [os.path.join(suite_dir, "run_tests.py")] + suite_args
    from args_parser import parser  # noqa: E402  (the suite's own module)

    parser.parse_args()
    init = os.path.join(suite_dir, "__init__.py")
    loader = importlib.machinery.SourceFileLoader("tests", init)
    # The same call run_tests.py makes (load_module is deprecated but is what it uses,
    # and it registers `tests` in sys.modules so that the relative imports resolve).
    return loader.load_module()


def flatten(suite):
    for t in suite:
        if isinstance(t, unittest.TestSuite):
            yield from flatten(t)
        else:
            yield t


def short(exc_info_text, limit=300):
    """The last line of a traceback (the exception and its message), cut to `limit`."""
    lines = [ln for ln in exc_info_text.strip().splitlines() if ln.strip()]
    last = lines[-1] if lines else ""
    return last[:limit]


class Recorder:
    def __init__(self, path):
        self.f = open(path, "a", encoding="utf-8")

    def write(self, rec):
        self.f.write(json.dumps(rec, sort_keys=True) + "\n")
        self.f.flush()
        os.fsync(self.f.fileno())


def make_result_class(recorder, planned):
    """A TextTestResult that also records each outcome (see the module's doc)."""
    by_class = {}
    for t in planned:
        by_class.setdefault(t.id().rsplit(".", 1)[0], []).append(t.id())

    class RecordingResult(unittest.TextTestResult):
        done = set()

        def _rec(self, test, outcome, detail=""):
            tid = test.id()
            holder = isinstance(test, unittest.suite._ErrorHolder)
            if holder:
                # "setUpClass (tests.test_x.Cls)" or "setUpModule (tests.test_x)"
                desc = test.description
                scope = desc[desc.find("(") + 1 : desc.rfind(")")]
                what = desc.split(" ", 1)[0]
                ids = [
                    i
                    for c, lst in by_class.items()
                    if c == scope or c.startswith(scope + ".")
                    for i in lst
                ]
                for i in ids:
                    if i not in self.done:
                        self.done.add(i)
                        recorder.write(
                            {"id": i, "outcome": outcome, "detail": f"{what}: {detail}"}
                        )
                return
            if tid in self.done:
                # A failing tearDown after a recorded result: keep the worse outcome.
                if outcome not in ("error", "fail"):
                    return
            self.done.add(tid)
            recorder.write({"id": tid, "outcome": outcome, "detail": detail})

        def startTest(self, test):
            recorder.write({"id": test.id(), "event": "start"})
            super().startTest(test)

        def addSuccess(self, test):
            super().addSuccess(test)
            self._rec(test, "pass")

        def addFailure(self, test, err):
            super().addFailure(test, err)
            self._rec(test, "fail", short(self.failures[-1][1]))

        def addError(self, test, err):
            super().addError(test, err)
            if issubclass(err[0], unittest.SkipTest):
                self._rec(test, "skip", str(err[1]))
            else:
                self._rec(test, "error", short(self.errors[-1][1]))

        def addSkip(self, test, reason):
            super().addSkip(test, reason)
            self._rec(test, "skip", str(reason))

        def addExpectedFailure(self, test, err):
            super().addExpectedFailure(test, err)
            self._rec(test, "xfail")

        def addUnexpectedSuccess(self, test):
            super().addUnexpectedSuccess(test)
            self._rec(test, "xpass")

        def addSubTest(self, test, subtest, err):
            super().addSubTest(test, subtest, err)
            if err is not None:
                kind = "fail" if issubclass(err[0], test.failureException) else "error"
                text = "".join(traceback.format_exception_only(err[0], err[1]))
                self._rec(test, kind, f"{subtest.id()}: {short(text)}")

    return RecordingResult


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--suite", required=True, help="the unpacked tests directory")
    ap.add_argument("--records", help="JSON-lines file the outcomes are appended to")
    ap.add_argument("--exclude", help="file of test ids not to run")
    ap.add_argument("--list", action="store_true", help="print the test ids and exit")
    ap.add_argument("suite_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    suite_args = a.suite_args[1:] if a.suite_args[:1] == ["--"] else a.suite_args

    tests_mod = load_suite(os.path.abspath(a.suite), suite_args)
    loader = unittest.TestLoader()
    everything = list(flatten(loader.loadTestsFromModule(tests_mod)))
    if a.list:
        for t in everything:
            print(t.id())
        return 0
    if not a.records:
        ap.error("--records is required to run")
    skip = set()
    if a.exclude and os.path.exists(a.exclude):
        with open(a.exclude, encoding="utf-8") as f:
            skip = {ln.strip() for ln in f if ln.strip()}
    planned = [t for t in everything if t.id() not in skip]
    recorder = Recorder(a.records)
    runner = unittest.TextTestRunner(
        verbosity=2, resultclass=make_result_class(recorder, planned)
    )
    runner.run(unittest.TestSuite(planned))
    recorder.write({"event": "end"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
