#!/bin/sh
# Run one of Debian 13's rdma-core 56 / perftest programs on the host (Debian 12) from the
# unpacked trixie root of interop/setup.sh, with trixie's own loader and glibc (newer than
# the host's, so the host's loader cannot run them). Meant to run under `xrnic exec`: the
# LD_LIBRARY_PATH it sets (xrnic's drop-in libibverbs.so.1 / librdmacm.so.1 first) comes
# before the root's libraries, so the program runs on xrnic (docs/interop.md, "Guest
# flavours").
#
#   trixie-run.sh ROOT PROGRAM [ARGS...]     ROOT: `XRI_FLAVOUR=trixie setup.sh --host-root`
#   e.g. xrnic exec --netdev eth0 -- interop/trixie-run.sh "$ROOT" ibv_devinfo -v
set -eu
[ $# -ge 2 ] || {
	echo "usage: $0 ROOT PROGRAM [ARGS...]" >&2
	exit 2
}
root=$1 prog=$2
shift 2
lib=$root/usr/lib/x86_64-linux-gnu
[ -x "$lib/ld-linux-x86-64.so.2" ] || {
	echo "$0: no trixie loader in $root" >&2
	exit 2
}
for d in usr/bin usr/sbin; do
	if [ -x "$root/$d/$prog" ]; then
		# ld.so --library-path replaces LD_LIBRARY_PATH, so it carries xrnic exec's first.
		# --argv0: the program sees its usual name.
		exec "$lib/ld-linux-x86-64.so.2" --library-path "${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$lib" \
			--argv0 "$prog" "$root/$d/$prog" "$@"
	fi
done
echo "$0: no $prog in $root" >&2
exit 127
