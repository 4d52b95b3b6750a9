#!/usr/bin/env bash
# The offload backend on Linux rxe: xrnic driving rxe0 through libibverbs inside a guest
# of the interop harness (docs/offload.md). One guest boot runs a list of steps in order:
#
#   api        the verbs API test suite (tests/verbs_api.rs, its `offload::` cases) on rxe0
#   pp_*, {write,read,send,atomic}_*
#              xrnic in the guest (`--device rxe0`, offload) against xrnic on the host
#              (`--netdev eth0`, software, AF_XDP on a veth endpoint of the bridge), both
#              directions (_gs: the guest serves, _gc: the guest is the client), every
#              byte verified (--verify on both sides)
#   stock_*    xrnic --device rxe0 against the stock tools (ibv_rc_pingpong, ib_write_bw,
#              ib_read_bw, ib_send_bw, ib_atomic_bw) on the same rxe0 in the guest, over
#              loopback, both roles
#   tools_*    in the guest: `xrnic devinfo` lists both kinds (xrnic_eth0 and rxe0),
#              `xrnic stat -d rxe0` shows the kernel's counters after the traffic, and
#              what the offload backend lacks (fault injection) is a clear error
#
#   interop/run-offload.sh [-o OUTDIR] [-t api|pair|all] [-l]
#     -o OUTDIR  captures, consoles, logs and report.txt (default interop/out/offload-DATE)
#     -t WHAT    api: the test suite only; pair: the other steps; all (default): both
#     -l         list the steps and exit
#
# Binaries: $XRNIC (default target/debug/xrnic) and, for `api`, $XRNIC_API_TEST (the
# verbs_api test binary; default: built with cargo). Both go into the guest stripped of
# debug info, with the libraries `ldd` lists that the base image lacks, as one more cpio
# archive (XRI_GUEST_EXTRA of guest.sh). The bridge is captured and checked with
# `xrnic decode --strict` when host and guest talked.
# Exit status: 0 when every step passed, 1 otherwise.

set -euo pipefail
# shellcheck source=guest.sh
source "$(dirname "${BASH_SOURCE[0]}")/guest.sh"

G_IP4=192.0.2.11/24 G_IP6=fd00::11/64
H_IP4=192.0.2.100/24 H_IP6=fd00::100/64
STEP_TIMEOUT=${XRI_STEP_TIMEOUT:-300}

# name | guest role (server: the guest serves, client: the host serves) | the xrnic
# subcommand and options both sides get. Small runs: rxe under TCG moves a few MB/s.
PAIR_STEPS=(
	'pp_gs|server|rc-pingpong -s 4096 -n 50'
	'pp_gc|client|rc-pingpong -s 4096 -n 50'
	'write_gs|server|perf write -s 4096 -n 200'
	'write_gc|client|perf write -s 4096 -n 200'
	'read_gs|server|perf read -s 4096 -n 200'
	'read_gc|client|perf read -s 4096 -n 200'
	'send_gs|server|perf send -s 4096 -n 200'
	'send_gc|client|perf send -s 4096 -n 200'
	'atomic_gs|server|perf atomic -n 200'
	'atomic_gc|client|perf atomic -n 200'
	'pp_v6_gc|client|rc-pingpong -s 1024 -n 20 -g 2'
	'write_q2_gs|server|perf write -s 8192 -n 100 -q 2 --json'
)
# Guest only: name | server command | client command (the client gets 127.0.0.1).
STOCK_STEPS=(
	'stock_pp_xc|ibv_rc_pingpong -d rxe0 -g $XR_GID4 -s 4096 -n 50|xrnic rc-pingpong -d rxe0 --verify -s 4096 -n 50'
	'stock_pp_xs|xrnic rc-pingpong -d rxe0 --verify -s 4096 -n 50|ibv_rc_pingpong -d rxe0 -g $XR_GID4 -s 4096 -n 50'
	'stock_write_xc|ib_write_bw -d rxe0 -x $XR_GID4 -s 4096 -n 200|xrnic perf write -d rxe0 -s 4096 -n 200'
	'stock_read_xs|xrnic perf read -d rxe0 -s 4096 -n 200|ib_read_bw -d rxe0 -x $XR_GID4 -s 4096 -n 200'
	'stock_write_xs|xrnic perf write -d rxe0 -s 4096 -n 200|ib_write_bw -d rxe0 -x $XR_GID4 -s 4096 -n 200'
	'stock_read_xc|ib_read_bw -d rxe0 -x $XR_GID4 -s 4096 -n 200|xrnic perf read -d rxe0 -s 4096 -n 200'
	'stock_send_xc|ib_send_bw -d rxe0 -x $XR_GID4 -s 4096 -n 200|xrnic perf send -d rxe0 -s 4096 -n 200'
	'stock_send_xs|xrnic perf send -d rxe0 -s 4096 -n 200|ib_send_bw -d rxe0 -x $XR_GID4 -s 4096 -n 200'
	'stock_fadd_xc|ib_atomic_bw -d rxe0 -x $XR_GID4 -A FETCH_AND_ADD -n 200|xrnic perf atomic -d rxe0 -A FETCH_AND_ADD -n 200'
	'stock_cswap_xs|xrnic perf atomic -d rxe0 -A CMP_AND_SWAP -n 200|ib_atomic_bw -d rxe0 -x $XR_GID4 -A CMP_AND_SWAP -n 200'
)

