#!/usr/bin/env bash
# rdma-core's own test suite (Debian's python3-pyverbs, /usr/share/doc/rdma-core/tests) on
# three devices, side by side (docs/interop.md "Conformance: rdma-core's suite"):
#
#   xrnic    xrnic in process: `xrnic exec --netdev eth0` as root in a namespace of its own
#   service  xrnic through the device service: `xrnic up eth0` as root, the suite as the
#            unprivileged user nobody through `xrnic exec` (docs/service.md)
#   rxe      Linux rxe (rxe0) in the interop guest (Debian's 6.1 kernel, qemu TCG): the
#            host's file system shared read-only over virtio-9p, the suite run in a chroot
#            into it, so the guest runs the host's own python3, pyverbs and libibverbs
#
# First interop/conformance/selftest.py checks the harness on a fake suite. Each column
# runs interop/conformance/conformance.py `run` (a dead or hung run goes on with the tests
# left, the test it was in recorded as crash or timeout), then `report` prints the table,
# the totals and, as its last line, a JSON object.
#
#   conformance.sh [-o DIR] [--only xrnic,service,rxe] [--serial]
#
# -o DIR      output (default target/conformance): suite/ (the suite unpacked: Debian
#             gzips its larger files), COLUMN.jsonl (one record per test),
#             COLUMN.log (the suite's console), report.txt, rxe/guest.console
# --only      the columns to run (default all three)
# --serial    run the guest after the xrnic columns, not beside them
#
# Exit status: 0; 1 when a test fails, errors, crashes or hangs on xrnic (in process or
# through the service), unless XRNIC_CONFORMANCE_REPORT_ONLY=1; 2 when the harness
# itself fails (nothing to report). Root (namespaces, XDP, qemu).
#
# Environment: XRNIC_CONFORMANCE_IDLE (seconds without a test finishing before a run is
# killed: default 180 on the host, 3 times that in the guest), XRNIC_CONFORMANCE_GUEST_TIMEOUT
# (the guest's whole run, default 3600 s), XRNIC_BIN (default target/debug/xrnic).

set -euo pipefail
# The guest chroots into the host's root over 9p and runs the host's rdma-core there, so
# it stays on the bookworm flavour (the host's Debian 12; interop/setup.sh).
export XRI_FLAVOUR=bookworm
# shellcheck source=guest.sh
source "$(dirname "${BASH_SOURCE[0]}")/guest.sh"

REPO=$(cd "$XRI_DIR/.." && pwd)
PY=/usr/bin/python3 # Debian's: python3-pyverbs is built for it (not a pyenv or venv one)
SUITE_SRC=/usr/share/doc/rdma-core/tests
CONF=$XRI_DIR/conformance/conformance.py
IDLE=${XRNIC_CONFORMANCE_IDLE:-180}
GUEST_TIMEOUT=${XRNIC_CONFORMANCE_GUEST_TIMEOUT:-3600}
XRNIC=${XRNIC_BIN:-$REPO/target/debug/xrnic}
OUT=$REPO/target/conformance
ONLY=xrnic,service,rxe
SERIAL=

while (($#)); do
	case $1 in
	-o) OUT=$2; shift 2 ;;
	--only) ONLY=$2; shift 2 ;;
	--serial) SERIAL=1; shift ;;
	*) xri_die "usage: $0 [-o DIR] [--only xrnic,service,rxe] [--serial]" ;;
	esac
done
want() { [[ ,$ONLY, == *,$1,* ]]; }

xri_need_root
[[ -x $PY ]] && "$PY" -c 'import pyverbs' 2>/dev/null ||
	xri_die "$PY cannot import pyverbs: install python3-pyverbs (make deps)"
[[ -f $SUITE_SRC/run_tests.py ]] || xri_die "no $SUITE_SRC/run_tests.py (python3-pyverbs)"
if want xrnic || want service; then
	[[ -x $XRNIC ]] || xri_die "no $XRNIC: cargo build -p xrnic-cli -p xrnic-verbs"
	[[ -f $(dirname "$XRNIC")/libibverbs.so ]] ||
		xri_die "no $(dirname "$XRNIC")/libibverbs.so: cargo build -p xrnic-verbs"
fi
xri_trap_cleanup

