#!/usr/bin/env bash
# Two Linux rxe guests on one bridge run the stock rdma-core / perftest tools against each
# other, one scenario per boot, while the bridge is captured; each capture is then checked
# with `xrnic decode --strict` (every RoCE packet parses and carries a valid ICRC).
#
#   interop/run-rxe-pair.sh [-o OUTDIR] [-l] [-x] [-s SPEC]... [SCENARIO-GLOB...]
#     -o OUTDIR  where captures, consoles and report.txt go (default interop/out/DATE)
#     -l         list the scenarios and exit
#     -x         xrnic inside the guests: the XRNIC_SCENARIOS list (xrnic to xrnic between
#                the two guests, and xrnic against rxe in the other guest, both roles);
#                the guests get the xrnic binary ($XRNIC) and the libraries it needs
#     -s SPEC    run this scenario instead of the built-in list (repeatable); SPEC is
#                'name|mtu|command[|client command[|client setup]]' as in SCENARIOS below
#   e.g.  interop/run-rxe-pair.sh 'rc_pingpong*' write_bw_loss
#         interop/run-rxe-pair.sh -s 'lat|1500|ib_send_lat -d rxe0 -x $XR_GID4 -F -n 100'
#
# Guest A (192.0.2.11, fd00::11) is the server, guest B (192.0.2.12, fd00::12) the client.
# Exit status: 0 when every selected scenario passed, 1 otherwise.

set -euo pipefail
# shellcheck source=guest.sh
source "$(dirname "${BASH_SOURCE[0]}")/guest.sh"

A_IP4=192.0.2.11/24 A_IP6=fd00::11/64
B_IP4=192.0.2.12/24 B_IP6=fd00::12/64
# A host-side endpoint on a veth port of the bridge, in namespace $XRI_NS-h1: where xrnic
# will run; today the guests only check they reach it.
H_IP4=192.0.2.100/24 H_IP6=fd00::100/64
# Seconds a scenario may run inside the guest (boot time comes on top).
SCENARIO_TIMEOUT=${XRI_SCENARIO_TIMEOUT:-150}

# name | link MTU | command (server side; the client adds the server's address) |
# client command if it differs | client setup run before the client starts | server
# setup run before the server starts.
# $XR_GID4 / $XR_GID6 are the GID table indexes of the guest's IPv4 / IPv6 RoCE v2 GIDs
# (found by the guest's init in sysfs); $XR_PEER4 is the server's IPv4 address.
# shellcheck disable=SC2016  # expanded inside the guest, not here
SCENARIOS=(
	'rc_pingpong_v4_s1|1500|ibv_rc_pingpong -d rxe0 -g $XR_GID4 -s 1 -n 20'
	'rc_pingpong_v4_s4096|1500|ibv_rc_pingpong -d rxe0 -g $XR_GID4 -s 4096 -n 20'
	'rc_pingpong_v4_s65536|1500|ibv_rc_pingpong -d rxe0 -g $XR_GID4 -s 65536 -n 10'
	'rc_pingpong_v6_s4096|1500|ibv_rc_pingpong -d rxe0 -g $XR_GID6 -s 4096 -n 10'
	'rc_pingpong_m1024_mtu9000|9000|ibv_rc_pingpong -d rxe0 -g $XR_GID4 -m 1024 -s 65536 -n 10'
	'rc_pingpong_m4096_mtu9000|9000|ibv_rc_pingpong -d rxe0 -g $XR_GID4 -m 4096 -s 65536 -n 10'
	'write_bw_v4_s64|1500|ib_write_bw -d rxe0 -x $XR_GID4 -F -s 64 -n 200'
	'write_bw_v4_s65536|1500|ib_write_bw -d rxe0 -x $XR_GID4 -F -s 65536 -n 100'
	'write_bw_v6_s8192|1500|ib_write_bw -d rxe0 -x $XR_GID6 -F -s 8192 -n 100'
	'write_bw_v4_D2|1500|ib_write_bw -d rxe0 -x $XR_GID4 -F -s 4096 -D 2'
	'write_bw_m4096_mtu9000|9000|ib_write_bw -d rxe0 -x $XR_GID4 -F -m 4096 -s 65536 -n 100'
	'read_bw_v4_s65536|1500|ib_read_bw -d rxe0 -x $XR_GID4 -F -s 65536 -n 100'
	'read_bw_v6_s4096|1500|ib_read_bw -d rxe0 -x $XR_GID6 -F -s 4096 -n 100'
	'send_bw_v4_s65536|1500|ib_send_bw -d rxe0 -x $XR_GID4 -F -s 65536 -n 100'
	'send_bw_v6_s1024|1500|ib_send_bw -d rxe0 -x $XR_GID6 -F -s 1024 -n 200'
	'atomic_fetch_add_v4|1500|ib_atomic_bw -d rxe0 -x $XR_GID4 -F -A FETCH_AND_ADD -n 200'
	'atomic_cmp_swap_v6|1500|ib_atomic_bw -d rxe0 -x $XR_GID6 -F -A CMP_AND_SWAP -n 200'
	'write_bw_loss|1500|ib_write_bw -d rxe0 -x $XR_GID4 -F -s 65536 -n 200||tc qdisc add dev eth0 root netem loss 2%'
	'rping_v4|1500|rping -s -a ${XR_IP4%/*} -C 10 -S 4096|rping -c -a $XR_PEER4 -C 10 -S 4096'
	# The client guest reaches the host-side veth endpoint (where xrnic will sit) over IPv4
	# with jumbo frames and IPv6, then RoCE between the guests.
	'veth_endpoint_reach|9000|ibv_rc_pingpong -d rxe0 -g $XR_GID4 -s 64 -n 5||ping -c 2 -W 3 -s 8000 $XR_HOST4 && ping -c 2 -W 3 $XR_HOST6'
)

