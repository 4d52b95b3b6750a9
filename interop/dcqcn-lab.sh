#!/usr/bin/env bash
# The DCQCN lab (docs/congestion.md): 2, 4 and 8 xrnic QPs through a real ECN-marking
# bottleneck, each count run once with DCQCN and once without, with figures checked
# against the goals.
#
#   interop/dcqcn-lab.sh [-o OUTDIR] [-D SECONDS] [--rate MBIT] [--cc-param N=V]...
#                        [--red "RED OPTIONS"] [--docs DIR] [--runs "dcqcn nodcqcn"]
#                        [--qps "2 4 8"] [--ceiling-qps "1"] [--mtu 1500|9000]
#                        [--ceiling-limit BYTES] [--perf "MORE xrnic perf OPTIONS"]   (both ends, e.g. "-m 2048")
#                        [--report-only]   (figures and plots again from OUTDIR, no runs)
#                        [--connectx-defaults]   (DCQCN as --dcqcn alone gives it)
#                        [--connectx-scaled]   (ConnectX's defaults scaled to the lab's RTT)
#
# Topology (everything inside the harness namespace of net.sh, nothing reaches outside):
#
#   ns snd: xrnic perf client ── br0 ── tap ─ eth0 ┐ qemu TCG guest: Linux bridge,    ┌ eth1 ─ tap ── br1 ── ns rcv: xrnic perf
#           (AF_XDP on veth eth0)                  └ htb rate 50mbit + red ... ecn ───┘ (egress toward the receiver)   server
#
# The host kernel has no sch_red; the guest's Debian 6.1 kernel has (docs/congestion.md). The
# switch scenario prints `tc -s qdisc` of eth1 every second on its console, so the script
# takes the queue's drops and marks before and after each run.
#
# First the lab's ceiling: CEILING_QPS QPs (1) without congestion control through a plain
# FIFO of the same rate (the sender's --tclass selects it by DSCP), which no DCQCN run can
# beat: when it is below the goal, the lab measures the guest forwarding, not DCQCN.
#
# Each run: the receiver `xrnic perf write --dcqcn --json` (its NP answers CE marks with
# CNPs in both runs); the sender `xrnic perf write -q 2 -D SECONDS --json --cc-log CSV`,
# with DCQCN (the lab's parameters below, plus any --cc-param) or with --no-dcqcn (data
# not ECN-capable: RED drops instead of marking). Writes OUTDIR/{dcqcn,nodcqcn}.{csv,svg,json}
# and OUTDIR/summary.txt; with --docs DIR also copies the CSVs, plots and summary there.
# Each run also writes OUTDIR/NAME.host.txt (the host's CPU counters and the switch qemu's
# CPU time around the client), from which the summary gives each run's host line.
#
# Goals with DCQCN, for every QP count (exit status 1 when one is missed): goodput of the
# QPs together ≥ 90 % of the bottleneck, Jain fairness ≥ 0.95, receiver np_cnp_sent > 0,
# sender rp_cnp_handled > 0, no retransmitted packet, and the DCQCN client completing.
# A client that fails (e.g. retry counter exceeded) is reported with the figures of its
# CSV.

set -euo pipefail
# shellcheck source=guest.sh
source "$(dirname "${BASH_SOURCE[0]}")/guest.sh"