# The harness itself first, on a fake suite (interop/conformance/selftest.py, ~6 s):
# every kind of outcome, a crash and a hang included, recorded as it must be.
"$PY" "$XRI_DIR/conformance/selftest.py" --python "$PY" >&2 || xri_die "the harness's self-test failed"

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -rf "$OUT/suite" "$OUT"/*.jsonl "$OUT"/*.jsonl.exclude "$OUT"/*.log "$OUT/rxe" "$OUT/service.stat"
# The suite as run_tests.py expects it: Debian compresses the doc directory's larger .py
# files (dh_compress), which the import system does not read.
cp -r "$SUITE_SRC" "$OUT/suite"
gunzip -f "$OUT"/suite/*.py.gz
chmod -R a+rX "$OUT"

# One harness network: a bridge for the guest's tap, a veth endpoint per xrnic column in
# its own namespace ($XRI_NS-x1, -x2, where the interface is eth0). The columns share
# nothing: each test talks to its own device only.
xri_net_create 1500
want xrnic && xri_net_add_veth x1 1500 192.0.2.101/24 fd00::101/64
want service && xri_net_add_veth x2 1500 192.0.2.102/24 fd00::102/64

# run_column NAME IDLE PREFIX... -- SUITE-ARGS...
run_column() {
	local name=$1 idle=$2 t0
	shift 2
	t0=$(xri_now)
	xri_log "$name: running the suite"
	"$PY" "$CONF" run --suite "$OUT/suite" --records "$OUT/$name.jsonl" \
		--log "$OUT/$name.log" --idle "$idle" --deadline "$GUEST_TIMEOUT" -- "$@" >&2 ||
		xri_log "$name: the harness failed (see $OUT/$name.log)"
	xri_log "$name: done in $(xri_elapsed "$t0") s"
}

column_xrnic() {
	run_column xrnic "$IDLE" ip netns exec "$XRI_NS-x1" "$XRNIC" exec --netdev eth0 -- \
		-- --dev xrnic_eth0 -v
}

column_service() {
	local ns=$XRI_NS-x2
	# The library must be readable by nobody, as the service tests require.
	setpriv --reuid=nobody --regid=nogroup --clear-groups test -r "$(dirname "$XRNIC")/libibverbs.so" ||
		xri_die "nobody cannot read $(dirname "$XRNIC")/libibverbs.so"
	# As root once: `xrnic exec` makes its libibverbs.so.1 link next to the binary.
	ip netns exec "$ns" "$XRNIC" exec --no-view -- true
	mkdir -p "$OUT/service.stat"
	ip netns exec "$ns" "$XRNIC" up eth0 --log "$OUT/service.daemon.log" \
		--stat-dir "$OUT/service.stat" >&2 || xri_die "xrnic up eth0 failed"
	xri_on_exit ip netns exec "$ns" "$XRNIC" down eth0
	run_column service "$IDLE" ip netns exec "$ns" \
		setpriv --reuid=nobody --regid=nogroup --clear-groups \
		"$XRNIC" exec --netdev eth0 -- -- --dev xrnic_eth0 -v
	ip netns exec "$ns" "$XRNIC" down eth0 >&2 || true
}

# The guest's part: the 9p and netfs modules (not in the base image) in an extra archive,
# and a scenario that mounts the host's root read-only at /host, this run's output
# directory writable over it, the guest's own proc, sys, dev and tmpfs for tmp and run,
# then runs conformance.py in a chroot into /host.
guest_prepare() {
	local stage=$OUT/rxe/stage kroot m
	mkdir -p "$stage/conf"
	kroot=$(dirname "$XRI_KERNEL")
	for m in 9pnet_virtio 9p; do
		modprobe -d "$kroot" -S "$XRI_KVER" --show-depends "$m"
	done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }' | while read -r m; do
		cp "$m" "$stage/conf/"
		basename "$m" >>"$stage/conf/modules"
	done
	(cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) \
		>"$OUT/rxe/extra.cpio"
	rm -rf "$stage"
	cat >"$OUT/rxe/scenario.sh" <<EOF
#!/bin/sh
OUT='$OUT'
CONF='$CONF'
IDLE='$((IDLE * 3))'
DEADLINE='$((GUEST_TIMEOUT - 120))'
EOF
	cat >>"$OUT/rxe/scenario.sh" <<'EOF'
set -e
# Modules the base image already loaded (virtio) are in /proc/modules.
while read -r m; do
	grep -q "^${m%.ko} " /proc/modules || insmod "/conf/$m"
done </conf/modules
mkdir -p /host
mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288,ro hostroot /host
mount -t 9p -o trans=virtio,version=9p2000.L,msize=524288 out "/host$OUT/rxe"
mount -t proc proc /host/proc
mount -t sysfs sysfs /host/sys
mount -o bind /dev /host/dev
mount -o bind /dev/pts /host/dev/pts
mkdir -p /dev/shm
mount -t tmpfs tmpfs /host/dev/shm
mount -t tmpfs tmpfs /host/tmp
mount -t tmpfs tmpfs /host/run
# rdma-core's suite finds a device's interface in /sys/class/infiniband/DEV/device/net/
# (tests/base.py), which Linux 6.1's rxe0 lacks: it has no parent device. Over the
# chroot's /sys/class/infiniband goes a tmpfs whose rxe0 holds a link to each entry
# of the real one, and device/net/eth0, a link to eth0 (rxe0's netdev).
real=$(readlink -f /sys/class/infiniband/rxe0)
if [ ! -e "$real/device/net" ]; then
	mount -t tmpfs tmpfs /host/sys/class/infiniband
	mkdir -p /host/sys/class/infiniband/rxe0/device/net
	for e in "$real"/*; do
		[ "${e##*/}" = device ] || ln -s "$e" /host/sys/class/infiniband/rxe0/
	done
	ln -s /sys/class/net/eth0 /host/sys/class/infiniband/rxe0/device/net/eth0