# xrnic inside the guests (-x): Debian's 6.1 kernel, so single-buffer AF_XDP (no
# XDP_USE_SG before 6.6) with the MTU capped at 2048 (devinfo shows it), MTU 1500 only
# (6.1's virtio_net refuses native XDP above about 3.5 KB and xrnic has no generic-XDP
# fallback yet), and no iproute2: each xrnic side
# first removes /usr/bin/ip and /usr/bin/tc (busybox's applets stay, without -j), so xrnic
# has only netlink. xrnic's GID indexes are 1 (IPv4-mapped) and 2 (fd00::) on eth0.
# The rxe sides verify nothing themselves: xrnic's --verify-stock checks that every byte
# the stock peer put in its buffer is the peer's (write / send server, read client);
# --verify on an atomic server checks each counter's FETCH_AND_ADD count.
# shellcheck disable=SC2016  # expanded inside the guest, not here
NOIP='rm -f /usr/bin/ip /usr/bin/tc'
# The server side also prints what devinfo says (the capped MTU and why).
XSETUP="$NOIP; xrnic devinfo --netdev eth0"
XR_PP='xrnic rc-pingpong --netdev eth0 --verify'
XR_PERF='xrnic perf --netdev eth0'
# Stock tools on xrnic: its libibverbs.so.1 / librdmacm.so.1 go in /usr/lib/xrnic-verbs;
# the tools are given -d xrnic_eth0, a device only xrnic's library lists (so they cannot
# end up on the guest's own rxe0).
XR_EXEC='xrnic exec --in-process --netdev eth0 --lib /usr/lib/xrnic-verbs --'
# shellcheck disable=SC2016
XRNIC_SCENARIOS=(
	# xrnic (A, server) to xrnic (B, client).
	"xx_pingpong_v4_s4096|1500|$XR_PP -g 1 -s 4096 -n 20||$NOIP|$XSETUP"
	"xx_pingpong_v6_s65536|1500|$XR_PP -g 2 -s 65536 -n 10||$NOIP|$XSETUP"
	"xx_write_v4|1500|$XR_PERF write -x 1 -s 65536 -n 100 --verify||$NOIP|$XSETUP"
	"xx_read_v6|1500|$XR_PERF read -x 2 -s 65536 -n 100 --verify||$NOIP|$XSETUP"
	"xx_send_v4|1500|$XR_PERF send -x 1 -s 65536 -n 100 --verify||$NOIP|$XSETUP"
	"xx_atomic_v4|1500|$XR_PERF atomic -x 1 -A FETCH_AND_ADD -n 500 --verify||$NOIP|$XSETUP"
	# xrnic in A (server) against rxe in B (client).
	"xs_pingpong_v4_s65536|1500|$XR_PP -g 1 -s 65536 -n 10|ibv_rc_pingpong -d rxe0 -g \$XR_GID4 -s 65536 -n 10 \$XR_PEER4||$XSETUP"
	"xs_write_v4|1500|$XR_PERF write -x 1 -s 65536 -n 100 --verify-stock|ib_write_bw -d rxe0 -x \$XR_GID4 -F -s 65536 -n 100 \$XR_PEER4||$XSETUP"
	"xs_read_v4|1500|$XR_PERF read -x 1 -s 65536 -n 100|ib_read_bw -d rxe0 -x \$XR_GID4 -F -s 65536 -n 100 \$XR_PEER4||$XSETUP"
	"xs_send_v4|1500|$XR_PERF send -x 1 -s 65536 -n 100 --verify-stock|ib_send_bw -d rxe0 -x \$XR_GID4 -F -s 65536 -n 100 \$XR_PEER4||$XSETUP"
	"xs_atomic_v4|1500|$XR_PERF atomic -x 1 -A FETCH_AND_ADD -n 500 --verify|ib_atomic_bw -d rxe0 -x \$XR_GID4 -F -A FETCH_AND_ADD -n 500 \$XR_PEER4||$XSETUP"
	# rxe in A (server) against xrnic in B (client).
	"xc_pingpong_v6_s4096|1500|ibv_rc_pingpong -d rxe0 -g \$XR_GID6 -s 4096 -n 20|$XR_PP -g 2 -s 4096 -n 20 \$XR_PEER4|$NOIP"
	"xc_write_v4|1500|ib_write_bw -d rxe0 -x \$XR_GID4 -F -s 65536 -n 100|$XR_PERF write -x 1 -s 65536 -n 100 \$XR_PEER4|$NOIP"
	"xc_read_v4|1500|ib_read_bw -d rxe0 -x \$XR_GID4 -F -s 65536 -n 100|$XR_PERF read -x 1 -s 65536 -n 100 --verify-stock \$XR_PEER4|$NOIP"
	"xc_send_v4|1500|ib_send_bw -d rxe0 -x \$XR_GID4 -F -s 65536 -n 100|$XR_PERF send -x 1 -s 65536 -n 100 \$XR_PEER4|$NOIP"
	"xc_atomic_v4|1500|ib_atomic_bw -d rxe0 -x \$XR_GID4 -F -A FETCH_AND_ADD -n 500|$XR_PERF atomic -x 1 -A FETCH_AND_ADD -n 500 \$XR_PEER4|$NOIP"
	# Stock perftest -R (its connections through librdmacm) through xrnic's libibverbs /
	# librdmacm in B against rxe's kernel CM in A. perftest connects twice, the
	# second time right after its parameter exchange, when the server has to listen again;
	# a REQ before that gets REJ 8 and perftest 4.5-0.17 cannot retry it (its retry loop
	# reuses the ids it just destroyed). Both ends equally slow here, as rxe to rxe is;
	# against a TCG guest from the fast host (run-stock-rxe.sh *_cm_xc) xrnic's client
	# mostly wins that race and loses the connection. docs/interop.md.
	"xc_write_bw_cm|1500|ib_write_bw -d rxe0 -R -s 65536 -n 100|$XR_EXEC ib_write_bw -d xrnic_eth0 -R -s 65536 -n 100 \$XR_PEER4|$NOIP"
	"xc_read_bw_cm|1500|ib_read_bw -d rxe0 -R -s 65536 -n 100|$XR_EXEC ib_read_bw -d xrnic_eth0 -R -s 65536 -n 100 \$XR_PEER4|$NOIP"
	"xc_send_lat_cm|1500|ib_send_lat -d rxe0 -R -s 64 -n 200|$XR_EXEC ib_send_lat -d xrnic_eth0 -R -s 64 -n 200 \$XR_PEER4|$NOIP"
)