# Guest only: name | a shell command that must succeed.
TOOL_STEPS=(
	'tools_devinfo|xrnic devinfo >/tmp/d.txt && cat /tmp/d.txt && grep -q "^hca_id:.xrnic_eth0" /tmp/d.txt && grep -q "^hca_id:.rxe0" /tmp/d.txt && xrnic devinfo -v -d rxe0 | grep -q "GID\[  1\]:.*::ffff:192.0.2.11, RoCE v2"'
	'tools_stat|xrnic stat -d rxe0 && xrnic stat -d rxe0 | grep -Eq " sent_pkts [1-9]" && xrnic stat -d rxe0 --json | grep -q "\"device\":\"rxe0\""'
	'tools_errors|! xrnic rc-pingpong -d rxe0 --rx-drop 0.1 2>/tmp/e.txt; cat /tmp/e.txt; grep -q "not available on the offload" /tmp/e.txt && ! xrnic devinfo -d nosuch0 2>/tmp/e.txt; cat /tmp/e.txt; grep -q "no RDMA device nosuch0 (libibverbs finds: rxe0)" /tmp/e.txt'
)

usage() {
	sed -n '2,28s/^# \{0,1\}//p' "$0" >&2
	exit 2
}

OUT= WHAT=all LIST=
while getopts "o:t:lh" opt; do
	case $opt in
	o) OUT=$OPTARG ;;
	t) WHAT=$OPTARG ;;
	l) LIST=1 ;;
	*) usage ;;
	esac
done
[[ $WHAT == api || $WHAT == pair || $WHAT == all ]] || usage
if [[ -n $LIST ]]; then
	echo "api|guest|verbs_api offload:: on rxe0"
	printf '%s\n' "${PAIR_STEPS[@]}" "${STOCK_STEPS[@]}" "${TOOL_STEPS[@]}" | column -t -s'|'
	exit 0
fi
# The step names in guest order.
STEPS=()
[[ $WHAT == pair ]] || STEPS+=(api)
if [[ $WHAT != api ]]; then
	for s in "${PAIR_STEPS[@]}" "${STOCK_STEPS[@]}" "${TOOL_STEPS[@]}"; do STEPS+=("${s%%|*}"); done
fi

