#!/usr/bin/env bash
# Boot Linux rxe guests (qemu TCG, the Debian kernel of XRI_FLAVOUR: 6.1 or 6.12, and the
# initramfs from setup.sh) on the harness bridge, each in the background with its serial
# console in a log file.
#
# Source it for the functions, or run one guest by hand:
#   guest.sh run [--mtu 1500|9000] [--ip4 A/24] [--ip6 A/64] [--timeout S] SCENARIO.sh
# e.g. a scenario `ibv_devinfo -v` prints the guest's device and GID table.
#
#   xri_guest_init                 runs setup.sh once, sets XRI_KERNEL and XRI_BASE
#   xri_guest_start NAME TAP IP4 IP6 MTU SCENARIO OUTDIR TIMEOUT
#                                  boots guest NAME on tap TAP (which must exist, see
#                                  net.sh; TAP0,TAP1 gives it two NICs, eth0 and eth1);
#                                  SCENARIO is a shell script run as /scenario.sh, killed
#                                  after TIMEOUT seconds; console in OUTDIR/NAME.console
#   xri_guest_wait NAME REGEX SECONDS
#                                  waits for a console line; 0 found, 1 timeout, 2 guest gone
#   xri_guest_finish NAME SECONDS  waits for `XR-RESULT rc=N` and the guest's exit; sets
#                                  XRI_GUEST_RC[NAME]=N (or 255 when no result appeared)
#                                  and returns 0 only for N = 0
#
# Guests get only the NICs named, taps on the namespace's bridges (-nodefaults: no
# user-mode network, no other device), so they can reach nothing but the harness network.

# shellcheck source=net.sh
source "$(dirname "${BASH_SOURCE[0]}")/net.sh"

declare -gA XRI_GUEST_PID=() XRI_GUEST_LOG=() XRI_GUEST_RC=()
XRI_GUEST_MEM=${XRI_GUEST_MEM:-512}
# Extra kernel command line for every guest (e.g. clocksource=hpet), from the environment.
XRI_GUEST_APPEND=${XRI_GUEST_APPEND:-}
# XRI_GUEST_QEMU_ARGS: an array of extra qemu arguments for every guest, set by the script
# that sources this file (interop/conformance.sh: the host's file system over virtio-9p).

xri_guest_init() {
	[[ -n ${XRI_BASE:-} && -f ${XRI_BASE:-} ]] && return 0
	local vars
	vars=$("$XRI_DIR/setup.sh") || xri_die "setup.sh failed"
	eval "$vars"
	[[ -f $XRI_KERNEL && -f $XRI_BASE ]] || xri_die "setup.sh gave no kernel/initramfs"
	export XRI_KERNEL XRI_BASE XRI_KVER
}

