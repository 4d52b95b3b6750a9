#!/usr/bin/env bash
# xrnic ⟷ Linux rxe: xrnic's `rc-pingpong` / `perf` on AF_XDP, on a veth endpoint of the
# harness bridge in a namespace of its own, against the stock `ibv_rc_pingpong` /
# `ib_{write,read,send,atomic}_bw` in one rxe guest, one scenario per guest boot, while the
# bridge is captured; each capture is then checked with `xrnic decode --strict` (every RoCE
# packet parses and carries a valid ICRC) and must hold RoCE packets of both stacks (by
# source MAC).
#
#   interop/run-xrnic-rxe.sh [-o OUTDIR] [-l] [-s SPEC]... [SCENARIO-GLOB...]
#     -o OUTDIR  where captures, logs and report.txt go (default interop/out/xrnic-DATE)
#     -l         list the scenarios and exit
#     -s SPEC    run this scenario instead of the built-in list (repeatable); SPEC is
#                'name|mtu|xrnic role|gid family|[test] options[|guest setup
#                [|xrnic-only options[|guest-only options]]]'
#                as in SCENARIOS below
#   e.g.  interop/run-xrnic-rxe.sh 'xc_*'
#         interop/run-xrnic-rxe.sh -s 'big|9000|client|6|-m 4096 -s 65536 -n 10'
#         interop/run-xrnic-rxe.sh -s 'w|1500|server|0|write -s 4096 -n 100'
#
# The guest (192.0.2.11, fd00::11) runs ibv_rc_pingpong or perftest; xrnic (192.0.2.100,
# fd00::100, namespace $XRI_NS-h1, interface eth0) runs `xrnic rc-pingpong --verify` or
# `xrnic perf TEST`. The xrnic binary is $XRNIC (default target/debug/xrnic, built when
# missing).
# Exit status: 0 when every selected scenario passed, 1 otherwise.

set -euo pipefail
# shellcheck source=guest.sh
source "$(dirname "${BASH_SOURCE[0]}")/guest.sh"
# shellcheck source=wire.sh
source "$(dirname "${BASH_SOURCE[0]}")/wire.sh"

G_IP4=192.0.2.11/24 G_IP6=fd00::11/64
H_IP4=192.0.2.100/24 H_IP6=fd00::100/64
SCENARIO_TIMEOUT=${XRI_SCENARIO_TIMEOUT:-120}
# xrnic's own limit per run (its rc-pingpong gives up after 30 s without a completion).
XRNIC_TIMEOUT=${XRI_XRNIC_TIMEOUT:-120}

