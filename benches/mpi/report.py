#!/usr/bin/env python3
"""The report of `make bench-mpi` (benches/mpi/bench-mpi.sh): reads OUTDIR/jobs/P-TRANSPORT.out
(what benches/mpi/allreduce.c's rank 0 printed) and, for xrnic, the devices' final stat
snapshots in OUTDIR/jobs/P-xrnic.stat/*.json (src/driver/snapshot.rs: `port` holds the
AF_XDP socket's kernel_rx_dropped, `device.qp` the QPs' retransmitted_packets and
local_ack_timeout_err, docs/observability.md).

Prints the table (p, S, transport, median time, B, model time T = 2(p-1)/p * S/B, ratio;
then B2, the bandwidth each way when both directions stream at once, and the ratio to
the model with B2),
each device's drops and retransmissions, writes OUTDIR/allreduce.csv and
OUTDIR/allreduce.svg (time against size, log-log, measured and model lines) and ends
with one JSON line. Exit status 1 when a job is missing a figure or a result was wrong.

    report.py OUTDIR
"""

import json
import math
import os
import statistics
import sys

SIZES = [64 << 10, 1 << 20, 8 << 20, 32 << 20]
TRANSPORTS = ["xrnic", "tcp"]


def size_name(b):
    return f"{b >> 20} MiB" if b >= 1 << 20 else f"{b >> 10} KiB"


def size_key(b):
    return f"{b >> 20}m" if b >= 1 << 20 else f"{b >> 10}k"


def parse_job(path):
    """{'bw': bytes/s (best repetition), 'bibw': bytes/s each way when both directions
    stream at once (best repetition), 'allreduce': {S: (median s, min s, ok)}}, or None."""
    if not os.path.exists(path):
        return None
    job = {"bw": None, "bibw": None, "allreduce": {}}
    with open(path) as f:
        for line in f:
            w = line.split()
            try:
                if w[:1] in (["bw"], ["bibw"]) and len(w) > 3:
                    # The fastest repetition: the link's capacity, which the model
                    # assumes; a repetition that met a retransmission timeout says
                    # something else (the drop counters).
                    t = [float(x) for x in w[3:]]
                    job[w[0]] = int(w[1]) * int(w[2]) / min(t)
                elif w[:1] == ["allreduce"] and len(w) > 4:
                    t = [float(x) for x in w[4:]]
                    job["allreduce"][int(w[2])] = (statistics.median(t), min(t), w[3] == "OK")
            except (ValueError, ZeroDivisionError):
                continue
    return job


def find_key(v, key):
    """The first value named `key` in a JSON value, depth first, or None."""
    if isinstance(v, dict):
        if key in v and isinstance(v[key], (int, float)):
            return v[key]
        for x in v.values():
            r = find_key(x, key)
            if r is not None:
                return r
    elif isinstance(v, list):
        for x in v:
            r = find_key(x, key)
            if r is not None:
                return r
    return None


def device_stats(stat_dir):
    """[(file, kernel_rx_dropped, retransmitted_packets, local_ack_timeout_err)] of each
    device snapshot."""
    out = []
    if not os.path.isdir(stat_dir):
        return out
    for name in sorted(os.listdir(stat_dir)):
        if not name.endswith(".json"):
            continue
        try:
            with open(os.path.join(stat_dir, name)) as f:
                s = json.load(f)
        except (OSError, ValueError):
            continue
        drops = find_key(s.get("port", {}), "kernel_rx_dropped") or 0
        retx = find_key(s.get("device", {}), "retransmitted_packets") or 0
        timeouts = find_key(s.get("device", {}), "local_ack_timeout_err") or 0
        out.append((name, int(drops), int(retx), int(timeouts)))
    return out