OUT=target/dcqcn-lab
DURATION=10
RATE=50
# RED as a switch's ECN marking thresholds, scaled to 50 Mbit/s (docs/congestion.md):
# marking starts at 15 kB of average queue (2.4 ms, ~14 frames), reaches 20 % at 45 kB
# (7.2 ms); above that every ECN-capable packet is marked and every other one dropped;
# avpkt = one 1024-byte-MTU RoCE frame; the hard limit (400 kB, 64 ms) is a deep buffer,
# reached only when ECN-capable senders do not slow down (or by retransmission bursts).
RED_OPTS="limit 2000000 min 15000 max 45000 avpkt 4200 burst 6 probability 0.2"
# DCQCN for this network (docs/congestion.md, "The lab parameters", tuned with
# `xrnic sim --bottleneck-mbps 50`): the ConnectX defaults are made for µs round trips
# at 25-100 Gb/s; here the round trip is milliseconds and a fair share a few Mb/s. α
# updated every 5 ms with gain 16/1024, at most one cut per 5 ms of α/8 (rp_gd 13), the
# target clamped at every cut, an increase event every 3 ms with F = 5 fast-recovery
# rounds and +1 Mb/s steps, at most one CNP per QP per ms. --connectx-defaults runs the
# plain ConnectX parameters instead, --connectx-scaled ConnectX's with its timers scaled
# by the round-trip ratio and its byte counter by the BDP ratio; --cc-param adds to any.
LAB_CC="rp_dce_tcp_rtt=5000,rp_dce_tcp_g=16,rp_rate_reduce_monitor_period=5000,rp_gd=13"
LAB_CC+=",rp_time_reset=3000,rp_threshold=5,rp_ai_rate=1,rp_hai_rate=1,rp_clamp_tgt_rate=1"
LAB_CC+=",np_min_time_between_cnps=1000,rp_rate_to_set_on_first_cnp=25"
# ConnectX × 1000 in time (a 4 µs data-centre round trip against ~4 ms here), the byte
# counter × 1/2 (BDP 100 Gb/s × 4 µs = 50 kB against 50 Mb/s × 4 ms = 25 kB); the rates
# cannot scale down (1 Mb/s is the unit) and stay ConnectX's.
SCALED_CC="rp_time_reset=131071,rp_dce_tcp_rtt=1000,rp_rate_reduce_monitor_period=4000"
SCALED_CC+=",np_min_time_between_cnps=4000,rp_byte_reset=16384"
PROFILE=lab
QPS_LIST="2 4 8"
# The ceiling runs (no congestion control, no marking): the guest's port sends frames of
# this DSCP to a FIFO of the same rate whose limit holds a QP's whole window (128 PSNs of
# 1082-byte frames, 138 kB), so nothing is dropped and the link stays busy whenever the
# guest keeps up.
CEILING_QPS="1"
MTU=9000
PERF_OPTS=()
# Both ends of every run: the local ACK timeout 18 (1.07 s); the DCQCN and no-DCQCN runs
# keep two 16 KiB messages in flight per QP, the ceiling run eight of 64 KiB (a QP's
# whole 128-PSN window: never window-limited) (docs/congestion.md, "The lab's network").
LAB_PERF=(-u 18)
RUN_PERF=(-s 16384 -t 2)
CEIL_PERF=(-s 65536 -t 8)
CEIL_DSCP=8
CEIL_TOS=$(printf '0x%02x' $((CEIL_DSCP << 2)))
CEIL_LIMIT=2000000
# The switch's own address (on its bridge), for the host's counter requests.
SW_IP=192.0.2.250
CC_PARAMS=()
DOCS=
RUNS="dcqcn nodcqcn"
REPORT_ONLY=
XRNIC=${XRNIC:-}

usage() {
	sed -n '2,11p' "$0" >&2
	exit 2
}

while (($#)); do
	case $1 in
	-o) OUT=$2; shift 2 ;;
	-D) DURATION=$2; shift 2 ;;
	--rate) RATE=$2; shift 2 ;;
	--red) RED_OPTS=$2; shift 2 ;;
	--cc-param) CC_PARAMS+=(--cc-param "$2"); shift 2 ;;
	--docs) DOCS=$2; shift 2 ;;
	--runs) RUNS=$2; shift 2 ;;
	--report-only) REPORT_ONLY=1; shift ;;
	--connectx-defaults) LAB_CC=; PROFILE=connectx; shift ;;
	--connectx-scaled) LAB_CC=$SCALED_CC; PROFILE=connectx-scaled; shift ;;
	--qps) QPS_LIST=$2; shift 2 ;;
	--ceiling-qps) CEILING_QPS=$2; shift 2 ;;
	--mtu) MTU=$2; shift 2 ;;
	--ceiling-limit) CEIL_LIMIT=$2; shift 2 ;;
	--perf) read -ra PERF_OPTS <<<"$2"; shift 2 ;;
	-h | --help) usage ;;
	*) echo "dcqcn-lab: unknown option '$1'" >&2; usage ;;
	esac
