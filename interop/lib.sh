# shellcheck shell=bash
# Common helpers of the xrnic interop harness: logging, timeouts, cleanup on exit.
# Source this file; do not run it. net.sh and guest.sh source it.
#
# Contract: every wait has a timeout; every resource a script creates is registered with
# xri_on_exit and released on normal exit, on failure (set -e) and on Ctrl-C / SIGTERM.

[[ -n ${XRI_LIB_LOADED:-} ]] && return 0
XRI_LIB_LOADED=1

# shellcheck disable=SC2034  # used by the scripts that source this file
XRI_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# Kernel, extracted packages and built initramfs images. Outside the work tree so a fresh
# checkout reuses them; override with XRNIC_INTEROP_CACHE.
# shellcheck disable=SC2034
XRI_CACHE=${XRNIC_INTEROP_CACHE:-/var/cache/xrnic-interop}
# The guest flavour (interop/setup.sh, docs/interop.md "Guest flavours"): bookworm (Debian
# 12's 6.1 kernel, the host's rdma-core 44 tools) or trixie (Debian 13's 6.12 kernel and its
# rdma-core 56 userland). 6.1 and 6.12 name them too.
case ${XRI_FLAVOUR:-bookworm} in
bookworm | 6.1) XRI_FLAVOUR=bookworm ;;
trixie | 6.12) XRI_FLAVOUR=trixie ;;
*)
	printf 'error: XRI_FLAVOUR=%s: want bookworm (6.1) or trixie (6.12)\n' "$XRI_FLAVOUR" >&2
	exit 2
	;;
esac
export XRI_FLAVOUR

xri_log() { printf '[%s] %s\n' "$(date +%T)" "$*" >&2; }
xri_die() {
	xri_log "error: $*"
	exit 1
}

xri_need_root() {
	[[ $(id -u) -eq 0 ]] || xri_die "must run as root (network namespaces, tap devices, qemu)"
}

# xri_perftest_refused FILE...: true when the output files show stock perftest's own
# refusal to measure: its clock calibration (get_cpu_mhz) gives up on a fit worse than
# r^2 0.9 ("Correlation coefficient r^2: X < 0.9", then "Can't produce a report"), which
# a busy host's preemptions cause. Not the stack's failure: the scenario runs again
# (XRI_MEASURE_ATTEMPTS in all; tests/common/mod.rs retry_perftest is the same rule).
XRI_MEASURE_ATTEMPTS=3
xri_perftest_refused() {
	local f
	for f in "$@"; do
		[[ -f $f ]] || continue
		if tr -d '\r' <"$f" | grep -aEq 'Correlation coefficient r\^2: [-+.0-9e]+ < 0\.9' &&
			grep -aq "Can't produce a report" "$f"; then
			return 0
		fi
	done
	return 1
}
# Monotonic-enough seconds with two decimals, for the report tables.
xri_now() { date +%s.%N; }
xri_elapsed() { awk -v a="$1" -v b="$(xri_now)" 'BEGIN { printf "%.1f", b - a }'; }

# --- cleanup stack ---------------------------------------------------------------------
# Commands run in reverse order of registration, once, whatever way the shell leaves.
XRI_CLEANUP=()
xri_on_exit() { XRI_CLEANUP+=("$*"); }
xri_run_cleanup() {
	local i
	trap - EXIT INT TERM
	for ((i = ${#XRI_CLEANUP[@]} - 1; i >= 0; i--)); do
		eval "${XRI_CLEANUP[i]}" >/dev/null 2>&1 || true
	done
	XRI_CLEANUP=()
}
xri_exit_trap() {
	xri_run_cleanup
	exit "$1"
}
xri_trap_cleanup() {
	trap 'xri_exit_trap $?' EXIT
	# Ctrl-C and kill: clean up, then exit with the conventional 128+signal status.
	trap 'xri_log "interrupted"; xri_run_cleanup; exit 130' INT
	trap 'xri_log "terminated"; xri_run_cleanup; exit 143' TERM
}

# xri_wait_for_pattern FILE EXTENDED-REGEX TIMEOUT_SECONDS [PID]
# Waits until FILE holds a line matching the regex. Returns 0 when found, 1 on timeout,
# 2 when PID (if given) exits before the line appears.
xri_wait_for_pattern() {
	local file=$1 re=$2 timeout=$3 pid=${4:-}
	local deadline=$((SECONDS + timeout))
	while ((SECONDS < deadline)); do
		if [[ -f $file ]] && grep -aqE -- "$re" "$file"; then
			return 0
		fi
		if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then
			# One last look: the line may have been written just before the exit.
			grep -aqE -- "$re" "$file" 2>/dev/null && return 0
			return 2
		fi
		sleep 0.2
	done
	return 1
}

# xri_wait_pid PID TIMEOUT_SECONDS: waits for a child to exit; 0 if it did, 1 on timeout.
xri_wait_pid() {
	local pid=$1 timeout=$2
	local deadline=$((SECONDS + timeout))
	while kill -0 "$pid" 2>/dev/null; do
		((SECONDS < deadline)) || return 1
		sleep 0.2
	done
	wait "$pid" 2>/dev/null || true
	return 0
}

# xri_kill_pid PID: TERM, then KILL after 3 s; only the given process.
xri_kill_pid() {
	local pid=$1
	kill -0 "$pid" 2>/dev/null || return 0
	kill -TERM "$pid" 2>/dev/null || true
	xri_wait_pid "$pid" 3 || kill -KILL "$pid" 2>/dev/null || true
	wait "$pid" 2>/dev/null || true
}