# A stable MAC from the IPv4 address's last byte (52:54:00 is qemu's prefix).
xri_guest_mac() {
	local ip=${1%/*}
	printf '52:54:00:c0:02:%02x' "${ip##*.}"
}

xri_guest_start() {
	local name=$1 tap=$2 ip4=$3 ip6=$4 mtu=$5 scenario=$6 outdir=$7 timeout=$8
	local initrd=$outdir/$name.initrd log=$outdir/$name.console tmp
	# TAP may list several taps (tap0,tap1): one NIC each, eth0, eth1, ... in the guest,
	# the n-th with MAC byte 4 = 2 + n.
	local nics=() t n=0 mac
	for t in ${tap//,/ }; do
		mac=$(xri_guest_mac "$ip4")
		mac=${mac/:c0:02:/:c0:$(printf %02x $((2 + n))):}
		nics+=(-netdev "tap,id=n$n,ifname=$t,script=no,downscript=no"
			-device "virtio-net-pci,netdev=n$n,mac=$mac")
		n=$((n + 1))
	done
	[[ -f $scenario ]] || xri_die "no scenario file $scenario"
	# The scenario goes in as a second cpio archive after the base image: the kernel
	# unpacks concatenated archives in order, so no rebuild of the base image is needed.
	tmp=$(mktemp -d /tmp/xri-scn.XXXXXX)
	install -m 755 "$scenario" "$tmp/scenario.sh"
	# Each archive must start 4-byte aligned (the kernel skips zero padding between them).
	cp "$XRI_BASE" "$initrd"
	truncate -s $((($(stat -c %s "$initrd") + 3) / 4 * 4)) "$initrd"
	# XRI_GUEST_EXTRA: one more prepared cpio archive (run-offload.sh: xrnic's binaries).
	if [[ -n ${XRI_GUEST_EXTRA:-} ]]; then
		cat "$XRI_GUEST_EXTRA" >>"$initrd"
		truncate -s $((($(stat -c %s "$initrd") + 3) / 4 * 4)) "$initrd"
	fi
	(cd "$tmp" && echo scenario.sh | cpio -o -H newc --quiet -R 0:0) >>"$initrd"
	rm -rf "$tmp"
	: >"$log"
	# no_timer_check: under TCG on a loaded host the kernel's check of the IO-APIC timer
	# can miss its ticks and panic ("IO-APIC + timer doesn't work!", seen here with two
	# guests and a build on two cores); the check finds nothing a virtual PC lacks.
	# The host-side limit covers boot (about 6 s under TCG) and poweroff on top of the
	# scenario's own timeout, enforced inside the guest.
	# Called directly (not via xri_ns) so that $! is the process chain ip -> timeout -> qemu
	# and xri_kill_pid reaches qemu through timeout, which forwards the signal.
	ip netns exec "$XRI_NS" timeout -k 5 $((timeout + 90)) \
		qemu-system-x86_64 -accel tcg -m "$XRI_GUEST_MEM" -smp 1 \
		-nodefaults -no-user-config -display none -monitor none -no-reboot \
		-serial "file:$log" \
		-kernel "$XRI_KERNEL" -initrd "$initrd" \
		-append "console=ttyS0 quiet loglevel=3 panic=-1 mitigations=off no_timer_check ${XRI_GUEST_APPEND:-} xr.name=$name xr.ip4=$ip4 xr.ip6=$ip6 xr.mtu=$mtu xr.timeout=$timeout" \
		"${nics[@]}" ${XRI_GUEST_QEMU_ARGS[@]+"${XRI_GUEST_QEMU_ARGS[@]}"} \
		>"$outdir/$name.qemu.log" 2>&1 &
	XRI_GUEST_PID[$name]=$!
	XRI_GUEST_LOG[$name]=$log
	xri_on_exit xri_kill_pid "${XRI_GUEST_PID[$name]}"
}

xri_guest_wait() {
	local name=$1 re=$2 timeout=$3
	xri_wait_for_pattern "${XRI_GUEST_LOG[$name]}" "$re" "$timeout" "${XRI_GUEST_PID[$name]}"
}

xri_guest_finish() {
	local name=$1 timeout=$2 line rc=255
	if xri_guest_wait "$name" '^XR-RESULT ' "$timeout"; then
		line=$(grep -a -m1 '^XR-RESULT ' "${XRI_GUEST_LOG[$name]}")
		rc=${line##*rc=}
		rc=${rc//[^0-9]/}
		# After the result the guest powers off at once; give it a few seconds.
		xri_wait_pid "${XRI_GUEST_PID[$name]}" 15 || xri_kill_pid "${XRI_GUEST_PID[$name]}"
	else
		xri_kill_pid "${XRI_GUEST_PID[$name]}"
	fi
	XRI_GUEST_RC[$name]=${rc:-255}
	[[ ${XRI_GUEST_RC[$name]} == 0 ]]
}

# guest.sh run ...: one guest in a fresh namespace; prints its console; exits with the
# scenario's status.
xri_guest_run_one() {
	local mtu=1500 ip4=192.0.2.11/24 ip6=fd00::11/64 timeout=120 out rc
	while (($#)); do
		case $1 in
		--mtu) mtu=$2; shift 2 ;;
		--ip4) ip4=$2; shift 2 ;;
		--ip6) ip6=$2; shift 2 ;;
		--timeout) timeout=$2; shift 2 ;;
		-*) xri_die "unknown option $1" ;;
		*) break ;;
		esac
	done
	(($# == 1)) || xri_die "usage: guest.sh run [--mtu M] [--ip4 A] [--ip6 A] [--timeout S] SCENARIO.sh"
	xri_need_root
	xri_trap_cleanup
	xri_guest_init
	out=$(mktemp -d /tmp/xri-guest.XXXXXX)
	xri_on_exit rm -rf "$out"
	xri_net_create "$mtu"
	xri_net_add_tap tap0 "$mtu"
	xri_guest_start solo tap0 "$ip4" "$ip6" "$mtu" "$1" "$out" "$timeout"
	rc=0
	xri_guest_finish solo $((timeout + 90)) || rc=$?
	cat "${XRI_GUEST_LOG[solo]}"
	exit "${XRI_GUEST_RC[solo]}"
}

if [[ ${BASH_SOURCE[0]} == "$0" ]]; then
	set -euo pipefail
	case ${1:-} in
	run) shift && xri_guest_run_one "$@" ;;
	*)
		echo "usage: $0 run [--mtu 1500|9000] [--ip4 A/24] [--ip6 A/64] [--timeout S] SCENARIO.sh" >&2
		exit 2
		;;
	esac
fi