xri_need_root
xri_trap_cleanup
T_START=$(xri_now)
OUT=${OUT:-$XRI_DIR/out/offload-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
ROOT=$(cd "$XRI_DIR/.." && pwd)

XRNIC=${XRNIC:-$ROOT/target/debug/xrnic}
if [[ ! -x $XRNIC ]]; then
	xri_log "building xrnic (cargo build --bin xrnic)"
	(cd "$ROOT" && cargo build --quiet --bin xrnic) || xri_die "cannot build xrnic"
fi
if [[ $WHAT != pair && -z ${XRNIC_API_TEST:-} ]]; then
	xri_log "building the verbs_api test binary"
	XRNIC_API_TEST=$(cd "$ROOT" && cargo test --quiet --test verbs_api --no-run --message-format=json |
		sed -n 's/.*"executable":"\([^"]*verbs_api[^"]*\)".*/\1/p' | tail -1)
	[[ -x $XRNIC_API_TEST ]] || xri_die "cannot build the verbs_api test binary"
fi

xri_guest_init

# The extra archive: binaries in /usr/bin, missing libraries in /usr/lib/x86_64-linux-gnu.
# Only files: a directory entry would replace the base image's (e.g. the /lib symlink).
stage=$(mktemp -d /tmp/xri-offload.XXXXXX)
xri_on_exit rm -rf "$stage"
mkdir -p "$stage/usr/bin" "$stage/usr/lib/x86_64-linux-gnu"
bins=("$XRNIC")
objcopy --strip-debug "$XRNIC" "$stage/usr/bin/xrnic"
if [[ $WHAT != pair ]]; then
	objcopy --strip-debug "$XRNIC_API_TEST" "$stage/usr/bin/xrnic-verbs-api"
	bins+=("$XRNIC_API_TEST")
fi
base_files=$(zcat "$XRI_BASE" | cpio -t --quiet 2>/dev/null)
for lib in $(ldd "${bins[@]}" | awk '$3 ~ /^\// { print $3 }' | sort -u); do
	name=$(basename "$lib")
	grep -q "/$name\$" <<<"$base_files" || cp -L "$lib" "$stage/usr/lib/x86_64-linux-gnu/$name"
done
(cd "$stage" && find . -type f | cpio -o -H newc --quiet -R 0:0) >"$OUT/extra.cpio"
export XRI_GUEST_EXTRA=$OUT/extra.cpio

# The guest's /scenario.sh: every step in order, each between XR-STEP-BEGIN and XR-STEP
# markers; the result is the number of failed steps.
scenario=$OUT/guest.sh
{
	echo '. /usr/lib/xr-funcs.sh'
	echo 'failed=0'
	echo 'step_end() { echo "XR-STEP $1 rc=$2"; [ "$2" = 0 ] || failed=$((failed + 1)); }'
	# A stock server and xrnic both on rxe0: start the server, then the client retries.
	echo 'pair_local() { local n=$1 port=$2 srv=$3 cli=$4; sh -c "$srv -p $port" >/tmp/$n.srv 2>&1 & local sp=$!; xr_client sh -c "$cli -p $port 127.0.0.1"; local rc=$?; local src=0; wait $sp || src=$?; echo "-- server:"; cat /tmp/$n.srv; [ $rc = 0 ] && [ $src = 0 ]; }'
	# perftest refusing to measure on a busy host (its clock calibration, r^2 < 0.9, then
	# no report; lib.sh xri_perftest_refused) is not a failure of either stack: such a step
	# runs again, up to 3 times, each on its own ports.
	echo 'pair_retry() { local n=$1 port=$2 i=1 rc; while :; do pair_local "$n" $((port + 100 * (i - 1))) "$3" "$4" >/tmp/$n.try 2>&1; rc=$?; cat /tmp/$n.try; [ $rc = 0 ] && return 0; if [ $i -lt 3 ] && grep -Eq "Correlation coefficient r.2: [-+.0-9e]+ < 0.9" /tmp/$n.try && grep -q "produce a report" /tmp/$n.try; then echo "xr: $n: perftest refused to measure (r^2 < 0.9 on a busy host), not a failure of the stack: run $i of 3, once more"; i=$((i + 1)); else return $rc; fi; done; }'
	port=19000
	for name in "${STEPS[@]}"; do
		port=$((port + 1))
		echo "echo XR-STEP-BEGIN $name"
		if [[ $name == api ]]; then
			# Passing means some cases ran and none failed (a filter matching nothing
			# would exit 0 too).
			echo 'XRNIC_RDMA_DEVICE=rxe0 RUST_BACKTRACE=1 /usr/bin/xrnic-verbs-api --test-threads=1 --ignored offload:: >/tmp/api.txt 2>&1; rc=$?; cat /tmp/api.txt; [ $rc = 0 ] && grep -Eq "test result: ok\. [1-9][0-9]* passed; 0 failed" /tmp/api.txt; step_end api $?'
			continue
		fi
		for s in "${PAIR_STEPS[@]}"; do
			IFS='|' read -r n role cmd <<<"$s"
			[[ $n == "$name" ]] || continue
			if [[ $role == server ]]; then
				echo "xr_server xrnic $cmd -d rxe0 --verify -p $port; step_end $n \$?"
			else
				echo "xr_client xrnic $cmd -d rxe0 --verify -p $port ${H_IP4%/*}; step_end $n \$?"
			fi
		done
		for s in "${STOCK_STEPS[@]}"; do
			IFS='|' read -r n srv cli <<<"$s"
			[[ $n == "$name" ]] || continue
			echo "pair_retry $n $port \"$srv\" \"$cli\"; step_end $n \$?"
		done
		for s in "${TOOL_STEPS[@]}"; do
			IFS='|' read -r n cmd <<<"$s"
			[[ $n == "$name" ]] || continue
			printf '( %s ); step_end %s $?\n' "$cmd" "$n"
		done
	done
	echo 'exit $failed'
} >"$scenario"

xri_log "kernel $XRI_KVER, xrnic $XRNIC, steps: ${STEPS[*]}; output in $OUT"
xri_net_create 1500
xri_net_add_tap tapA 1500
NEED_HOST=
[[ $WHAT != api ]] && NEED_HOST=1
if [[ -n $NEED_HOST ]]; then
	xri_net_add_veth h1 1500 "$H_IP4" "$H_IP6"
	H_NS=$XRI_NS-h1
	xri_net_capture_start "$OUT/pair.pcapng"
fi

# host_side NAME ROLE CMD PORT: xrnic's software side of one pair step.
host_side() {
	local name=$1 role=$2 cmd=$3 port=$4 base=$OUT/$1.host i rc
	# shellcheck disable=SC2206  # the options are words on purpose
	local args=($cmd --netdev eth0 --verify --no-stat -p "$port")
	if [[ $role == server ]]; then
		# The guest serves: connect, retrying while it is not listening yet.
		for ((i = 0; i < 120; i++)); do
			rc=0
			ip netns exec "$H_NS" timeout -k 5 "$STEP_TIMEOUT" "$XRNIC" "${args[@]}" "${G_IP4%/*}" \
				>"$base.out" 2>"$base.err" || rc=$?
			((rc == 0)) && return 0
			grep -qE "Couldn't connect to [0-9a-f.:]+:[0-9]+" "$base.err" || return "$rc"
			sleep 0.5
		done
		return "$rc"
	fi
	ip netns exec "$H_NS" timeout -k 5 "$STEP_TIMEOUT" "$XRNIC" "${args[@]}" \
		>"$base.out" 2>"$base.err"
}

xri_guest_start A tapA "$G_IP4" "$G_IP6" 1500 "$scenario" "$OUT" $((STEP_TIMEOUT * ${#STEPS[@]}))
declare -A HOST_RC=()
for name in "${STEPS[@]}"; do
	# Console lines end in \r\n.
	xri_guest_wait A "^XR-STEP-BEGIN $name[[:space:]]*\$" "$STEP_TIMEOUT" || break
	for s in "${PAIR_STEPS[@]}"; do
		IFS='|' read -r n role cmd <<<"$s"
		[[ $n == "$name" ]] || continue
		port=$((19000 + $(printf '%s\n' "${STEPS[@]}" | grep -nx "$n" | cut -d: -f1)))
		rc=0
		host_side "$n" "$role" "$cmd" "$port" || rc=$?
		HOST_RC[$n]=$rc
	done
	xri_guest_wait A "^XR-STEP $name rc=" "$STEP_TIMEOUT" || break
done
ok=1
xri_guest_finish A 60 || ok=0
rm -f "$OUT"/*.initrd
ICRC=-
if [[ -n $NEED_HOST ]]; then
	xri_net_capture_stop
	n=$("$XRNIC" decode --json "$OUT/pair.pcapng" 2>/dev/null | grep -c '^{') || n=0
	if "$XRNIC" decode --strict "$OUT/pair.pcapng" >"$OUT/pair.pcapng.decode.txt" 2>&1 && ((n > 0)); then
		ICRC="ok ($n RoCE packets)"
	else
		ICRC="BAD ($n RoCE packets)"
		ok=0
	fi
fi

FAILED=0
ROWS=()
for name in "${STEPS[@]}"; do
	line=$(grep -a -m1 "^XR-STEP $name rc=" "$OUT/A.console" || true)
	grc=${line##*rc=}
	grc=${grc//[^0-9]/}
	hrc=${HOST_RC[$name]:--}
	if [[ $grc == 0 && ($hrc == - || $hrc == 0) ]]; then st=pass; else st=FAIL; FAILED=$((FAILED + 1)); fi
	ROWS+=("$name|guest rc ${grc:-none}|host rc $hrc|$st")
done
{
	echo "offload run: kernel $XRI_KVER, $(date -u +%FT%TZ), total $(xri_elapsed "$T_START") s"
	printf '%s\n' "${ROWS[@]}" | column -t -s'|'
	echo "bridge capture ICRCs: $ICRC"
	echo "$FAILED of ${#STEPS[@]} steps failed"
} | tee "$OUT/report.txt"
if ((FAILED || !ok)); then
	echo "---- last lines of the guest console ----" >&2
	tail -n 60 "$OUT/A.console" >&2
	for f in "$OUT"/*.host.err; do
		[[ -s $f ]] || continue
		echo "---- $f ----" >&2
		tail -n 10 "$f" >&2
	done
	exit 1
fi
