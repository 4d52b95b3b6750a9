# shellcheck shell=dash
# Helpers for scenario scripts inside the guest (busybox sh). Sourced by /init and by
# /scenario.sh.

# busybox sh runs its own applets before searching PATH, and busybox has small `ip` and
# `tc` applets; the scenarios need iproute2's (nodad, netem), so name them explicitly.
ip() { /usr/bin/ip "$@"; }
tc() { /usr/bin/tc "$@"; }

# xr_gid_index 4|6: index of rxe0's RoCE v2 GID for this guest's IPv4 (::ffff:a.b.c.d)
# or global IPv6 address; empty if absent. Read from sysfs, as ibv_devinfo -v shows it.
xr_gid_index() {
	local want addr d g t
	if [ "$1" = 4 ]; then
		addr=${XR_IP4%/*}
		# ::ffff:192.0.2.11 is written in sysfs as 0000:...:ffff:c000:020b.
		want=$(echo "$addr" | awk -F. '{ printf "0000:0000:0000:0000:0000:ffff:%02x%02x:%02x%02x", $1, $2, $3, $4 }')
	else
		want=$(xr_expand6 "${XR_IP6%/*}")
	fi
	[ -n "$want" ] || return 0
	for d in /sys/class/infiniband/rxe0/ports/1/gids/*; do
		g=$(cat "$d" 2>/dev/null) || continue
		[ "$g" = "$want" ] || continue
		t=$(cat /sys/class/infiniband/rxe0/ports/1/gid_attrs/types/"${d##*/}" 2>/dev/null)
		case $t in *v2*) echo "${d##*/}"; return 0 ;; esac
	done
}

# xr_expand6 ADDR: the 8 four-digit groups of an IPv6 address (no embedded IPv4).
xr_expand6() {
	echo "$1" | awk -F: '{
		n = 0; for (i = 1; i <= NF; i++) if ($i != "") n++
		out = ""; filled = 0
		for (i = 1; i <= NF; i++) {
			if ($i == "") {
				if (filled) continue
				for (j = 0; j < 8 - n; j++) out = out "0000:"
				filled = 1
			} else out = out sprintf("%04s:", $i)
		}
		gsub(/ /, "0", out); print substr(out, 1, length(out) - 1)
	}'
}

# xr_client CMD...: run a test tool's client side. The server guest boots at the same
# time, so its listening socket may not be there yet: retry (up to $XR_RETRIES times a
# second apart, default 30) only while the tool fails to connect, never after the RDMA
# part started.
xr_client() {
	local i=0 rc out=/tmp/xr-client.out
	while :; do
		"$@" >"$out" 2>&1
		rc=$?
		cat "$out"
		[ $rc -eq 0 ] && return 0
		# What ibv_*_pingpong / perftest ("Couldn't connect to ADDR:PORT", "Unable to open
		# file descriptor for socket connection") and rping (a CM REJECT: no listener yet)
		# print when the server is not listening; perftest -R's parameter-exchange REQ
		# refused (REJ 8): "Unable to connect (retries = 10)" from the bandwidth tools,
		# which retry it, "Unexpected CM event bl blka 8" from the latency tools, which do
		# not. "Couldn't connect to remote QP" (a failed QP transition) does not match:
		# that is a real failure.
		grep -qiE "couldn't connect to [0-9a-f.:]+:[0-9]+|unable to open file descriptor for socket|RDMA_CM_EVENT_REJECTED|unable to connect \(retries|unexpected CM event bl blka 8$" "$out" || return $rc
		i=$((i + 1))
		[ $i -lt "${XR_RETRIES:-30}" ] || return $rc
		echo "xr: server not listening yet, retry $i"
		sleep 1
	done
}

# xr_server CMD...: run the server side after saying so on the console.
xr_server() {
	echo "XR-SERVER-START $*"
	"$@"
}