usage() {
	sed -n '2,19s/^# \{0,1\}//p' "$0" >&2
	exit 2
}

OUT=
LIST=
CUSTOM=()
IN_GUEST=
while getopts "o:lxs:h" opt; do
	case $opt in
	o) OUT=$OPTARG ;;
	l) LIST=1 ;;
	x) IN_GUEST=1 ;;
	s) CUSTOM+=("$OPTARG") ;;
	*) usage ;;
	esac
done
shift $((OPTIND - 1))
PATTERNS=("$@")
((${#PATTERNS[@]})) || PATTERNS=('*')
[[ -z $IN_GUEST ]] || SCENARIOS=("${XRNIC_SCENARIOS[@]}")
if ((${#CUSTOM[@]})); then
	for spec in "${CUSTOM[@]}"; do
		IFS='|' read -r n m c _ <<<"$spec"
		[[ -n $n && -n $c && ($m == 1500 || $m == 9000) ]] ||
			xri_die "bad -s spec '$spec' (want 'name|1500 or 9000|command[|client[|setup]]')"
	done
	SCENARIOS=("${CUSTOM[@]}")
fi

selected() {
	local p
	for p in "${PATTERNS[@]}"; do
		# shellcheck disable=SC2053  # glob match on purpose
		[[ $1 == $p ]] && return 0
	done
	return 1
}

if [[ -n $LIST ]]; then
	printf '%s\n' "${SCENARIOS[@]}" | cut -d'|' -f1-3 | column -t -s'|'
	exit 0
fi

xri_need_root
xri_trap_cleanup
T_START=$(xri_now)
OUT=${OUT:-$XRI_DIR/out/$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# The decoder that checks the captures: the project's own CLI.
XRNIC=${XRNIC:-$XRI_DIR/../target/debug/xrnic}
if [[ ! -x $XRNIC ]]; then
	xri_log "building xrnic (cargo build --bin xrnic)"
	(cd "$XRI_DIR/.." && cargo build --quiet --bin xrnic) || xri_die "cannot build xrnic"
fi

xri_guest_init
xri_log "kernel $XRI_KVER, base image $(basename "$XRI_BASE"), output in $OUT"
if [[ -n $IN_GUEST ]]; then
	# One more archive (XRI_GUEST_EXTRA of guest.sh): xrnic in /usr/bin and the libraries
	# `ldd` lists that the base image lacks. Only files: a directory entry would replace
	# the base image's (e.g. the /lib symlink).
	stage=$(mktemp -d /tmp/xri-xrnic.XXXXXX)
	xri_on_exit rm -rf "$stage"
	mkdir -p "$stage/usr/bin" "$stage/usr/lib/x86_64-linux-gnu" "$stage/usr/lib/xrnic-verbs"
	objcopy --strip-debug "$XRNIC" "$stage/usr/bin/xrnic"
	# xrnic's C-ABI library (beside the binary: cargo build -p xrnic-verbs) under both
	# names, for `xrnic exec --lib /usr/lib/xrnic-verbs` (the xc_*_cm rows).
	SO=$(dirname "$XRNIC")/libibverbs.so
	[[ -f $SO ]] || xri_die "no $SO (cargo build -p xrnic-verbs)"
	for n in libibverbs.so.1 librdmacm.so.1; do
		objcopy --strip-debug "$SO" "$stage/usr/lib/xrnic-verbs/$n"
	done
	base_files=$(zcat "$XRI_BASE" | cpio -t --quiet 2>/dev/null)
	for lib in $( (ldd "$XRNIC" && ldd "$SO") | awk '$3 ~ /^\// { print $3 }' | sort -u); do
		name=$(basename "$lib")
		grep -q "/$name\$" <<<"$base_files" || cp -L "$lib" "$stage/usr/lib/x86_64-linux-gnu/$name"
	done
	# ... and the one directory the base image has not (the kernel's unpacker makes no
	# parent directories).
	(cd "$stage" && { echo ./usr/lib/xrnic-verbs; find . -type f; } |
		cpio -o -H newc --quiet -R 0:0) >"$OUT/extra.cpio"
	export XRI_GUEST_EXTRA=$OUT/extra.cpio
fi
xri_net_create 1500
xri_net_add_tap tapA 1500
xri_net_add_tap tapB 1500
xri_net_add_veth h1 1500 "$H_IP4" "$H_IP6"

# write_scenario FILE ROLE COMMAND SETUP: the script each guest runs as /scenario.sh.
write_scenario() {
	local file=$1 role=$2 cmd=$3 setup=$4
	{
		echo '. /usr/lib/xr-funcs.sh'
		echo "XR_PEER4=${A_IP4%/*} XR_PEER6=${A_IP6%/*} XR_HOST4=${H_IP4%/*} XR_HOST6=${H_IP6%/*}"
		if [[ -n $setup ]]; then
			echo "echo '+ $setup'"
			echo "$setup || exit 99"
		fi
		echo "echo '+ $cmd'"
		if [[ $role == server ]]; then
			echo "xr_server $cmd"
		else
			echo "xr_client $cmd"
		fi
	} >"$file"
}

# check_capture FILE: prints "PACKETS ICRC" for the report; ICRC is "ok" only when
# xrnic decode --strict accepts every RoCE packet.
check_capture() {
	local f=$1 n icrc=ok
	n=$("$XRNIC" decode --json "$f" 2>/dev/null | grep -c '^{') || n=0
	"$XRNIC" decode --strict "$f" >"$f.decode.txt" 2>&1 || icrc=BAD
	((n > 0)) || icrc=none
	echo "$n $icrc"
}

RESULTS=()
FAILED=0
# A scenario whose perftest refused to measure (xri_perftest_refused) runs again, up to
# XRI_MEASURE_ATTEMPTS runs in all.
declare -A MEASURE_RUNS=()
QUEUE=("${SCENARIOS[@]}")
for ((qi = 0; qi < ${#QUEUE[@]}; qi++)); do
	entry=${QUEUE[qi]}
	IFS='|' read -r name mtu cmd client_cmd setup server_setup <<<"$entry"
	selected "$name" || continue
	client_cmd=${client_cmd:-"$cmd \$XR_PEER4"}
	dir=$OUT/$name
	mkdir -p "$dir"
	xri_ns ip link set br0 mtu "$mtu"
	xri_ns ip link set tapA mtu "$mtu"
	xri_ns ip link set tapB mtu "$mtu"
	xri_ns ip link set h1 mtu "$mtu"
	ip netns exec "$XRI_NS-h1" ip link set eth0 mtu "$mtu"
	write_scenario "$dir/server.sh" server "$cmd" "${server_setup:-}"
	write_scenario "$dir/client.sh" client "$client_cmd" "$setup"

	xri_log "scenario $name (MTU $mtu)"
	t0=$(xri_now)
	xri_net_capture_start "$OUT/$name.pcapng"
	xri_guest_start A tapA "$A_IP4" "$A_IP6" "$mtu" "$dir/server.sh" "$dir" "$SCENARIO_TIMEOUT"
	xri_guest_start B tapB "$B_IP4" "$B_IP6" "$mtu" "$dir/client.sh" "$dir" "$SCENARIO_TIMEOUT"
	ok=1
	# The client decides: once it is done the server must finish promptly; if the client
	# failed, the server may wait forever for a peer, so give it only a moment.
	if xri_guest_finish B $((SCENARIO_TIMEOUT + 90)); then
		xri_guest_finish A 30 || ok=0
	else
		ok=0
		xri_guest_finish A 5 || true
	fi
	xri_net_capture_stop
	secs=$(xri_elapsed "$t0")
	rm -f "$dir"/*.initrd
	read -r pkts icrc < <(check_capture "$OUT/$name.pcapng")
	[[ $icrc == ok ]] || ok=0
	runs=$((${MEASURE_RUNS[$name]:-0} + 1))
	MEASURE_RUNS[$name]=$runs
	if ((ok)); then
		status=pass
	elif ((runs < XRI_MEASURE_ATTEMPTS)) && xri_perftest_refused "$dir/A.console" "$dir/B.console"; then
		status=retried
		xri_log "$name: perftest refused to measure (its clock calibration, r^2 < 0.9, on a busy host): run $runs of $XRI_MEASURE_ATTEMPTS kept in $dir.run$runs, once more"
		rm -rf "$dir.run$runs"
		mv "$dir" "$dir.run$runs"
		mv "$OUT/$name.pcapng" "$OUT/$name.run$runs.pcapng" 2>/dev/null || true
		QUEUE+=("$entry")
	else
		status=FAIL
		FAILED=$((FAILED + 1))
		xri_log "FAILED: $name (server rc=${XRI_GUEST_RC[A]}, client rc=${XRI_GUEST_RC[B]}, ICRC check: $icrc); capture kept: $OUT/$name.pcapng"
		for g in A B; do
			echo "---- last lines of guest $g ($dir/$g.console) ----" >&2
			tail -n 25 "$dir/$g.console" >&2
		done
	fi
	RESULTS+=("$name|$mtu|$status|$secs|${XRI_GUEST_RC[A]}/${XRI_GUEST_RC[B]}|$pkts|$icrc")
done

{
	echo "rxe pair run: kernel $XRI_KVER, $(date -u +%FT%TZ), total $(xri_elapsed "$T_START") s"
	printf '%s\n' "scenario|mtu|result|seconds|rc A/B|RoCE pkts|ICRCs" "${RESULTS[@]}" |
		column -t -s'|'
	echo "$FAILED of ${#RESULTS[@]} scenarios failed"
} | tee "$OUT/report.txt"
((${#RESULTS[@]})) || xri_die "no scenario matches: ${PATTERNS[*]}"
((FAILED == 0))