# name | link MTU | xrnic's role (client: the guest is the server; server: the guest is
# the client) | GID family (4: IPv4-mapped GID, 6: the fd00:: GID, 0: the fe80:: link-local
# GID, index 0 on both sides) | [test] options both sides get (test: write, read, send or
# atomic for `xrnic perf` against ib_TEST_bw; none, i.e. options starting with '-', for
# rc-pingpong against ibv_rc_pingpong) | guest setup run before the guest's tool | options
# for xrnic only | options for the guest's tool only.
# netem in the guest loses the guest's frames (rxe's data and ACKs); xrnic's frames can
# only be lost on xrnic's side: AF_XDP transmits bypass qdiscs, and the host kernel here
# has no netem for the bridge ports, so xrnic's test option --rx-drop drops received frames
# in its driver (rxe then resends data, and xrnic resends what the lost ACKs covered).
# GID indexes differ: xrnic's table is 0 fe80::, 1 IPv4-mapped, 2 fd00::; the guest's
# are found in its sysfs ($XR_GID4 / $XR_GID6; with rxe on eth0 they are also 1 and 2).
# perftest's TCP exchange is IPv4 only (perftest_communication.c), whatever the GID.
SCENARIOS=(
	'xc_v4_s1|1500|client|4|-s 1 -n 20'
	'xc_v4_s65536|1500|client|4|-s 65536 -n 10'
	'xc_v6_s4096|1500|client|6|-s 4096 -n 10'
	'xc_v4_m4096_mtu9000|9000|client|4|-m 4096 -s 65536 -n 10'
	'xs_v4_s1|1500|server|4|-s 1 -n 20'
	'xs_v4_s65536|1500|server|4|-s 65536 -n 10'
	'xs_v6_s65536|1500|server|6|-s 65536 -n 10'
	'xs_v6_m4096_mtu9000|9000|server|6|-m 4096 -s 4096 -n 10'
	# perftest: xrnic perf against ib_TEST_bw. --verify-stock: xrnic checks that every byte
	# that landed in its buffer is the stock peer's (write / send server, read client);
	# --verify on an atomic server: each counter holds its FETCH_AND_ADD count (perftest's
	# server buffer is random, so an xrnic atomic client checks nothing).
	'xc_write_v4_s8|1500|client|4|write -s 8 -n 1000'
	'xc_write_v4_s65536|1500|client|4|write -s 65536 -n 100'
	'xc_write_ll_s4096|1500|client|0|write -s 4096 -n 200'
	'xs_write_v4_s8|1500|server|4|write -s 8 -n 1000||--verify-stock'
	'xs_write_v4_s65536|1500|server|4|write -s 65536 -n 100||--verify-stock'
	'xs_write_ll_s4096|1500|server|0|write -s 4096 -n 200||--verify-stock'
	'xc_read_v4_s8|1500|client|4|read -s 8 -n 1000||--verify-stock'
	'xc_read_v4_s65536|1500|client|4|read -s 65536 -n 100||--verify-stock'
	'xc_read_ll_s4096|1500|client|0|read -s 4096 -n 200||--verify-stock'
	'xs_read_v4_s8|1500|server|4|read -s 8 -n 1000'
	'xs_read_v4_s65536|1500|server|4|read -s 65536 -n 100'
	'xs_read_ll_s4096|1500|server|0|read -s 4096 -n 200'
	'xc_send_v4_s8|1500|client|4|send -s 8 -n 1000'
	'xc_send_v4_s65536|1500|client|4|send -s 65536 -n 100'
	'xc_send_ll_s4096|1500|client|0|send -s 4096 -n 200'
	'xs_send_v4_s8|1500|server|4|send -s 8 -n 1000||--verify-stock'
	'xs_send_v4_s65536|1500|server|4|send -s 65536 -n 100||--verify-stock'
	'xs_send_ll_s4096|1500|server|0|send -s 4096 -n 200||--verify-stock'
	'xc_write_m4096_mtu9000|9000|client|4|write -m 4096 -s 65536 -n 100'
	'xs_write_m4096_mtu9000|9000|server|4|write -m 4096 -s 65536 -n 100||--verify-stock'
	'xc_atomic_faa_v4|1500|client|4|atomic -A FETCH_AND_ADD -n 1000'
	'xs_atomic_faa_v4|1500|server|4|atomic -A FETCH_AND_ADD -n 1000||--verify'
	'xc_atomic_cas_ll|1500|client|0|atomic -A CMP_AND_SWAP -n 1000'
	'xs_atomic_cas_v4|1500|server|4|atomic -A CMP_AND_SWAP -n 1000||--verify'
	# Loss: netem drops 2 % of the guest's frames (rxe's data, ACKs, READ requests and
	# responses) during a write and a read test.
	'xc_loss_write_s65536|1500|client|4|write -s 65536 -n 100|tc qdisc add dev eth0 root netem loss 2%'
	'xs_loss_write_s65536|1500|server|4|write -s 65536 -n 100|tc qdisc add dev eth0 root netem loss 2%|--verify-stock'
	'xc_loss_read_s65536|1500|client|4|read -s 65536 -n 100|tc qdisc add dev eth0 root netem loss 2%|--verify-stock'
	'xs_loss_read_s65536|1500|server|4|read -s 65536 -n 100|tc qdisc add dev eth0 root netem loss 2%'
	# RNR: the receiver keeps one receive posted (-r 1) while the sender has up to 128
	# SENDs in flight: rxe RNR-NAKs xrnic's SENDs (xc_), xrnic RNR-NAKs rxe's (xs_).
	'xc_rnr_send_s64|1500|client|4|send -s 64 -n 500|||-r 1'
	'xs_rnr_send_s64|1500|server|4|send -s 64 -n 500||-r 1 --verify-stock'
)
# Not in the default set (run them by name; kept out to hold `make interop` under 20
# minutes): more rc-pingpong sizes; 2 % loss in the guest's egress (netem) during
# rc-pingpong, so xrnic sees gaps, NAKs them and rxe resends; and xrnic's own losses
# answered by rxe.
EXTRA=(
	'xs_v4_m4096_mtu9000|9000|server|4|-m 4096 -s 65536 -n 10'
	'xs_v6_s4096|1500|server|6|-s 4096 -n 10'
	'xs_v4_s4096|1500|server|4|-s 4096 -n 20'
	'xc_v6_m4096_mtu9000|9000|client|6|-m 4096 -s 65536 -n 10'
	'xc_v4_s4096|1500|client|4|-s 4096 -n 20'
	'xc_loss_s65536|1500|client|4|-s 65536 -n 20|tc qdisc add dev eth0 root netem loss 2%'
	'xs_loss_s65536|1500|server|4|-s 65536 -n 20|tc qdisc add dev eth0 root netem loss 2%'
	'xc_xloss_s65536|1500|client|4|-s 65536 -n 20||--rx-drop 0.02'
	'xs_xloss_s4096|1500|server|4|-s 4096 -n 50||--rx-drop 0.1'
)

