#!/usr/bin/env bash
# rxe against xrnic on equal ground: the same stock perftest binaries in the same pair of
# TCG guests, on the same virtio NICs, first over rxe0 (the kernel's Soft-RoCE), then
# over xrnic through its drop-in libibverbs.so.1 (`xrnic exec`, xrnic on the guest's eth0
# over AF_XDP), interleaved in rounds. One boot of the two guests runs everything.
#
#   interop/bench-rxe.sh [-o OUTDIR] [-r ROUNDS]
#     -o OUTDIR  where the consoles, tables, CSV, SVG and report go (default
#                interop/out/bench-rxe-DATE)
#     -r ROUNDS  interleaved rounds (default $XRI_BENCH_ROUNDS or 2); each figure keeps its
#                best round (bandwidth: the highest, latency: the lowest t_typical)
#     -a         no run: analyse again the consoles an earlier run left in OUTDIR
#
# Each round runs, over rxe then over xrnic: ib_write_bw, ib_read_bw, ib_send_bw at 64 KiB
# for XRI_BENCH_SECONDS (default 3, perftest -D) and as a size sweep (-a, XRI_BENCH_SWEEP_ITERS
# iterations per size, default 20), ib_write_lat and ib_send_lat at 64 B
# (XRI_BENCH_LAT_ITERS, default 500). Guest A (192.0.2.11) serves, guest B (192.0.2.12)
# is the client; every run has a TCP port of its own, so a late or failed run cannot meet
# the next one's peer.
# Knobs: XRI_BENCH_MTU (link MTU, 1500 or 9000; default 1500: Debian 6.1's virtio_net
# refuses native XDP at 9000, docs/interop.md), XRI_GUEST_MEM (MiB, default 1024 here),
# XRNIC_RELEASE (directory with the release xrnic and libibverbs.so; default
# target/release, made by `make verbs-lib`).
# Prints the tables side by side, writes bw-vs-size.svg (xrnic plot-sweep), and ends with
# one JSON line (the figures, ratios xrnic / rxe). Exit status 0 when every run succeeded.

set -euo pipefail
# shellcheck source=guest.sh
source "$(dirname "${BASH_SOURCE[0]}")/guest.sh"

A_IP4=192.0.2.11/24 A_IP6=fd00::11/64
B_IP4=192.0.2.12/24 B_IP6=fd00::12/64
ROUNDS=${XRI_BENCH_ROUNDS:-2}
SECONDS_64K=${XRI_BENCH_SECONDS:-3}
SWEEP_ITERS=${XRI_BENCH_SWEEP_ITERS:-20}
LAT_ITERS=${XRI_BENCH_LAT_ITERS:-500}
MTU=${XRI_BENCH_MTU:-1500}
RUN_TIMEOUT=${XRI_BENCH_RUN_TIMEOUT:-240}
export XRI_GUEST_MEM=${XRI_GUEST_MEM:-1024}

usage() {
	sed -n '2,26s/^# \{0,1\}//p' "$0" >&2
	exit 2
}
OUT=
ANALYSE=
while getopts "o:r:ah" opt; do
	case $opt in
	o) OUT=$OPTARG ;;
	r) ROUNDS=$OPTARG ;;
	a) ANALYSE=1 ;;
	*) usage ;;
	esac
done
[[ $ROUNDS =~ ^[1-9][0-9]*$ ]] || xri_die "rounds must be a positive number, not '$ROUNDS'"
xri_check_mtu "$MTU"