done
if ! [[ $DURATION =~ ^[0-9]+$ ]] || ((DURATION < 8)); then
	xri_die "-D must be at least 8 seconds"
fi
[[ $RATE =~ ^[0-9]+$ ]] || xri_die "--rate takes Mbit/s as an integer"

[[ -n $LAB_CC ]] && CC_PARAMS=(--cc-param "$LAB_CC" "${CC_PARAMS[@]}")
xri_need_root
command -v python3 >/dev/null || xri_die "python3 is needed for the figures (apt-get install python3)"
if [[ -z $XRNIC ]]; then
	XRNIC=$XRI_DIR/../target/release/xrnic
fi
[[ -x $XRNIC ]] || xri_die "no xrnic binary at $XRNIC (cargo build --release, or set XRNIC)"
XRNIC=$(realpath "$XRNIC")
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
xri_trap_cleanup
T0=$(xri_now)
if [[ -n $REPORT_ONLY ]]; then
	RUNS=
else
	xri_guest_init
fi

if [[ -z $REPORT_ONLY ]]; then
# --- the switch: a guest bridging its two NICs, the bottleneck on eth1's egress ---------
SCN=$OUT/switch.sh
cat >"$SCN" <<EOF
#!/bin/sh
# DCQCN lab switch (generated by interop/dcqcn-lab.sh).
# iproute2's ip and tc, not busybox's applets.
. /usr/lib/xr-funcs.sh
set -e
ip addr flush dev eth0
ip link set eth1 mtu "\$XR_MTU" up
ip link add br0 type bridge stp_state 0 forward_delay 0
ip link set eth0 master br0
ip link set eth1 master br0
ip link set br0 up
# The address only answers the host's pings that ask for the queue's counters (below).
ip addr add $SW_IP/24 dev br0
tc qdisc add dev eth1 root handle 1: htb default 1
tc class add dev eth1 parent 1: classid 1:1 htb rate ${RATE}mbit ceil ${RATE}mbit
tc qdisc add dev eth1 parent 1:1 handle 10: red $RED_OPTS bandwidth ${RATE}mbit ecn
# The ceiling runs' port: the same rate, a plain FIFO (no marking, no early drop), for
# frames of DSCP $CEIL_DSCP (IPv4 TOS byte $CEIL_TOS, the sender's --tclass).
tc class add dev eth1 parent 1: classid 1:2 htb rate ${RATE}mbit ceil ${RATE}mbit
tc qdisc add dev eth1 parent 1:2 handle 20: bfifo limit $CEIL_LIMIT
tc filter add dev eth1 parent 1: protocol ip prio 1 u32 match ip tos $CEIL_TOS 0xfc flowid 1:2
# xrnic perf's TCP exchange (not measured) too: behind the RoCE queue RED drops every
# Not-ECT packet once the average passes max, which starved the exchange after an 8-QP run.
tc filter add dev eth1 parent 1: protocol ip prio 2 u32 match ip protocol 6 0xff flowid 1:2
tc -d qdisc show dev eth1
echo "clocksource: \$(cat /sys/devices/system/clocksource/clocksource0/current_clocksource) of \$(cat /sys/devices/system/clocksource/clocksource0/available_clocksource)"
echo XR-LAB-READY
set +e
# The queue's counters, printed when the host asks (a ping to $SW_IP: ICMP InEchos rises),
# not on a clock: running tc under TCG stalls the guest's forwarding for 50-150 ms, which
# a print every second turned into dips of the link every second (the ceiling runs).
# Only shell builtins between prints.
echos() {
	while read -r k a b c d e f g h i rest; do
		[ "\$k" = Icmp: ] && v=\$i
	done </proc/net/snmp
}
n=0
seen=
while :; do
	echos
	if [ "\$v" != "\$seen" ]; then
		seen=\$v
		echo "XR-QDISC-BEGIN \$n"
		tc -s qdisc show dev eth1
		echo "XR-QDISC-END \$n"
		n=\$((n + 1))
	fi
	sleep 1