usage() {
	sed -n '2,24s/^# \{0,1\}//p' "$0" >&2
	exit 2
}

OUT=
LIST=
CUSTOM=()
while getopts "o:ls:h" opt; do
	case $opt in
	o) OUT=$OPTARG ;;
	l) LIST=1 ;;
	s) CUSTOM+=("$OPTARG") ;;
	*) usage ;;
	esac
done
shift $((OPTIND - 1))
PATTERNS=("$@")
if ((${#CUSTOM[@]})); then
	for spec in "${CUSTOM[@]}"; do
		IFS='|' read -r n m r f o _ <<<"$spec"
		[[ -n $n && -n $o && ($m == 1500 || $m == 9000) && ($r == client || $r == server) &&
			($f == 4 || $f == 6 || $f == 0) ]] ||
			xri_die "bad -s spec '$spec' (want 'name|1500 or 9000|client or server|4, 6 or 0|[test] options[|guest setup[|xrnic options[|guest options]]]')"
	done
	SCENARIOS=("${CUSTOM[@]}")
elif ((${#PATTERNS[@]})); then
	# Named scenarios may come from the extra list too.
	SCENARIOS+=("${EXTRA[@]}")
fi
((${#PATTERNS[@]})) || PATTERNS=('*')

selected() {
	local p
	for p in "${PATTERNS[@]}"; do
		# shellcheck disable=SC2053  # glob match on purpose
		[[ $1 == $p ]] && return 0
	done
	return 1
}

if [[ -n $LIST ]]; then
	printf '%s\n' "${SCENARIOS[@]}" "${EXTRA[@]/#/(extra) }" | column -t -s'|'
	exit 0
fi

xri_need_root
xri_trap_cleanup
T_START=$(xri_now)
OUT=${OUT:-$XRI_DIR/out/xrnic-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

XRNIC=${XRNIC:-$XRI_DIR/../target/debug/xrnic}
if [[ ! -x $XRNIC ]]; then
	xri_log "building xrnic (cargo build --bin xrnic)"
	(cd "$XRI_DIR/.." && cargo build --quiet --bin xrnic) || xri_die "cannot build xrnic"
fi
XRNIC=$(cd "$(dirname "$XRNIC")" && pwd)/$(basename "$XRNIC")

xri_guest_init
xri_log "kernel $XRI_KVER, base image $(basename "$XRI_BASE"), xrnic $XRNIC, output in $OUT"
xri_net_create 1500
xri_net_add_tap tapA 1500
xri_net_add_veth h1 1500 "$H_IP4" "$H_IP6"
H_NS=$XRI_NS-h1
H_MAC=$(ip netns exec "$H_NS" cat /sys/class/net/eth0/address)
G_MAC=$(xri_guest_mac "$G_IP4")

# tool_of OPTIONS: the perftest test named by the first word, or "pingpong".
tool_of() {
	case ${1%% *} in
	write | read | send | atomic) echo "${1%% *}" ;;
	*) echo pingpong ;;
	esac
}

# write_guest FILE ROLE OPTIONS FAMILY SETUP GUEST-OPTIONS: the guest's /scenario.sh.
write_guest() {
	local file=$1 role=$2 opts=$3 fam=$4 setup=$5 gopts=$6 tool cmd gid
	tool=$(tool_of "$opts")
	gid="\$XR_GID$fam"
	[[ $fam == 0 ]] && gid=0
	if [[ $tool == pingpong ]]; then
		cmd="ibv_rc_pingpong -d rxe0 -g $gid $opts $gopts"
	else
		# -F: no warning about the CPU frequency governor (there is none in the guest).
		cmd="ib_${tool}_bw -d rxe0 -x $gid -F ${opts#"$tool"} $gopts"
	fi
	# shellcheck disable=SC2016  # single quotes on purpose: the guest's shell expands these
	{
		echo '. /usr/lib/xr-funcs.sh'
		if [[ $fam == 0 ]]; then
			# Index 0 must be rxe0's fe80:: GID (derived from eth0's MAC) for RoCE v2.
			echo 'g0=$(cat /sys/class/infiniband/rxe0/ports/1/gids/0)'
			echo 't0=$(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/0)'
			echo 'echo "xr: GID 0 $g0 ($t0)"'
			echo 'case $g0/$t0 in fe80:*/*v2*) ;; *) echo "xr: GID 0 is not a RoCE v2 fe80:: GID"; exit 98 ;; esac'
		fi
		if [[ -n $setup ]]; then
			echo "echo '+ $setup'"
			echo "$setup || exit 99"
		fi
		if [[ $role == client ]]; then
			# xrnic is the client: the guest serves.
			echo "echo '+ $cmd'"
			echo "xr_server $cmd"
		else
			echo "echo '+ $cmd ${H_IP4%/*}'"
			echo "xr_client $cmd ${H_IP4%/*}"
		fi
		echo 'rc=$?'
		# On a failure, the guest's addresses, routes and neighbours: what the kernel's RoCE
		# address resolution (modify QP to RTR, create AH) looked at.
		echo '[ $rc -eq 0 ] || { echo "xr: after the failure:"; ip -6 addr show dev eth0; ip -6 route show dev eth0; ip neigh show dev eth0; }'
		# What rxe counted (retransmissions, RNR NAKs, sequence errors), for the report.
		echo 'for c in /sys/class/infiniband/rxe0/ports/1/hw_counters/*; do echo "xr-counter ${c##*/} $(cat "$c")"; done'
		echo 'exit $rc'
	} >"$file"
}

# run_xrnic LOGBASE TOOL ARGS...: xrnic rc-pingpong or perf TOOL in the endpoint namespace,
# stdout and stderr to LOGBASE.out / LOGBASE.err; returns its exit status.
run_xrnic() {
	local base=$1 tool=$2
	shift 2
	if [[ $tool == pingpong ]]; then
		set -- rc-pingpong --verify "$@"
	else
		set -- perf "$tool" "$@"
	fi
	ip netns exec "$H_NS" timeout -k 5 "$XRNIC_TIMEOUT" \
		"$XRNIC" "$@" --netdev eth0 --no-stat >"$base.out" 2>"$base.err"
}

# xrnic_client LOGBASE ARGS...: as xr_client in the guest: retry (up to 30 s) only while
# the guest's server is not listening yet (TCP connection refused).
xrnic_client() {
	local base=$1 i rc
	shift
	for ((i = 0; i < 60; i++)); do
		rc=0
		run_xrnic "$base" "$@" || rc=$?
		((rc == 0)) && return 0
		grep -qE "Couldn't connect to [0-9a-f.:]+:[0-9]+" "$base.err" || return "$rc"
		sleep 0.5
	done
	return "$rc"
}

declare -A FAMNAME=([4]=IPv4 [6]=IPv6 [0]=fe80)
RESULTS=()
FAILED=0
for entry in "${SCENARIOS[@]}"; do
	IFS='|' read -r name mtu role fam opts setup xopts gopts <<<"$entry"
	selected "$name" || continue
	dir=$OUT/$name
	mkdir -p "$dir"
	xri_ns ip link set br0 mtu "$mtu"
	xri_ns ip link set tapA mtu "$mtu"
	xri_ns ip link set h1 mtu "$mtu"
	ip netns exec "$H_NS" ip link set eth0 mtu "$mtu"
	write_guest "$dir/guest.sh" "$role" "$opts" "$fam" "$setup" "$gopts"
	# xrnic's GID table: 0 = fe80:: (from the MAC), 1 = IPv4-mapped, 2 = the first other
	# IPv6 address (fd00::100).
	gid=1
	[[ $fam == 6 ]] && gid=2
	[[ $fam == 0 ]] && gid=0
	tool=$(tool_of "$opts")
	gflag=-g
	[[ $tool == pingpong ]] || gflag=-x
	# shellcheck disable=SC2206  # the options are words on purpose
	xargs=($opts $xopts)
	[[ $tool == pingpong ]] || xargs=("${xargs[@]:1}")
	xargs=("$tool" "$gflag" "$gid" "${xargs[@]}")

	xri_log "scenario $name (MTU $mtu, xrnic $role, ${FAMNAME[$fam]} GID)"
	t0=$(xri_now)
	xri_net_capture_start "$OUT/$name.pcapng"
	xri_guest_start A tapA "$G_IP4" "$G_IP6" "$mtu" "$dir/guest.sh" "$dir" "$SCENARIO_TIMEOUT"
	ok=1
	xrc=0
	if [[ $role == server ]]; then
		# xrnic listens at once; the guest's xr_client retries until it does.
		rm -f "$dir/xrnic.rc"
		(
			rc=0
			run_xrnic "$dir/xrnic" "${xargs[@]}" || rc=$?
			echo "$rc" >"$dir/xrnic.rc"
		) &
		xpid=$!
		# If xrnic fails first, the guest's tool may spin until the scenario timeout: stop
		# waiting for it then. (The loop ends at the latest with qemu's own time limit.)
		xfailed() { [[ -s $dir/xrnic.rc && $(cat "$dir/xrnic.rc") != 0 ]]; }
		while ! grep -aq '^XR-RESULT ' "${XRI_GUEST_LOG[A]}" && ! xfailed &&
			kill -0 "${XRI_GUEST_PID[A]}" 2>/dev/null; do
			sleep 0.2
		done
		if xfailed && ! grep -aq '^XR-RESULT ' "${XRI_GUEST_LOG[A]}"; then
			ok=0
			xri_guest_finish A 5 || true
		else
			xri_guest_finish A $((SCENARIO_TIMEOUT + 90)) || ok=0
		fi
		if ((ok)); then
			xri_wait_pid "$xpid" 30 || xri_kill_pid "$xpid"
		else
			xri_wait_pid "$xpid" 5 || xri_kill_pid "$xpid"
		fi
		# A run killed here left no status: count it as failed.
		xrc=$(cat "$dir/xrnic.rc" 2>/dev/null || echo 124)
	else
		if xri_guest_wait A '^XR-SERVER-START' $((SCENARIO_TIMEOUT + 60)); then
			xrnic_client "$dir/xrnic" "${xargs[@]}" "${G_IP4%/*}" || xrc=$?
		else
			xrc=125
		fi
		if ((xrc == 0)); then
			xri_guest_finish A 30 || ok=0
		else
			xri_guest_finish A 5 || true
		fi
	fi
	((xrc == 0)) || ok=0
	xri_net_capture_stop
	secs=$(xri_elapsed "$t0")
	rm -f "$dir"/*.initrd
	read -r pkts icrc nx nr < <(check_capture "$OUT/$name.pcapng" "$fam")
	read -r xres xnak xrnr rres rnak rrnr < <(wire_stats "$OUT/$name.pcapng")
	[[ $icrc == ok && $nx -gt 0 && $nr -gt 0 ]] || ok=0
	if ((ok)); then
		status=pass
	else
		status=FAIL
		FAILED=$((FAILED + 1))
		xri_log "FAILED: $name (guest rc=${XRI_GUEST_RC[A]}, xrnic rc=$xrc, ICRC check: $icrc, packets xrnic/rxe: $nx/$nr); capture kept: $OUT/$name.pcapng"
		for f in "$dir/xrnic.out" "$dir/xrnic.err" "$dir/A.console"; do
			echo "---- last lines of $f ----" >&2
			tail -n 25 "$f" >&2 || true
		done
	fi
	RESULTS+=("$name|$mtu|$role|${FAMNAME[$fam]}|$status|$secs|${XRI_GUEST_RC[A]}/$xrc|$pkts|$nx/$nr|$icrc|$xres/$rres|$xnak/$rnak|$xrnr/$rrnr")
done

{
	echo "xrnic ⟷ rxe run: kernel $XRI_KVER, $(date -u +%FT%TZ), total $(xri_elapsed "$T_START") s"
	printf '%s\n' "scenario|mtu|xrnic|GID|result|seconds|rc guest/xrnic|RoCE pkts|xrnic/rxe|ICRCs|resent x/r|NAKs x/r|RNR NAKs x/r" \
		"${RESULTS[@]}" | column -t -s'|'
	echo "$FAILED of ${#RESULTS[@]} scenarios failed"
} | tee "$OUT/report.txt"
((${#RESULTS[@]})) || xri_die "no scenario matches: ${PATTERNS[*]}"
((FAILED == 0))