fi
ls -l /host/sys/class/infiniband/rxe0/device/net/
echo "XR-CONF start $(cut -d' ' -f1 /proc/uptime)"
chroot /host /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/tmp LANG=C.UTF-8 \
	/usr/bin/python3 "$CONF" run --suite "$OUT/suite" --records "$OUT/rxe/rxe.jsonl" \
	--log "$OUT/rxe/rxe.log" --idle "$IDLE" --deadline "$DEADLINE" -- -- --dev rxe0 -v
echo "XR-CONF end $(cut -d' ' -f1 /proc/uptime)"
sync
EOF
}

column_rxe_start() {
	xri_guest_init
	mkdir -p "$OUT/rxe"
	chmod 777 "$OUT/rxe"
	guest_prepare
	xri_net_add_tap tap0 1500
	XRI_GUEST_EXTRA=$OUT/rxe/extra.cpio
	XRI_GUEST_MEM=1024
	# multidevs=remap: the host's root spans several file systems; without it their
	# inode numbers could collide in the guest.
	XRI_GUEST_QEMU_ARGS=(
		-virtfs "local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap"
		-virtfs "local,path=$OUT/rxe,mount_tag=out,security_model=none,multidevs=remap"
	)
	RXE_T0=$(xri_now)
	xri_log "rxe: booting the guest (the suite under TCG takes many minutes)"
	xri_guest_start rxe tap0 192.0.2.11/24 fd00::11/64 1500 "$OUT/rxe/scenario.sh" \
		"$OUT/rxe" "$GUEST_TIMEOUT"
}

column_rxe_finish() {
	local rc=0
	xri_guest_finish rxe $((GUEST_TIMEOUT + 90)) || rc=$?
	cp "${XRI_GUEST_LOG[rxe]}" "$OUT/rxe/guest.console" 2>/dev/null || true
	xri_log "rxe: done in $(xri_elapsed "$RXE_T0") s, guest status ${XRI_GUEST_RC[rxe]}"
	((rc == 0)) || xri_log "rxe: the guest's run failed: $OUT/rxe/guest.console"
	[[ -f $OUT/rxe/rxe.jsonl ]] && cp "$OUT/rxe/rxe.jsonl" "$OUT/rxe.jsonl"
	[[ -f $OUT/rxe/rxe.log ]] && cp "$OUT/rxe/rxe.log" "$OUT/rxe.log"
	return 0
}

T0=$(xri_now)
if want rxe && [[ -z $SERIAL ]]; then column_rxe_start; fi
want xrnic && column_xrnic
want service && column_service
if want rxe; then
	[[ -n $SERIAL ]] && column_rxe_start
	column_rxe_finish
fi
xri_log "all columns done in $(xri_elapsed "$T0") s"

cols=()
for c in xrnic service rxe; do want "$c" && cols+=("$c=$OUT/$c.jsonl"); done
strict=(--strict)
[[ ${XRNIC_CONFORMANCE_REPORT_ONLY:-} == 1 ]] && strict=()
rc=0
"$PY" "$CONF" report "${strict[@]}" "${cols[@]}" >"$OUT/report.txt" || rc=$?
cat "$OUT/report.txt"
((rc <= 1)) || xri_die "report failed"
exit "$rc"