done
EOF

xri_net_create "$MTU"
xri_ns ip link add br1 mtu "$MTU" type bridge stp_state 0 forward_delay 0 mcast_snooping 0
xri_ns ip link set br1 up
xri_net_add_tap lab0 "$MTU"
XRI_BR=br1 xri_net_add_tap lab1 "$MTU"
xri_net_add_veth snd "$MTU" 192.0.2.1/24 fd00::1/64
XRI_BR=br1 xri_net_add_veth rcv "$MTU" 192.0.2.2/24 fd00::2/64
SND=(ip netns exec "$XRI_NS-snd")
RCV=(ip netns exec "$XRI_NS-rcv")

NRUNS=$(($(wc -w <<<"$QPS_LIST") * $(wc -w <<<"$RUNS") + $(wc -w <<<"$CEILING_QPS")))
GUEST_TIMEOUT=$((NRUNS * (DURATION + 30) + 240))
xri_log "booting the switch guest (qemu TCG)"
# The HPET clocksource: with the guest's default (TSC) under TCG on a loaded host, htb's
# timers fire late and the port stops for up to ~0.7 s at a time (the ceiling runs
# reached 56-75 % of the rate with it, 94 % with the HPET).
XRI_GUEST_APPEND="${XRI_GUEST_APPEND:-clocksource=hpet}"
xri_guest_start sw lab0,lab1 192.0.2.250/24 fd00::250/64 "$MTU" "$SCN" "$OUT" "$GUEST_TIMEOUT"
# A busy host (other builds) must not make the TCG guest or the xrnic drivers the
# bottleneck: both run at a higher priority than ordinary work (XRI_LAB_NICE, -10).
LAB_NICE=${XRI_LAB_NICE:--10}
qpid=
for _ in $(seq 50); do
	# The qemu process itself, not `timeout` or `ip netns exec` in front of it.
	for p in $(pgrep -f -- "-initrd $OUT/sw.initrd" || true); do
		[[ $(cat "/proc/$p/comm" 2>/dev/null) == qemu-system-* ]] && qpid=$p
	done
	[[ -n $qpid ]] && break
	sleep 0.1
done
[[ -n $qpid ]] || xri_die "the switch guest's qemu did not start"
# Every thread of qemu (the TCG vCPU runs in its own).
for t in /proc/"$qpid"/task/*; do
	renice -n "$LAB_NICE" -p "${t##*/}" >/dev/null
done
if ! xri_guest_wait sw '^XR-LAB-READY' 120; then
	cat "${XRI_GUEST_LOG[sw]}" >&2
	xri_die "the switch guest did not come up"
fi
"${SND[@]}" ping -c 3 -W 5 192.0.2.2 >/dev/null || xri_die "no path through the switch guest"

# qdisc_block: the newest complete `tc -s qdisc` block of the guest's console.
qdisc_block() {
	awk '/^XR-QDISC-BEGIN/ { b = "" ; inb = 1; next }
		/^XR-QDISC-END/ { last = b; inb = 0; next }
		inb { b = b $0 "\n" }
		END { printf "%s", last }' "${XRI_GUEST_LOG[sw]}"
}
# A block printed after now: a ping asks the guest for one (waits up to 5 s).
fresh_qdisc_block() {
	local n
	n=$(grep -ac '^XR-QDISC-END' "${XRI_GUEST_LOG[sw]}" || true)
	"${SND[@]}" ping -c 1 -W 2 "$SW_IP" >/dev/null 2>&1 || true
	for _ in $(seq 50); do
		(($(grep -ac '^XR-QDISC-END' "${XRI_GUEST_LOG[sw]}" || true) > n)) && break
		sleep 0.1
	done
	qdisc_block
}