xri_need_root
xri_trap_cleanup
T_START=$(xri_now)
OUT=${OUT:-$XRI_DIR/out/bench-rxe-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# The tests of one round, in order: name | tool | options (both sides).
TESTS=(
	"write_64k|ib_write_bw|-s 65536 -D $SECONDS_64K"
	"read_64k|ib_read_bw|-s 65536 -D $SECONDS_64K"
	"send_64k|ib_send_bw|-s 65536 -D $SECONDS_64K"
	"write_lat|ib_write_lat|-s 64 -n $LAT_ITERS"
	"send_lat|ib_send_lat|-s 64 -n $LAT_ITERS"
	"write_sweep|ib_write_bw|-a -n $SWEEP_ITERS"
	"read_sweep|ib_read_bw|-a -n $SWEEP_ITERS"
	"send_sweep|ib_send_bw|-a -n $SWEEP_ITERS"
)

# Boot the guests and run the plan (not with -a).
run_guests() {
	REL=${XRNIC_RELEASE:-$XRI_DIR/../target/release}
	for f in xrnic libibverbs.so; do
		[[ -f $REL/$f ]] || xri_die "$REL/$f missing: run \`make verbs-lib\` first"
	done
	REL=$(cd "$REL" && pwd)


	xri_guest_init
	xri_log "kernel $XRI_KVER, base image $(basename "$XRI_BASE"), xrnic from $REL, MTU $MTU, $ROUNDS rounds, output in $OUT"

	# xrnic (release) in the guests: /usr/bin/xrnic, its library in /usr/lib/xrnic (the
	# --lib of xrnic exec), and whatever libraries ldd lists that the base image lacks.
	stage=$(mktemp -d /tmp/xri-bench.XXXXXX)
	xri_on_exit rm -rf "$stage"
	mkdir -p "$stage/usr/bin" "$stage/usr/lib/xrnic" "$stage/usr/lib/x86_64-linux-gnu"
	objcopy --strip-debug "$REL/xrnic" "$stage/usr/bin/xrnic"
	objcopy --strip-debug "$REL/libibverbs.so" "$stage/usr/lib/xrnic/libibverbs.so.1"
	base_files=$(zcat "$XRI_BASE" | cpio -t --quiet 2>/dev/null)
	for lib in $(ldd "$REL/xrnic" "$REL/libibverbs.so" | awk '$3 ~ /^\// { print $3 }' | sort -u); do
		name=$(basename "$lib")
		[[ $name == libibverbs.so.1 ]] && continue
		grep -q "/$name\$" <<<"$base_files" || cp -L "$lib" "$stage/usr/lib/x86_64-linux-gnu/$name"
	done
	# Files, and the one directory the base image lacks (the kernel's unpacker makes no parent
	# directories; an entry for a directory the base has would replace it, e.g. the /lib link).
	(cd "$stage" && find . -path ./usr/lib/xrnic -o -type f | cpio -o -H newc --quiet -R 0:0) >"$OUT/extra.cpio"
	export XRI_GUEST_EXTRA=$OUT/extra.cpio

	xri_net_create "$MTU"
	xri_net_add_tap tapA "$MTU"
	xri_net_add_tap tapB "$MTU"

	# The plan: one line per run, "ID|STACK|TEST|TOOL|OPTIONS", rounds interleaved, within a
	# round rxe then xrnic for each test.
	PLAN=()
	id=0
	for ((r = 1; r <= ROUNDS; r++)); do
		for t in "${TESTS[@]}"; do
			IFS='|' read -r test tool opts <<<"$t"
			for stack in rxe xrnic; do
				PLAN+=("$id|$stack|$r|$test|$tool|$opts")
				id=$((id + 1))
			done
		done
	done
	printf '%s\n' "${PLAN[@]}" >"$OUT/plan.txt"

	# write_guest FILE ROLE: the /scenario.sh of the server (A) or the client (B).
	write_guest() {
		local file=$1 role=$2 e pid stack r test tool opts dev gid cmd port
		# shellcheck disable=SC2016  # expanded in the guest
		{
			echo '. /usr/lib/xr-funcs.sh'
			echo "XR_PEER4=${A_IP4%/*}"
			# A late server is waited for longer than between the boots.
			echo 'XR_RETRIES=120'
			echo 'fails=0'
			echo 'bench() {'
			echo '	id=$1; shift'
			echo '	echo "XR-BENCH $id start"'
			# The guest CPU's time split over the run (/proc/stat's cpu line before and after)
			# and, for xrnic, the device's counters when perftest closes it
			# (XRNIC_FINAL_STAT_DIR, docs/observability.md): where the run's time went.
			echo '	echo "xr-cpu $id before $(head -1 /proc/stat)"'
			echo '	rm -rf /tmp/st; mkdir -p /tmp/st'
			if [[ $role == server ]]; then
				echo "	timeout $RUN_TIMEOUT \"\$@\" >/tmp/b.out 2>&1"
			else
				echo "	xr_client timeout $RUN_TIMEOUT \"\$@\" >/tmp/b.out 2>&1"
			fi
			echo '	rc=$?'
			echo '	echo "xr-cpu $id after $(head -1 /proc/stat)"'
			echo '	for f in /tmp/st/*.json; do [ -f "$f" ] && echo "xr-stat $id $(tr -d "\n" <"$f")"; done'
			echo '	sed "s/^/xr-b $id /" /tmp/b.out'
			echo '	echo "XR-BENCH $id rc=$rc"'
			echo '	[ $rc = 0 ] || fails=$((fails + 1))'
			echo '}'
			echo 'echo "XR-SERVER-START bench"'
			echo 'xrnic devinfo --netdev eth0 | sed "s/^/xr-devinfo /"'
			for e in "${PLAN[@]}"; do
				IFS='|' read -r pid stack r test tool opts <<<"$e"
				port=$((20000 + pid))
				if [[ $stack == rxe ]]; then
					cmd="/usr/bin/$tool -d rxe0 -x \$XR_GID4"
				else
					# xrnic's GID 1 is the IPv4-mapped one.
					cmd="env XRNIC_FINAL_STAT_DIR=/tmp/st xrnic exec --in-process --lib /usr/lib/xrnic --netdev eth0 -- /usr/bin/$tool -d xrnic_eth0 -x 1"
				fi
				cmd+=" -F -p $port $opts"
				case $tool in *_bw) cmd+=" --report_gbits" ;; esac
				[[ $role == client ]] && cmd+=" \$XR_PEER4"
				echo "bench $pid $cmd"
			done
			echo 'echo "xr: $fails runs failed"'
			echo '[ $fails = 0 ]'
		} >"$file"
	}
	write_guest "$OUT/server.sh" server
	write_guest "$OUT/client.sh" client

	# The whole plan's time bound inside the guests.
	GUEST_TIMEOUT=$((${#PLAN[@]} * RUN_TIMEOUT / 2 + 300))
	xri_guest_start A tapA "$A_IP4" "$A_IP6" "$MTU" "$OUT/server.sh" "$OUT" "$GUEST_TIMEOUT"
	xri_guest_start B tapB "$B_IP4" "$B_IP6" "$MTU" "$OUT/client.sh" "$OUT" "$GUEST_TIMEOUT"
	xri_log "${#PLAN[@]} runs in guests A and B (at most $GUEST_TIMEOUT s); consoles $OUT/A.console, $OUT/B.console"
	ok=1
	if xri_guest_finish B $((GUEST_TIMEOUT + 90)); then
		xri_guest_finish A 60 || ok=0
	else
		ok=0
		xri_guest_finish A 10 || true
	fi
	rm -f "$OUT"/*.initrd
}
if [[ -n $ANALYSE ]]; then
	[[ -f $OUT/plan.txt && -f $OUT/A.console && -f $OUT/B.console ]] ||
		xri_die "-a: $OUT holds no plan.txt, A.console and B.console of an earlier run"
	mapfile -t PLAN <"$OUT/plan.txt"
	ROUNDS=$(cut -d"|" -f3 "$OUT/plan.txt" | sort -n | tail -1)
	ok=1
else
	run_guests
fi
for g in A B; do
	tr -d '\r' <"$OUT/$g.console" >"$OUT/$g.txt"
done
secs="$(xri_elapsed "$T_START") s"
[[ -z $ANALYSE ]] || secs="analysed again from the consoles"

# out_of GUEST ID: that run's output in guest A or B.
out_of() { sed -n "s/^xr-b $2 //p" "$OUT/$1.txt"; }
# rc_of GUEST ID: that run's exit status ("none" when it never ended).
rc_of() {
	local l
	l=$(grep -m1 "^XR-BENCH $2 rc=" "$OUT/$1.txt") || { echo none; return; }
	echo "${l##*rc=}"
}
# rows FILE: perftest's table rows (the lines after #bytes that start with two numbers).
rows() {
	awk '/^ *#bytes/ { t = 1; next } t && $1 ~ /^[0-9]+$/ && $2 ~ /^[0-9]+$/ { print }' "$1"
}

# Per run: the client's table (B); the figure is BW average (Gb/s, column 4) at 65536 or
# t_typical (us, column 5) for the latency tests.
FAILED=0
declare -A BEST=()
echo "stack,test,round,bytes,gbps" >"$OUT/sweep.csv"
for e in "${PLAN[@]}"; do
	IFS='|' read -r pid stack r test tool opts <<<"$e"
	out_of B "$pid" >"$OUT/$pid-$stack-$test-r$r.client.txt"
	out_of A "$pid" >"$OUT/$pid-$stack-$test-r$r.server.txt"
	rca=$(rc_of A "$pid") rcb=$(rc_of B "$pid")
	rows "$OUT/$pid-$stack-$test-r$r.client.txt" >"$OUT/$pid.rows"
	# A sweep's rows count up to where it stopped, even when it failed.
	if [[ $test == *_sweep ]]; then
		awk -v s="$stack" -v t="${test%_sweep}" -v r="$r" '{ printf "%s,%s,%s,%s,%s\n", s, t, r, $1, $4 }' \
			"$OUT/$pid.rows" >>"$OUT/sweep.csv"
	fi
	if [[ $rca != 0 || $rcb != 0 || ! -s $OUT/$pid.rows ]]; then
		FAILED=$((FAILED + 1))
		xri_log "FAILED: run $pid ($stack $test round $r): server rc=$rca, client rc=$rcb"
		for side in server client; do
			echo "---- last lines of $OUT/$pid-$stack-$test-r$r.$side.txt ----" >&2
			tail -n 20 "$OUT/$pid-$stack-$test-r$r.$side.txt" >&2 || true
		done
		rm -f "$OUT/$pid.rows"
		continue
	fi
	case $test in
	*_sweep) ;;
	*_lat)
		v=$(awk 'NR == 1 { print $5 }' "$OUT/$pid.rows")
		k=$stack/$test
		if [[ -z ${BEST[$k]:-} ]] || awk -v a="$v" -v b="${BEST[$k]}" 'BEGIN { exit !(a < b) }'; then
			BEST[$k]=$v
		fi
		;;
	*)
		v=$(awk '$1 == 65536 { print $4; exit }' "$OUT/$pid.rows")
		k=$stack/$test
		if [[ -z ${BEST[$k]:-} ]] || awk -v a="$v" -v b="${BEST[$k]}" 'BEGIN { exit !(a > b) }'; then
			BEST[$k]=$v
		fi
		;;
	esac
	rm -f "$OUT/$pid.rows"
done

# Where each run's time went: the guest CPU's split over the run (user, system, softirq,
# idle, from /proc/stat; rxe's work is system and softirq time, xrnic's mostly user) in
# the server (A) and the client (B) guest, and for xrnic the counters of both devices at
# close (xr-stat lines: docs/observability.md names each counter).
python3 - "$OUT" >"$OUT/where.txt" <<'PY' || xri_log "the per-run CPU and counter table failed"
import json, sys
out = sys.argv[1]
plan = [l.rstrip("\n").split("|") for l in open(f"{out}/plan.txt") if l.strip()]
cpu, stat = {}, {}
for g in "AB":
    for line in open(f"{out}/{g}.txt", errors="replace"):
        w = line.split()
        if len(w) > 4 and w[0] == "xr-cpu" and w[3] == "cpu":
            cpu.setdefault((g, w[1]), {})[w[2]] = [int(x) for x in w[4:]]
        elif len(w) > 2 and w[0] == "xr-stat":
            try:
                stat.setdefault((g, w[1]), []).append(json.loads(line.split(None, 2)[2]))
            except ValueError:
                pass
def split(g, i):
    c = cpu.get((g, i), {})
    if "before" not in c or "after" not in c:
        return "-"
    d = [a - b for a, b in zip(c["after"], c["before"])]
    t = sum(d[:8]) or 1
    # user+nice, system, irq+softirq, idle+iowait
    return "%d/%d/%d/%d" % tuple(round(100 * x / t) for x in (d[0] + d[1], d[2], d[5] + d[6], d[3] + d[4]))
def total(g, i, *path):
    n = 0
    for s in stat.get((g, i), []):
        v = s
        for k in path:
            v = v.get(k, {}) if isinstance(v, dict) else {}
        n += v if isinstance(v, int) else 0
    return n
print("guest CPU over each run, user/system/irq+softirq/idle %, server A and client B;")
print("xrnic's counters at close, client B / server A (sent: RoCE packets; resent: retransmitted;")
print("xsk drop: frames the kernel dropped for a full AF_XDP ring; naks; kicks: sendto calls)")
print("%-4s %-6s %-12s %-5s %-13s %-13s %-15s %-11s %-11s %-9s %-13s" % (
    "run", "stack", "test", "round", "CPU A", "CPU B", "sent B/A", "resent B/A", "xsk drop", "naks", "kicks B/A"))
for pid, stack, r, test, *_ in plan:
    row = [pid, stack, test, r, split("A", pid), split("B", pid)]
    if stack == "xrnic":
        two = lambda *p: "%d/%d" % (total("B", pid, *p), total("A", pid, *p))
        row += [two("device", "qp", "packets_sent"), two("device", "qp", "retransmitted_packets"),
                two("port", "kernel_rx_dropped"),
                "%d/%d" % (total("B", pid, "device", "qp", "naks_sent") + total("B", pid, "device", "qp", "rnr_naks_sent"),
                           total("A", pid, "device", "qp", "naks_sent") + total("A", pid, "device", "qp", "rnr_naks_sent")),
                two("port", "tx_kicks")]
    else:
        row += ["-"] * 5
    print("%-4s %-6s %-12s %-5s %-13s %-13s %-15s %-11s %-11s %-9s %-13s" % tuple(row))
PY

# The tables side by side, rxe left, xrnic right, for each test of the last round that
# has both.
{
	echo "rxe ⟷ xrnic, the same stock perftest in the same guests: kernel ${XRI_KVER:-(see A.console)}, MTU $MTU, $(date -u +%FT%TZ), $ROUNDS rounds, $secs"
	for t in "${TESTS[@]}"; do
		IFS='|' read -r test tool opts <<<"$t"
		fr=$(ls "$OUT"/*-rxe-"$test"-r"$ROUNDS".client.txt 2>/dev/null | head -1) || true
		fx=$(ls "$OUT"/*-xrnic-"$test"-r"$ROUNDS".client.txt 2>/dev/null | head -1) || true
		[[ -n $fr && -n $fx ]] || continue
		# The options the run had (plan.txt), not this script's defaults (-a).
		opts=$(awk -F'|' -v t="$test" '$4 == t { print $6; exit }' "$OUT/plan.txt")
		echo
		echo "== $tool $opts (round $ROUNDS): rxe0 | xrnic =="
		pr -m -t -w 200 <(grep -E '^ *#bytes|^ *[0-9]+ +[0-9]+ ' "$fr" | cut -c1-98) \
			<(grep -E '^ *#bytes|^ *[0-9]+ +[0-9]+ ' "$fx" | cut -c1-98)
	done
	echo
	[[ ! -s $OUT/where.txt ]] || cat "$OUT/where.txt"
	echo
	echo "$FAILED of ${#PLAN[@]} runs failed"
} | tee "$OUT/report.txt"

# Bandwidth against message size: the best round per size and stack.
{
	echo "stack,test,bytes,gbps"
	awk -F, 'NR > 1 { k = $1 "," $2 "," $4; if (!(k in b) || $5 > b[k]) b[k] = $5 }
		END { for (k in b) print k "," b[k] }' "$OUT/sweep.csv" | sort -t, -k1,1 -k2,2 -k3,3n
} >"$OUT/sweep-best.csv"
if (($(wc -l <"$OUT/sweep-best.csv") > 1)); then
	XRNIC_HOST=${XRNIC:-$XRI_DIR/../target/debug/xrnic}
	[[ -x $XRNIC_HOST ]] || XRNIC_HOST=$REL/xrnic
	"$XRNIC_HOST" plot-sweep --title "stock perftest in TCG guests, MTU $MTU: rxe0 and xrnic" \
		-o "$OUT/bw-vs-size.svg" "$OUT/sweep-best.csv" &&
		xri_log "plot: $OUT/bw-vs-size.svg" || xri_log "plot-sweep failed"
fi

# The last line: one JSON object. Missing figures are null, their ratios too.
num() { [[ -n ${BEST[$1]:-} ]] && echo "${BEST[$1]}" || echo null; }
ratio() {
	local a b
	a=$(num "$1") b=$(num "$2")
	[[ $a != null && $b != null ]] && awk -v a="$a" -v b="$b" 'BEGIN { if (b > 0) printf "%.3f", a / b; else print "null" }' ||
		echo null
}
printf '{"rounds":%s,"mtu":%s,"rxe_write_gbps":%s,"xrnic_write_gbps":%s,"bw_ratio":%s,"rxe_read_gbps":%s,"xrnic_read_gbps":%s,"read_ratio":%s,"rxe_send_gbps":%s,"xrnic_send_gbps":%s,"send_ratio":%s,"rxe_write_lat_us":%s,"xrnic_write_lat_us":%s,"lat_ratio":%s,"rxe_send_lat_us":%s,"xrnic_send_lat_us":%s,"send_lat_ratio":%s,"failed_runs":%s}\n' \
	"$ROUNDS" "$MTU" \
	"$(num rxe/write_64k)" "$(num xrnic/write_64k)" "$(ratio xrnic/write_64k rxe/write_64k)" \
	"$(num rxe/read_64k)" "$(num xrnic/read_64k)" "$(ratio xrnic/read_64k rxe/read_64k)" \
	"$(num rxe/send_64k)" "$(num xrnic/send_64k)" "$(ratio xrnic/send_64k rxe/send_64k)" \
	"$(num rxe/write_lat)" "$(num xrnic/write_lat)" "$(ratio xrnic/write_lat rxe/write_lat)" \
	"$(num rxe/send_lat)" "$(num xrnic/send_lat)" "$(ratio xrnic/send_lat rxe/send_lat)" \
	"$FAILED" | tee "$OUT/bench-rxe.json"
((ok && FAILED == 0))
