#!/usr/bin/env python3
"""rdma-core's test suite on xrnic and on rxe: run one column, or report them side by side.

    conformance.py run --suite DIR --records FILE --log FILE [--idle S] [--deadline S]
                       [--python PY] -- PREFIX... -- SUITE-ARGS...
    conformance.py report [--strict] NAME=FILE...

`run` lists the suite's tests (run.py --list), then runs run.py under PREFIX (for example
`ip netns exec NS xrnic exec --netdev eth0 --`), the console going to --log. A run that
stops before every test has an outcome is started again without the tests already
recorded: the test it was in gets `crash` (the process died: a fault in the verbs library
under test, with its exit status) or `timeout` (no record for --idle seconds: the whole
process group is killed). Tests still without an outcome when --deadline seconds have
passed, or after a restart that made no progress, get `not-run`.

`report` reads one records file per column (NAME=FILE, in the order given; a missing
file is a column that did not run) and prints, test by test, the outcome in each column
(pass, fail, error, skip, xfail, xpass, crash, timeout, not-run) with the reason of each
outcome other than pass, then the totals per column, the skip reasons grouped, the tests
that pass on rxe and not on xrnic, and as its last line one JSON object (docs/interop.md
"Conformance: rdma-core's suite" names its keys). --strict: exit 1 when an xrnic column
has a test that fails, errors, crashes or hangs.
"""

import argparse
import collections
import json
import os
import re
import signal
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BAD = ("fail", "error", "crash", "timeout")


def read_records(path):
    """{test id: (outcome, detail)} and the id of a test started without a result."""
    out, started = {}, None
    if not os.path.exists(path):
        return out, started
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line cut by a kill
            if r.get("event") == "start":
                started = r["id"]
            elif "outcome" in r:
                out[r["id"]] = (r["outcome"], r.get("detail", ""))
                if started == r["id"]:
                    started = None
    return out, started


def append(path, rec):
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(rec, sort_keys=True) + "\n")


def kill_group(proc):
    for sig, wait in ((signal.SIGTERM, 5), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait)
            return
        except subprocess.TimeoutExpired:
            pass