fi

PORT=18515
# host_snap: the wall clock, the host's CPU counters (/proc/stat's cpu line), the switch
# qemu's CPU time (utime and stime of /proc/PID/stat, in clock ticks) and the load
# average, one line. Taken around each client, so that the summary says whether the host
# had CPU to spare for the guest during that run (other work, a hypervisor's steal).
host_snap() {
	local q
	q=$(awk '{ sub(/^.*\) /, ""); print $12, $13 }' "/proc/$qpid/stat" 2>/dev/null || echo "0 0")
	echo "$(date +%s.%N) $(getconf CLK_TCK) $(nproc) $(head -1 /proc/stat) qemu $q load $(cut -d' ' -f1 /proc/loadavg)"
}
# run NAME QPS SENDER-CC-OPTIONS...
run() {
	local name=$1 qps=$2
	local sizes=("${RUN_PERF[@]}")
	[[ $name == ceiling-* ]] && sizes=("${CEIL_PERF[@]}")
	shift 2
	local before after rpid rc=0
	before=$(fresh_qdisc_block)
	"${RCV[@]}" nice -n "$LAB_NICE" "$XRNIC" perf write --netdev eth0 --dcqcn "${CC_PARAMS[@]}" --json --no-stat \
		-q "$qps" -D "$DURATION" -p "$PORT" "${LAB_PERF[@]}" "${sizes[@]}" "${PERF_OPTS[@]}" >"$OUT/$name.server.out" 2>&1 &
	rpid=$!
	xri_on_exit xri_kill_pid "$rpid"
	# The server is ready once it listens.
	for _ in $(seq 100); do
		"${RCV[@]}" ss -ltn "sport = :$PORT" | grep -q LISTEN && break
		sleep 0.1
	done
	xri_log "run $name: xrnic perf write -q $qps -D $DURATION ${LAB_PERF[*]} ${sizes[*]} ${PERF_OPTS[*]} $*"
	host_snap >"$OUT/$name.host.txt"
	"${SND[@]}" nice -n "$LAB_NICE" "$XRNIC" perf write --netdev eth0 -q "$qps" -D "$DURATION" --json --no-stat \
		-p "$PORT" --cc-log "$OUT/$name.csv" --cc-log-interval 50 "${LAB_PERF[@]}" "${sizes[@]}" "${PERF_OPTS[@]}" "$@" 192.0.2.2 \
		>"$OUT/$name.client.out" 2>&1 || rc=$?
	xri_log "run $name: the client exited (status $rc)"
	host_snap >>"$OUT/$name.host.txt"
	xri_wait_pid "$rpid" 30 || xri_kill_pid "$rpid"
	after=$(fresh_qdisc_block)
	printf '%s\n' "$before" >"$OUT/$name.qdisc-before.txt"
	printf '%s\n' "$after" >"$OUT/$name.qdisc-after.txt"
	if ((rc != 0)); then
		cat "$OUT/$name.client.out" >&2
		xri_log "run $name: the client failed (status $rc)"
	fi
	tail -1 "$OUT/$name.client.out" >"$OUT/$name.client.json" || true
	tail -1 "$OUT/$name.server.out" >"$OUT/$name.server.json" || true
	PORT=$((PORT + 1))
	return 0
}

for q in $CEILING_QPS; do
	[[ $q =~ ^[0-9]+$ ]] && ((q >= 1)) || xri_die "--ceiling-qps takes QP counts, not '$q'"
	[[ -z $REPORT_ONLY ]] && run "ceiling-q$q" "$q" --no-dcqcn --tclass $((CEIL_DSCP << 2))