def svg_plot(points, path, title):
    """points: {(label, dashed, colour): [(bytes, seconds)]} -> a log-log SVG."""
    w, h, ml, mr, mt, mb = 760, 480, 80, 220, 40, 60
    xs = [b for pts in points.values() for b, _ in pts]
    ys = [t for pts in points.values() for _, t in pts if t > 0]
    if not xs or not ys:
        return False
    x0, x1 = math.log2(min(xs)), math.log2(max(xs))
    y0, y1 = math.floor(math.log10(min(ys))), math.ceil(math.log10(max(ys)))
    x1 = x1 if x1 > x0 else x0 + 1
    y1 = y1 if y1 > y0 else y0 + 1

    def px(b):
        return ml + (math.log2(b) - x0) / (x1 - x0) * (w - ml - mr)

    def py(t):
        return mt + (y1 - math.log10(t)) / (y1 - y0) * (h - mt - mb)

    o = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'font-family="sans-serif" font-size="12">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{ml}" y="22" font-size="14">{title}</text>',
    ]
    for e in range(y0, y1 + 1):
        y = py(10.0**e)
        label = f"{10.0 ** e * 1e3:g} ms"
        o.append(f'<line x1="{ml}" y1="{y:.1f}" x2="{w - mr}" y2="{y:.1f}" stroke="#ddd"/>')
        o.append(f'<text x="{ml - 6}" y="{y + 4:.1f}" text-anchor="end">{label}</text>')
    for b in sorted(set(xs)):
        x = px(b)
        o.append(f'<line x1="{x:.1f}" y1="{mt}" x2="{x:.1f}" y2="{h - mb}" stroke="#ddd"/>')
        o.append(f'<text x="{x:.1f}" y="{h - mb + 18}" text-anchor="middle">{size_name(b)}</text>')
    o.append(f'<text x="{(ml + w - mr) / 2}" y="{h - 15}" text-anchor="middle">'
             "all-reduce size S (float sum)</text>")
    o.append(f'<text x="18" y="{(mt + h - mb) / 2}" text-anchor="middle" '
             f'transform="rotate(-90 18 {(mt + h - mb) / 2})">time (median)</text>')
    o.append(f'<rect x="{ml}" y="{mt}" width="{w - ml - mr}" height="{h - mt - mb}" '
             'fill="none" stroke="black"/>')
    ly = mt + 10
    for (label, dashed, colour), pts in points.items():
        pts = sorted(p for p in pts if p[1] > 0)
        if not pts:
            continue
        dash = ' stroke-dasharray="6 4"' if dashed else ""
        d = " ".join(f"{px(b):.1f},{py(t):.1f}" for b, t in pts)
        o.append(f'<polyline points="{d}" fill="none" stroke="{colour}" stroke-width="2"{dash}/>')
        if not dashed:
            for b, t in pts:
                o.append(f'<circle cx="{px(b):.1f}" cy="{py(t):.1f}" r="3" fill="{colour}"/>')
        lx = w - mr + 12
        o.append(f'<line x1="{lx}" y1="{ly}" x2="{lx + 28}" y2="{ly}" stroke="{colour}" '
                 f'stroke-width="2"{dash}/>')
        o.append(f'<text x="{lx + 34}" y="{ly + 4}">{label}</text>')
        ly += 20
    o.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(o) + "\n")
    return True


