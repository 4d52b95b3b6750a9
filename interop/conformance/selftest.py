#!/usr/bin/env python3
"""Self-test of the conformance harness: run.py and conformance.py on a small fake suite.

The fake suite has the layout of rdma-core's (an __init__.py whose load_tests() adds the
test_*.py modules, an args_parser module with `parser`) and one test of each kind the
harness must record: pass, fail, error, skip, an expected failure, a class whose
setUpClass skips, a test whose process dies (os._exit), one that hangs, and tests after
those two, which must still run. conformance.sh runs it before the columns (no device, a
few seconds); it exits 1 naming what differs.

    selftest.py [--python PY]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))

ARGS_PARSER = '''
import argparse, sys
class ArgsParser:
    def __init__(self):
        self.args = None
    def parse_args(self):
        p = argparse.ArgumentParser()
        p.add_argument("--dev")
        p.add_argument("-v", "--verbose", dest="verbosity", action="store_const", const=2)
        p.add_argument("--list-tests", action="store_true", default=False)
        ns, rest = p.parse_known_args()
        self.args = vars(ns)
        sys.argv[1:] = rest
parser = ArgsParser()
'''

INIT = '''
import importlib, os
from args_parser import parser
def _load():
    return [importlib.import_module("." + f[:-3], __name__)
            for f in sorted(os.listdir(os.path.dirname(__file__)))
            if f.startswith("test_") and f.endswith(".py")]
__test_modules__ = _load()
def load_tests(loader, standard_tests, pattern):
    for m in __test_modules__:
        standard_tests.addTests(loader.loadTestsFromModule(m, pattern))
    return standard_tests
'''

TESTS_A = '''
import os, time, unittest
from args_parser import parser
class A(unittest.TestCase):
    def test_1_pass(self):
        self.assertEqual(parser.args["dev"], "fake0")
    def test_2_fail(self):
        self.assertEqual(1, 2, "one is not two")
    def test_3_error(self):
        raise RuntimeError("boom")
    def test_4_skip(self):
        raise unittest.SkipTest("no such hardware")
    @unittest.expectedFailure
    def test_5_xfail(self):
        self.fail("expected")
    def test_6_crash(self):
        os._exit(3)
    def test_7_after_crash(self):
        pass
    def test_8_hang(self):
        time.sleep(3600)
    def test_9_after_hang(self):
        pass
'''

TESTS_B = '''
import unittest
class B(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        raise unittest.SkipTest("class needs a device")
    def test_b1(self):
        pass
    def test_b2(self):
        pass
class C(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        raise OSError("class setup broke")
    def test_c1(self):
        pass
'''

EXPECTED = {
    "tests.test_a.A.test_1_pass": ("pass", ""),
    "tests.test_a.A.test_2_fail": ("fail", "AssertionError: 1 != 2 : one is not two"),
    "tests.test_a.A.test_3_error": ("error", "RuntimeError: boom"),
    "tests.test_a.A.test_4_skip": ("skip", "no such hardware"),
    "tests.test_a.A.test_5_xfail": ("xfail", ""),
    "tests.test_a.A.test_6_crash": ("crash", "exited with status 3"),
    "tests.test_a.A.test_7_after_crash": ("pass", ""),
    "tests.test_a.A.test_8_hang": ("timeout", None),
    "tests.test_a.A.test_9_after_hang": ("pass", ""),
    "tests.test_b.B.test_b1": ("skip", "setUpClass: class needs a device"),
    "tests.test_b.B.test_b2": ("skip", "setUpClass: class needs a device"),
    "tests.test_b.C.test_c1": ("error", "setUpClass: OSError: class setup broke"),
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--python", default="/usr/bin/python3")
    a = ap.parse_args()
    conf = os.path.join(HERE, "conformance.py")
    bad = []
    with tempfile.TemporaryDirectory(prefix="xrnic-conf-selftest.") as d:
        suite = os.path.join(d, "suite")
        os.mkdir(suite)
        for fname, text in (
            ("args_parser.py", ARGS_PARSER),
            ("__init__.py", INIT),
            ("test_a.py", TESTS_A),
            ("test_b.py", TESTS_B),
        ):
            with open(os.path.join(suite, fname), "w", encoding="utf-8") as f:
                f.write(text)
        rec, log = os.path.join(d, "fake.jsonl"), os.path.join(d, "fake.log")
        run = subprocess.run(
            [a.python, conf, "run", "--suite", suite, "--records", rec, "--log", log]
            + ["--idle", "3", "--python", a.python, "--", "--", "--dev", "fake0", "-v"],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if run.returncode != 0:
            bad.append(f"run exited {run.returncode}: {run.stderr.strip()}")
        got = {}
        with open(rec, encoding="utf-8") as f:
            for line in f:
                r = json.loads(line)
                if "outcome" in r:
                    got[r["id"]] = (r["outcome"], r.get("detail", ""))
        for tid, (outcome, detail) in EXPECTED.items():
            o, dt = got.get(tid, ("absent", ""))
            if o != outcome or (detail is not None and dt != detail):
                bad.append(f"{tid}: got {o} {dt!r}, want {outcome} {detail!r}")
        for tid in sorted(set(got) - set(EXPECTED)):
            bad.append(f"{tid}: unexpected record {got[tid]}")
        rep = subprocess.run(
            [a.python, conf, "report", "--strict", f"xrnic={rec}", f"rxe={rec}"],
            capture_output=True,
            text=True,
            timeout=60,
        )
        last = rep.stdout.strip().splitlines()[-1] if rep.stdout.strip() else "{}"
        summary = json.loads(last)
        want = {"xrnic_pass": 3, "xrnic_fail": 1, "xrnic_error": 4, "rxe_pass": 3}
        for k, v in want.items():
            if summary.get(k) != v:
                bad.append(f"report: {k} = {summary.get(k)}, want {v}")
        if summary.get("rxe_only_pass") != []:
            bad.append(f"report: rxe_only_pass = {summary.get('rxe_only_pass')}")
        if rep.returncode != 1:
            bad.append(f"report --strict exited {rep.returncode}, want 1 (xrnic fails)")
    if bad:
        print("conformance selftest FAILED:")
        for b in bad:
            print(f"  {b}")
        return 1
    print(f"conformance selftest: {len(EXPECTED)} outcomes recorded as expected")
    return 0


if __name__ == "__main__":
    sys.exit(main())