done
for q in $QPS_LIST; do
	[[ $q =~ ^[0-9]+$ ]] && ((q >= 1)) || xri_die "--qps takes QP counts, not '$q'"
	for r in $RUNS; do
		case $r in
		dcqcn) run "dcqcn-q$q" "$q" --dcqcn "${CC_PARAMS[@]}" ;;
		nodcqcn) run "nodcqcn-q$q" "$q" --no-dcqcn ;;
		*) xri_die "--runs takes dcqcn and/or nodcqcn, not '$r'" ;;
		esac
	done
done

for q in $QPS_LIST; do
	for base in dcqcn nodcqcn; do
		name=$base-q$q
		[[ -s $OUT/$name.csv ]] || continue
		if [[ $base == nodcqcn ]]; then
			title="without DCQCN"
		else
			title="with DCQCN ($PROFILE parameters)"
		fi
		"$XRNIC" plot "$OUT/$name.csv" -o "$OUT/$name.svg" --bottleneck-mbps "$RATE" \
			--title "$title: $q QPs, RDMA WRITE through htb ${RATE}mbit + red ecn" ||
			xri_log "plot of $name failed"
	done
done

rc=0
CC_TEXT="ConnectX defaults"
((${#CC_PARAMS[@]})) && CC_TEXT="ConnectX defaults with ${CC_PARAMS[*]}"
python3 - "$OUT" "$RATE" "$DURATION" "$CC_TEXT" "$QPS_LIST" "$CEILING_QPS" >"$OUT/summary.txt" <<'PY' || rc=$?
import json, re, sys
out, rate, duration = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
qps_list = sys.argv[5].split()
ceiling_qps = sys.argv[6].split()

def load(path):
    try:
        with open(path) as f:
            return json.loads(f.read().strip() or "null")
    except (OSError, ValueError):
        return None

def qdisc(path):
    """Per qdisc kind: sent packets, dropped, and red's marked/early/pdrop."""
    r = {}
    kind = None
    for line in open(path):
        m = re.match(r"qdisc (\w+)", line)
        if m:
            kind = m.group(1)
            r[kind] = {}
        elif kind:
            m = re.search(r"Sent (\d+) bytes (\d+) pkt \(dropped (\d+), overlimits (\d+)", line)
            if m:
                r[kind].update(bytes=int(m.group(1)), pkts=int(m.group(2)), dropped=int(m.group(3)))
            m = re.search(r"marked (\d+) early (\d+) pdrop (\d+)", line)
            if m:
                r[kind].update(marked=int(m.group(1)), early=int(m.group(2)), pdrop=int(m.group(3)))
    return r

def delta(a, b):
    return {k: {f: b[k].get(f, 0) - a.get(k, {}).get(f, 0) for f in b[k]} for k in b}

def from_csv(path, duration):
    """Goodput per QP over perf's sampling window (the middle half) and the last
    retransmission counts, from the --cc-log CSV (for a client that failed)."""
    rows = {}
    try:
        for line in list(open(path))[1:]:
            f = line.strip().split(",")
            rows.setdefault(int(f[1]), []).append((float(f[0]), int(f[6]), int(f[7])))
    except (OSError, ValueError, IndexError):
        return None
    lo, hi = duration / 4, duration * 3 / 4
    bw, retrans = [], 0
    for q in sorted(rows):
        r = rows[q]
        def at(t):
            return max((x for x in r if x[0] <= t), default=r[0])
        a, b = at(lo), at(hi)
        bw.append((b[1] - a[1]) * 8 / max(b[0] - a[0], 1e-9) / 1e6)
        retrans += r[-1][2]
    return bw, retrans

def host(name):
    """The host during a run (host_snap before and after the client): its CPUs' busy
    share, the share of work at nice > 0 (other builds) and of steal, the switch qemu's
    CPU in % of one CPU, the load average at the end."""
    try:
        a, b = (l.split() for l in open(f"{out}/{name}.host.txt"))
        wall = float(b[0]) - float(a[0])
        tck, ncpu = float(b[1]), int(b[2])
        # cpu user nice system idle iowait irq softirq steal ...
        ca, cb = [int(x) for x in a[4:12]], [int(x) for x in b[4:12]]
        d = [y - x for x, y in zip(ca, cb)]
        total = max(sum(d), 1)
        qa, qb = a.index("qemu"), b.index("qemu")
        qemu = (int(b[qb + 1]) + int(b[qb + 2]) - int(a[qa + 1]) - int(a[qa + 2])) / tck / max(wall, 1e-9)
        return (f"host {ncpu} CPUs {100 * (total - d[3] - d[4]) / total:.0f} % busy"
                f" (nice > 0 {100 * d[1] / total:.0f} %, steal {100 * d[7] / total:.0f} %),"
                f" load {b[b.index('load') + 1]}, switch qemu {100 * qemu:.0f} % of a CPU")
    except (OSError, ValueError, IndexError):
        return "host: no figures"

def error_line(path):
    try:
        return next((l.strip() for l in open(path) if l.startswith("xrnic perf:")), "")
    except OSError:
        return ""

def figures(name):
    c, s = load(f"{out}/{name}.client.json"), load(f"{out}/{name}.server.json")
    try:
        q = delta(qdisc(f"{out}/{name}.qdisc-before.txt"), qdisc(f"{out}/{name}.qdisc-after.txt"))
    except OSError:
        return None
    failed = error_line(f"{out}/{name}.client.out")
    if c:
        bw = [x["bw_avg_gbps"] * 1000 for x in c["qps"]]
        dev = c["counters"]["device"]
        retrans, timeouts = dev["qp"]["retransmitted_packets"], dev["qp"]["local_ack_timeout_err"]
        handled = dev["rp_cnp_handled"]
    else:
        # The client failed (e.g. retry counter exceeded): its CSV has what happened.
        got = from_csv(f"{out}/{name}.csv", duration)
        if got is None:
            return None
        bw, retrans = got
        timeouts, handled = "?", 0
    jain = sum(bw) ** 2 / (len(bw) * sum(x * x for x in bw)) if any(bw) else 0.0
    return dict(
        goodput=sum(bw), per_qp=bw, jain=jain, retrans=retrans, timeouts=timeouts,
        rp_cnp_handled=handled, failed=failed,
        np_cnp_sent=(s or {}).get("counters", {}).get("device", {}).get("np_cnp_sent", 0),
        red=q.get("red", {}), htb=q.get("htb", {}), fifo=q.get("bfifo", {}),
    )

def row(res, label, f):
    cells = [f(res[n]) if res[n] else "failed" for n in ("dcqcn", "nodcqcn")]
    print(f"{label:28}{cells[0]:>16}{cells[1]:>16}")

goals = []
print(f"DCQCN lab: RDMA WRITE 16 KiB x 2 per QP through htb {rate:g} Mbit/s + red ecn, {duration:g} s runs")
print(f"DCQCN: {sys.argv[4]}")
ceiling = None
for nq in ceiling_qps:
    c = figures(f"ceiling-q{nq}")
    print()
    print(f"Ceiling: {nq} QP(s) without congestion control through a FIFO of the same rate")
    if c is None:
        print("  no figures (the run did not take place or left nothing)")
        goals.append((f"ceiling, {nq} QPs: the run completed", False))
        continue
    print(f"  goodput {c['goodput']:.1f} Mb/s ({100 * c['goodput'] / rate:.1f} % of the bottleneck),"
          f" retransmitted {c['retrans']}, FIFO drops {c['fifo'].get('dropped', '?')},"
          f" forwarded {c['htb'].get('pkts', '?')} packets")
    print(f"  {host(f'ceiling-q{nq}')}")
    if c["failed"]:
        print(f"  (the client failed: {c['failed']})")
    ceiling = c["goodput"] if ceiling is None else max(ceiling, c["goodput"])
    # Not a DCQCN goal but the condition for the others to mean anything: below it the
    # lab measures how fast the TCG guest forwards.
    goals.append((f"ceiling, {nq} QPs without congestion control: >= 90 % of {rate:g} Mb/s"
                  f" ({100 * c['goodput'] / rate:.1f} %)", c["goodput"] >= 0.9 * rate))
for nq in qps_list:
    res = {b: figures(f"{b}-q{nq}") for b in ("dcqcn", "nodcqcn")}
    print()
    print(f"{nq} QPs{'':23}{'with DCQCN':>16}{'without DCQCN':>16}")
    row(res, "goodput, all QPs (Mb/s)", lambda r: f"{r['goodput']:.1f}")
    row(res, "  of the bottleneck", lambda r: f"{100 * r['goodput'] / rate:.1f} %")
    if ceiling:
        # The same run's ceiling as the baseline: what the emulated switch let through.
        row(res, "  of the ceiling", lambda r: f"{100 * r['goodput'] / ceiling:.1f} %")
    row(res, "goodput per QP (Mb/s)", lambda r: " / ".join(f"{x:.1f}" for x in r["per_qp"])[:15])
    row(res, "Jain fairness", lambda r: f"{r['jain']:.3f}")
    row(res, "retransmitted packets", lambda r: str(r["retrans"]))
    row(res, "ACK timeouts", lambda r: str(r["timeouts"]))
    row(res, "receiver np_cnp_sent", lambda r: str(r["np_cnp_sent"]))
    row(res, "sender rp_cnp_handled", lambda r: str(r["rp_cnp_handled"]))
    row(res, "switch: red marked CE", lambda r: str(r["red"].get("marked", "?")))
    row(res, "switch: red early drops", lambda r: str(r["red"].get("early", "?")))
    row(res, "switch: red tail drops", lambda r: str(r["red"].get("pdrop", "?")))
    row(res, "switch: packets forwarded", lambda r: str(r["htb"].get("pkts", "?")))
    for n in ("dcqcn", "nodcqcn"):
        if res[n]:
            print(f"{n}: {host(f'{n}-q{nq}')}")
    for n in ("dcqcn", "nodcqcn"):
        if res[n] and res[n]["failed"]:
            print(f"({n}: the client failed: {res[n]['failed']}; its figures come from its CSV)")
    d = res["dcqcn"]
    if d is None:
        goals.append((f"{nq} QPs: the DCQCN run completed", False))
        continue
    goals += [
        (f"{nq} QPs: goodput >= 90 % of {rate:g} Mb/s ({100 * d['goodput'] / rate:.1f} %)",
         d["goodput"] >= 0.9 * rate),
        (f"{nq} QPs: Jain fairness >= 0.95 ({d['jain']:.3f})", d["jain"] >= 0.95),
        (f"{nq} QPs: CNPs sent and handled", d["np_cnp_sent"] > 0 and d["rp_cnp_handled"] > 0),
        (f"{nq} QPs: no retransmission ({d['retrans']})", d["retrans"] == 0),
        (f"{nq} QPs: the DCQCN client completed", not d["failed"]),
    ]
print()
for g, ok in goals:
    print(f"  {'ok  ' if ok else 'MISS'} {g}")
sys.exit(0 if all(ok for _, ok in goals) else 1)
PY
cat "$OUT/summary.txt"
xri_log "lab done in $(xri_elapsed "$T0") s; results in $OUT"
if [[ -n $DOCS ]]; then
	mkdir -p "$DOCS"
	for f in "$OUT"/dcqcn-q*.csv "$OUT"/dcqcn-q*.svg "$OUT"/nodcqcn-q*.csv "$OUT"/nodcqcn-q*.svg "$OUT"/summary.txt; do
		[[ -f $f ]] && cp "$f" "$DOCS/dcqcn-lab-${f##*/}"
	done
fi
exit "$rc"