def cmd_run(a, prefix, suite_args):
    py = a.python
    runner = os.path.join(HERE, "run.py")
    env = dict(os.environ, PYTHONDONTWRITEBYTECODE="1", PYTHONUNBUFFERED="1")
    listed = subprocess.run(
        [py, runner, "--suite", a.suite, "--list", "--"] + suite_args,
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
    )
    if listed.returncode != 0:
        sys.stderr.write(listed.stderr)
        print("conformance: cannot list the suite's tests", file=sys.stderr)
        return 2
    planned = [ln.strip() for ln in listed.stdout.splitlines() if ln.strip()]
    if not planned:
        print("conformance: the suite lists no test", file=sys.stderr)
        return 2
    for p in (a.records, a.log):
        open(p, "w").close()
        os.chmod(p, 0o666)  # the prefix may run the suite as another user
    exclude = a.records + ".exclude"
    t0 = time.monotonic()
    runs = 0
    with open(a.log, "ab") as log:
        while True:
            done, _ = read_records(a.records)
            left = [t for t in planned if t not in done]
            if not left or time.monotonic() - t0 > a.deadline:
                break
            with open(exclude, "w", encoding="utf-8") as f:
                f.write("\n".join(done) + "\n")
            os.chmod(exclude, 0o644)
            runs += 1
            log.write(f"\n### conformance: run {runs}, {len(left)} tests left\n".encode())
            log.flush()
            proc = subprocess.Popen(
                prefix
                + [py, runner, "--suite", a.suite, "--records", a.records]
                + ["--exclude", exclude, "--"]
                + suite_args,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
            size, last, hung = -1, time.monotonic(), False
            while proc.poll() is None:
                time.sleep(1)
                s = os.path.getsize(a.records)
                now = time.monotonic()
                if s != size:
                    size, last = s, now
                elif now - last > a.idle or now - t0 > a.deadline:
                    hung = True
                    kill_group(proc)
                    break
            rc = proc.wait()
            after, started = read_records(a.records)
            if started is not None:
                if hung:
                    detail = f"no progress for {a.idle} s: process group killed"
                    outcome = "timeout"
                else:
                    outcome = "crash"
                    detail = (
                        f"killed by signal {-rc}" if rc < 0 else f"exited with status {rc}"
                    )
                append(a.records, {"id": started, "outcome": outcome, "detail": detail})
            elif len(after) == len(done):
                log.write(
                    f"### conformance: run {runs} recorded nothing (status {rc})\n".encode()
                )
                break
    done, _ = read_records(a.records)
    for t in planned:
        if t not in done:
            append(a.records, {"id": t, "outcome": "not-run", "detail": "run stopped"})
    secs = time.monotonic() - t0
    append(a.records, {"event": "summary", "seconds": round(secs, 1), "runs": runs})
    print(f"conformance: {len(planned)} tests in {secs:.0f} s ({runs} runs)")
    return 0


def seconds_of(path):
    if not os.path.exists(path):
        return None
    secs = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if r.get("event") == "summary":
                secs = r.get("seconds")
    return secs


# What a test's own processes print about a failure (the rdma_cm tests run each side in
# a process of its own and raise only "Exception in active/passive side occurred"; the
# cause is what the side printed), and the verbs library's own one-line reasons.
NOTE = re.compile(r"(Player (?:active|passive) got: .*|^xrnic: .*|^libibverbs: .*)")
TEST_LINE = re.compile(r"^(\w+) \((tests\.[\w.]+)\)")


def log_notes(path, limit=4):
    """{test id: the NOTE lines printed while it ran}, from a column's console log."""
    notes = collections.defaultdict(list)
    if not os.path.exists(path):
        return notes
    cur = None
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            m = TEST_LINE.match(line)
            if m:
                cur = m.group(2)
                line = line[m.end() :].lstrip(" .")
            for piece in line.rstrip("\n").split("Player ")[1:] or [line.rstrip("\n")]:
                piece = ("Player " + piece) if line.count("Player ") else piece
                n = NOTE.search(piece.strip())
                if cur and n and len(notes[cur]) < limit and n.group(1) not in notes[cur]:
                    notes[cur].append(n.group(1)[:200])
    return notes


def name(tid):
    return tid[len("tests.") :] if tid.startswith("tests.") else tid


def cmd_report(a):
    cols, notes = [], {}
    for spec in a.columns:
        if "=" not in spec:
            print(f"conformance: column '{spec}' is not NAME=FILE", file=sys.stderr)
            return 2
        n, p = spec.split("=", 1)
        recs, _ = read_records(p)
        cols.append((n, recs if os.path.exists(p) else None, seconds_of(p)))
        notes[n] = log_notes(os.path.splitext(p)[0] + ".log")
    ids = sorted({t for _, r, _ in cols if r for t in r})
    width = max([len(name(t)) for t in ids] + [10])
    head = f"{'test':<{width}}  " + "  ".join(f"{n:<8}" for n, _, _ in cols)
    print(head)
    print("-" * len(head))
    for t in ids:
        cells, why = [], collections.OrderedDict()
        for n, recs, _ in cols:
            if recs is None:
                cells.append("-")
                continue
            o, d = recs.get(t, ("absent", ""))
            cells.append(o)
            if o != "pass":
                why.setdefault(f"{o}: {d}" if d else o, []).append(n)
            if o in BAD:
                for note in notes[n].get(t, []):
                    why.setdefault(f"  printed: {note}", []).append(n)
        print(f"{name(t):<{width}}  " + "  ".join(f"{c:<8}" for c in cells))
        for text, who in why.items():
            print(f"    {','.join(who)}: {text}")

    print()
    print("totals")
    outcomes = ["pass", "fail", "error", "skip", "xfail", "xpass", "crash", "timeout"]
    outcomes += ["not-run"]
    counts = {}
    for n, recs, secs in cols:
        if recs is None:
            print(f"  {n:<8} not run")
            continue
        c = collections.Counter(o for o, _ in recs.values())
        counts[n] = c
        parts = ", ".join(f"{c[o]} {o}" for o in outcomes if c[o])
        took = f" in {secs:.0f} s" if secs is not None else ""
        print(f"  {n:<8} {sum(c.values())} tests{took}: {parts}")

    print()
    print("skip reasons (tests per column)")
    reasons = collections.defaultdict(collections.Counter)
    for n, recs, _ in cols:
        for o, d in (recs or {}).values():
            if o == "skip":
                reasons[d][n] += 1
    for r in sorted(reasons, key=lambda r: -sum(reasons[r].values())):
        per = ", ".join(f"{n} {reasons[r][n]}" for n, _, _ in cols if reasons[r][n])
        print(f"  [{per}] {r}")

    recs_of = {n: r for n, r, _ in cols}
    rxe = recs_of.get("rxe") or {}
    xrnic_cols = [n for n, r, _ in cols if n != "rxe" and r is not None]

    def passes(n, t):
        r = recs_of.get(n)
        return r is not None and r.get(t, ("",))[0] == "pass"

    rxe_only = [name(t) for t in ids if passes("rxe", t) and not passes("xrnic", t)]
    rxe_only_svc = [
        name(t) for t in ids if passes("rxe", t) and not passes("service", t)
    ]
    if recs_of.get("rxe") is not None:
        if recs_of.get("xrnic") is not None:
            print()
            print(f"pass on rxe, not on xrnic in process ({len(rxe_only)})")
            for t in rxe_only:
                print(f"  {t}")
        if recs_of.get("service") is not None:
            print(f"pass on rxe, not on xrnic through the service ({len(rxe_only_svc)})")
            for t in rxe_only_svc:
                print(f"  {t}")

    def count(n, *outs):
        c = counts.get(n)
        return None if c is None else sum(c[o] for o in outs)

    summary = {
        "tests": len(ids),
        "xrnic_pass": count("xrnic", "pass"),
        "xrnic_fail": count("xrnic", "fail"),
        "xrnic_error": count("xrnic", "error", "crash", "timeout"),
        "xrnic_skip": count("xrnic", "skip"),
        "xrnic_service_pass": count("service", "pass"),
        "xrnic_service_fail": count("service", "fail"),
        "xrnic_service_error": count("service", "error", "crash", "timeout"),
        "xrnic_service_skip": count("service", "skip"),
        "rxe_pass": count("rxe", "pass"),
        "rxe_fail": count("rxe", "fail"),
        "rxe_error": count("rxe", "error", "crash", "timeout"),
        "rxe_skip": count("rxe", "skip"),
        "rxe_only_pass": rxe_only
        if recs_of.get("rxe") is not None and recs_of.get("xrnic") is not None
        else None,
        "rxe_only_pass_service": rxe_only_svc
        if recs_of.get("rxe") is not None and recs_of.get("service") is not None
        else None,
        "seconds": {n: s for n, _, s in cols},
    }
    if summary["xrnic_pass"] is not None and summary["rxe_pass"]:
        summary["xrnic_to_rxe_pass_ratio"] = round(
            summary["xrnic_pass"] / summary["rxe_pass"], 2
        )
    bad = [
        (n, name(t), recs_of[n][t][0])
        for n in xrnic_cols
        for t in ids
        if recs_of[n].get(t, ("",))[0] in BAD
    ]
    rc = 0
    if bad:
        print()
        print(f"on xrnic, {len(bad)} outcomes are fail, error, crash or timeout:")
        for n, t, o in bad:
            print(f"  {n}: {t}: {o}")
        if a.strict:
            print("conformance: FAILED (strict: no test may fail or error on xrnic)")
            rc = 1
    print(json.dumps(summary, sort_keys=True))
    return rc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--suite", required=True)
    r.add_argument("--records", required=True)
    r.add_argument("--log", required=True)
    r.add_argument("--idle", type=float, default=180)
    r.add_argument("--deadline", type=float, default=3600)
    r.add_argument("--python", default="/usr/bin/python3")
    r.add_argument("rest", nargs=argparse.REMAINDER)
    p = sub.add_parser("report")
    p.add_argument("--strict", action="store_true")
    p.add_argument("columns", nargs="+")
    a = ap.parse_args()
    if a.cmd == "report":
        return cmd_report(a)
    rest = a.rest[1:] if a.rest[:1] == ["--"] else a.rest
    if "--" not in rest:
        ap.error("run: PREFIX... -- SUITE-ARGS... (an empty prefix is `-- -- ARGS`)")
    i = rest.index("--")
    return cmd_run(a, rest[:i], rest[i + 1 :])


if __name__ == "__main__":
    sys.exit(main())