def main():
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    ps = sorted({int(n.split("-")[0]) for n in os.listdir(os.path.join(out, "jobs"))
                 if n.endswith(".out") and n[0].isdigit()})
    bad = False
    rows, csv = [], ["p,transport,bytes,seconds,min_seconds,model_seconds,ok"]
    jobs, figures = {}, {}
    for p in ps:
        for tr in TRANSPORTS:
            job = parse_job(os.path.join(out, "jobs", f"{p}-{tr}.out"))
            if job is None:
                continue
            jobs[(p, tr)] = job
    for p in ps:
        for tr in TRANSPORTS:
            job = jobs.get((p, tr))
            if job is None:
                continue
            # B of the model: the link's, measured in the p = 2 job of the same transport
            # (two ranks, nothing else running); in a larger job the idle ranks that yield
            # in the barrier take CPU from the two that stream (the B column shows it).
            link = jobs.get((min(ps), tr), job)
            b = link["bw"]
            b2 = link["bibw"]
            for s in SIZES:
                r = job["allreduce"].get(s)
                if r is None or b is None:
                    print(f"p={p} {tr}: no figure for {size_name(s)}", file=sys.stderr)
                    bad = True
                    continue
                t, tmin, ok = r
                bad |= not ok
                model = 2 * (p - 1) / p * s / b
                ratio2 = t / (2 * (p - 1) / p * s / b2) if b2 else float("nan")
                figures[(p, tr, s)] = (t, model)
                rows.append((p, size_name(s), tr, t, tmin, job["bw"] or 0, model, t / model,
                             job["bibw"] or 0, ratio2, ok))
                csv.append(f"{p},{tr},{s},{t:.6f},{tmin:.6f},{model:.6f},{int(ok)}")
    with open(os.path.join(out, "allreduce.csv"), "w") as f:
        f.write("\n".join(csv) + "\n")

    print()
    print(f"{'p':>2} {'S':>7} {'transport':<9} {'time ms':>9} {'min ms':>9} "
          f"{'B Gb/s':>7} {'model ms':>9} {'ratio':>6} {'B2 Gb/s':>8} {'ratio2':>6}  result")
    for p, s, tr, t, tmin, b, model, ratio, b2, ratio2, ok in rows:
        print(f"{p:>2} {s:>7} {tr:<9} {t * 1e3:>9.2f} {tmin * 1e3:>9.2f} {b * 8 / 1e9:>7.2f} "
              f"{model * 1e3:>9.2f} {ratio:>6.2f} {b2 * 8 / 1e9:>8.2f} {ratio2:>6.2f}  "
              f"{'ok' if ok else 'WRONG'}")
    print("time: the median of the slowest rank's time per call; model T = 2(p-1)/p * S/B")
    print(f"with B the p = {min(ps)} job's; B: rank 0 -> rank 1, 8 x 8 MiB messages (the best")
    print("repetition) in this job; B2: each way when ranks 0 and 1 stream to each other at")
    print(f"once; ratio2: time / (2(p-1)/p * S/B2), B2 the p = {min(ps)} job's")

    # What sharing a core costs: the smallest p with all its ranks on one CPU, against
    # the same job on every CPU; p = 4 on two CPUs shares as much (two ranks per core).
    share = {}
    for tr in TRANSPORTS:
        one = parse_job(os.path.join(out, "jobs", f"{ps[0]}-{tr}-1cpu.out")) if ps else None
        if one is None:
            continue
        if not share:
            print()
            print(f"sharing a core: p = {ps[0]} with every rank on one CPU against the same on "
                  f"{os.cpu_count()} CPUs (factor: one CPU's time / all CPUs' time)")
            print(f"{'S':>7} {'transport':<9} {'all CPUs ms':>11} {'1 CPU ms':>9} {'factor':>7}")
        for s in SIZES:
            both = jobs.get((ps[0], tr), {}).get("allreduce", {}).get(s)
            single = one["allreduce"].get(s)
            if not both or not single:
                continue
            bad |= not single[2]
            f = single[0] / both[0]
            share[(tr, s)] = f
            print(f"{size_name(s):>7} {tr:<9} {both[0] * 1e3:>11.2f} {single[0] * 1e3:>9.2f} "
                  f"{f:>7.2f}")

    drops, retx, tmo = {}, {}, {}
    print()
    for p in ps:
        stats = device_stats(os.path.join(out, "jobs", f"{p}-xrnic.stat"))
        drops[p] = sum(x[1] for x in stats)
        retx[p] = sum(x[2] for x in stats)
        tmo[p] = sum(x[3] for x in stats)
        for name, d, r, t in stats:
            print(f"p={p} xrnic device {name}: kernel_rx_dropped {d}, retransmitted_packets {r}, "
                  f"local_ack_timeout_err {t}")
        if not stats and (p, "xrnic") in jobs:
            print(f"p={p} xrnic: no device stat snapshot", file=sys.stderr)
    # The one-CPU job's devices, summed: beside the others, not in the totals.
    one_cpu = {}
    if ps:
        stats = device_stats(os.path.join(out, "jobs", f"{ps[0]}-xrnic-1cpu.stat"))
        if stats:
            one_cpu = {"kernel_rx_dropped": sum(x[1] for x in stats),
                       "retransmitted_packets": sum(x[2] for x in stats),
                       "local_ack_timeouts": sum(x[3] for x in stats)}
            print(f"p={ps[0]} xrnic on one CPU, {len(stats)} devices: " +
                  ", ".join(f"{k} {v}" for k, v in one_cpu.items()))

    points = {}
    colours = {("xrnic", 2): "#1f77b4", ("xrnic", 4): "#17becf",
               ("tcp", 2): "#d62728", ("tcp", 4): "#ff7f0e"}
    for (p, tr, s), (t, model) in sorted(figures.items()):
        c = colours.get((tr, p), "black")
        points.setdefault((f"{tr} p={p}", False, c), []).append((s, t))
        points.setdefault((f"model {tr} p={p}", True, c), []).append((s, model))
    svg = os.path.join(out, "allreduce.svg")
    if svg_plot(points, svg, "MPI_Allreduce (Open MPI ring, UCX) over xrnic and kernel TCP"):
        print(f"\nplot: {svg}")

    def ratio(p, tr, s):
        f = figures.get((p, tr, s))
        return round(f[0] / f[1], 3) if f else None

    def over(p, s):
        a, b = figures.get((p, "xrnic", s)), figures.get((p, "tcp", s))
        return round(a[0] / b[0], 3) if a and b else None

    j = {}
    for p in ps:
        for tr in TRANSPORTS:
            job = jobs.get((p, tr))
            for k in ("bw", "bibw"):
                v = job.get(k) if job else None
                j[f"{tr}_{k}_gbps_p{p}"] = round(v * 8 / 1e9, 3) if v else None
    for p in ps:
        for s in SIZES:
            j[f"allreduce_ratio_p{p}_{size_key(s)}"] = ratio(p, "xrnic", s)
            j[f"tcp_ratio_p{p}_{size_key(s)}"] = ratio(p, "tcp", s)
            j[f"xrnic_over_tcp_p{p}_{size_key(s)}"] = over(p, s)
            f = figures.get((p, "xrnic", s))
            j[f"xrnic_ms_p{p}_{size_key(s)}"] = round(f[0] * 1e3, 3) if f else None
            f = figures.get((p, "tcp", s))
            j[f"tcp_ms_p{p}_{size_key(s)}"] = round(f[0] * 1e3, 3) if f else None
    for p in ps:
        j[f"kernel_rx_dropped_p{p}"] = drops.get(p)
        j[f"retransmitted_packets_p{p}"] = retx.get(p)
        j[f"local_ack_timeouts_p{p}"] = tmo.get(p)
    for (tr, s), f in share.items():
        j[f"core_sharing_factor_{tr}_{size_key(s)}"] = round(f, 3)
    for k, v in one_cpu.items():
        j[f"{k}_p{ps[0]}_1cpu"] = v
    j["kernel_rx_dropped"] = sum(drops.values())
    j["retransmitted_packets"] = sum(retx.values())
    j["results_ok"] = not bad
    print(json.dumps(j))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
