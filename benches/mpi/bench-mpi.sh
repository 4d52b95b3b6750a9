#!/usr/bin/env bash
# MPI over xrnic against MPI over kernel TCP, the seed's yardstick: ring all-reduce against
# its cost model T = 2(p-1)/p * S/B (docs/performance.md "All-reduce").
#
#   benches/mpi/bench-mpi.sh [-o OUTDIR] [-r REPS] [-p "2 4"]
#     -o OUTDIR  where the job outputs, stat snapshots, CSV, SVG and report go
#                (default target/bench-mpi)
#     -r REPS    timed repetitions of each figure (default $XRNIC_MPI_REPS or 5): the
#                table gives the median
#     -p LIST    the numbers of hosts (default "2 4")
#
# Hosts are network namespaces (xm<N>-1 ... xm<N>-4, N this script's pid) on a bridge in a
# namespace of its own (xm<N>-br, 192.0.2.254/24, where mpirun runs), MTU 9000; each host
# has one interface, m0 (192.0.2.H/24; a short name, UCX keeps 15 characters of a device's
# name: xrnic_m0). Open MPI 4.1 starts its daemons through an rsh agent that enters the
# host's namespace and gives it the host's name (a UTS namespace), one rank per host.
# Each p runs twice on the same links:
#   xrnic  each rank under `xrnic exec --netdev m0`, UCX_TLS=rc_verbs,ud_verbs,self
#          (RC for the data, UD for UCX's wire-up), UCX_NET_DEVICES=xrnic_m0:1
#   tcp    each rank as it is, UCX_TLS=tcp,self, UCX_NET_DEVICES=m0
# Nothing else is set in UCX: its default protocols (rendezvous by RDMA READ on rc_verbs).
# benches/mpi/allreduce.c measures B (rank 0 streaming to rank 1) and MPI_Allreduce
# (float sum, Open MPI's ring: coll_tuned_allreduce_algorithm 4) of 64 KiB, 1 MiB, 8 MiB
# and 32 MiB, each result checked. xrnic's devices write their last counters
# (XRNIC_FINAL_STAT_DIR): kernel_rx_dropped and retransmitted_packets, summed per job.
# Knobs: XRNIC (the xrnic binary; default target/release/xrnic, `make verbs-lib`, its
# library beside it in xrnic-verbs/), XRNIC_MPI_TIMEOUT (seconds per job, default 600),
# XRNIC_MPI_TRANSPORTS (default "xrnic tcp"), XRNIC_MPI_ONE_CPU (default 1: the smallest
# p once more per transport with every rank on CPU 0, what sharing a core costs).
# Prints the table, writes OUTDIR/allreduce.svg, ends with one JSON line. Exit status 0
# when every job ran and every result was right.

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT=$ROOT/target/bench-mpi
REPS=${XRNIC_MPI_REPS:-5}
PS="2 4"
TIMEOUT=${XRNIC_MPI_TIMEOUT:-600}
TRANSPORTS=${XRNIC_MPI_TRANSPORTS:-xrnic tcp}
ONE_CPU=${XRNIC_MPI_ONE_CPU:-1}
XRNIC=${XRNIC:-$ROOT/target/release/xrnic}
MTU=9000

usage() {
	sed -n '2,35s/^# \{0,1\}//p' "$0" >&2
	exit 2
}
while getopts "o:r:p:h" opt; do
	case $opt in
	o) OUT=$OPTARG ;;
	r) REPS=$OPTARG ;;
	p) PS=$OPTARG ;;
	*) usage ;;
	esac
done
die() {
	echo "bench-mpi: $*" >&2
	exit 1
}
log() { echo "bench-mpi: $*" >&2; }
[[ $REPS =~ ^[1-9][0-9]*$ ]] || die "REPS must be a positive number, not '$REPS'"
MAXP=0
for p in $PS; do
	[[ $p =~ ^[2-9]$ ]] || die "p must be 2 to 9, not '$p'"
	((p > MAXP)) && MAXP=$p
done
[[ $(id -u) == 0 ]] || die "needs root (network namespaces, AF_XDP)"
for tool in mpicc mpirun ip unshare taskset timeout python3; do
	command -v "$tool" >/dev/null || die "$tool missing (make bench-mpi installs it)"
done
[[ -x $XRNIC ]] || die "$XRNIC missing: make verbs-lib"
[[ -e $(dirname "$XRNIC")/libibverbs.so ]] || die "$(dirname "$XRNIC")/libibverbs.so missing: make verbs-lib"

mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
rm -rf "$OUT"/jobs
mkdir -p "$OUT/jobs"
mpicc -O2 -Wall -Wextra -o "$OUT/allreduce" "$HERE/allreduce.c"

# --- hosts ----------------------------------------------------------------------------
PFX=xm$$
BR=$PFX-br
HOSTS=()
for ((h = 1; h <= MAXP; h++)); do HOSTS+=("$PFX-$h"); done

# shellcheck disable=SC2317  # called by the EXIT trap
cleanup() {
	local ns pids
	for ns in "${HOSTS[@]}" "$BR"; do
		[[ -e /run/netns/$ns ]] || continue
		pids=$(ip netns pids "$ns" 2>/dev/null || true)
		# shellcheck disable=SC2086  # a list of pids
		[[ -z $pids ]] || kill -9 $pids 2>/dev/null || true
		ip netns del "$ns" 2>/dev/null || true
	done
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# Namespaces an earlier run left behind when it was killed (SIGKILL runs no trap): their
# script's pid is gone.
for f in /run/netns/xm*-br; do
	[[ -e $f ]] || continue
	old=${f#/run/netns/xm}
	old=${old%-br}
	if [[ ! $old =~ ^[0-9]+$ ]] || kill -0 "$old" 2>/dev/null; then
		continue
	fi
	for ns in /run/netns/xm"$old"-*; do
		pids=$(ip netns pids "${ns#/run/netns/}" 2>/dev/null || true)
		# shellcheck disable=SC2086
		[[ -z $pids ]] || kill -9 $pids 2>/dev/null || true
		ip netns del "${ns#/run/netns/}" 2>/dev/null || true
	done
done

ip netns add "$BR"
ip -n "$BR" link set lo up
ip -n "$BR" link add br0 mtu $MTU type bridge stp_state 0 forward_delay 0
ip -n "$BR" addr add 192.0.2.254/24 dev br0
ip -n "$BR" link set br0 up
for ((h = 1; h <= MAXP; h++)); do
	ns=${HOSTS[h - 1]}
	ip netns add "$ns"
	ip -n "$ns" link set lo up
	ip link add m0 netns "$ns" mtu $MTU type veth peer name "p$h" netns "$BR" mtu $MTU
	ip -n "$BR" link set "p$h" master br0 up
	ip -n "$ns" addr add "192.0.2.$h/24" dev m0
	ip -n "$ns" link set m0 up
done
for ((h = 1; h <= MAXP; h++)); do
	ip netns exec "$BR" ping -c 1 -W 5 "192.0.2.$h" >/dev/null || die "host $h unreachable"
done

# The rsh agent: `AGENT HOST COMMAND...` runs COMMAND (an ssh-style command line, one
# shell string) in HOST's namespace under the hostname HOST, as ssh would on a host of
# its own; Open MPI and UCX then see p hosts.
AGENT=$OUT/rsh-agent
cat >"$AGENT" <<'AG'
#!/bin/sh
h=$1
shift
set -- ip netns exec "$h" unshare --uts sh -c 'hostname "$1" && shift && exec sh -c "$*"' agent "$h" "$@"
[ -z "$XRNIC_MPI_AGENT_CPU" ] || set -- taskset -c "$XRNIC_MPI_AGENT_CPU" "$@"
exec "$@"
AG
chmod +x "$AGENT"

# --- jobs -----------------------------------------------------------------------------
FAILED=0
# One mpirun; its output in jobs/P-TRANSPORT.{out,err}.
# job P TRANSPORT [CPU]: with CPU, every rank and daemon runs on that one CPU (the agent's
# taskset), the job's output in jobs/P-TRANSPORT-1cpu.*.
job() {
	local p=$1 tr=$2 cpu=${3:-} hosts name stat env=() cmd=()
	hosts=$(IFS=,; echo "${HOSTS[*]:0:p}")
	name=$OUT/jobs/$p-$tr${cpu:+-1cpu}
	stat=$name.stat
	mkdir -p "$stat"
	# shellcheck disable=SC2054  # the commas are UCX's list separators
	case $tr in
	xrnic)
		env=(-x UCX_TLS=rc_verbs,ud_verbs,self -x UCX_NET_DEVICES=xrnic_m0:1 -x XRNIC_FINAL_STAT_DIR="$stat")
		cmd=("$XRNIC" exec --netdev m0 --)
		;;
	tcp)
		env=(-x UCX_TLS=tcp,self -x UCX_NET_DEVICES=m0)
		;;
	esac
	log "p=$p $tr${cpu:+ on CPU $cpu}: mpirun on $hosts"
	# pml_ucx_tls / pml_ucx_devices any: Open MPI 4.1's UCX PML declines a job whose UCX
	# transports are none of pml_ucx_tls (rc_verbs, ud_verbs, rc_mlx5, ...: tcp is not
	# one), and ranks itself below ob1 when no device's driver (sysfs device/driver)
	# matches pml_ucx_devices (mlx*: xrnic's device has none); docs/performance.md
	# "All-reduce". btl ^openib: the verbs BTL is not used with the UCX PML. bind-to none:
	# Open MPI binds the ranks of a job of up to 2 ranks to a core each, the first of its
	# host, and every host's first core is this machine's CPU 0.
	local rc=0
	XRNIC_MPI_AGENT_CPU=$cpu ip netns exec "$BR" timeout -k 10 "$TIMEOUT" mpirun --allow-run-as-root --oversubscribe \
		-np "$p" --host "$hosts" --map-by node --bind-to none \
		--mca plm_rsh_agent "$AGENT" --mca plm_rsh_no_tree_spawn 1 \
		--mca oob_tcp_if_include 192.0.2.0/24 --mca btl ^openib \
		--mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any \
		--mca coll_tuned_use_dynamic_rules 1 --mca coll_tuned_allreduce_algorithm 4 \
		--mca mpi_yield_when_idle 1 \
		"${env[@]}" "${cmd[@]}" "$OUT/allreduce" -r "$REPS" \
		>"$name.out" 2>"$name.err" </dev/null || rc=$?
	if ((rc != 0)); then
		# 124: the timeout (docs/performance.md "All-reduce").
		log "p=$p $tr: mpirun failed (exit $rc), see $name.err"
		tail -20 "$name.err" >&2
		FAILED=$((FAILED + 1))
	fi
	# Ranks a timeout left behind.
	for ns in "${HOSTS[@]}"; do
		pids=$(ip netns pids "$ns" || true)
		# shellcheck disable=SC2086
		[[ -z $pids ]] || kill -9 $pids 2>/dev/null || true
	done
}

log "$(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg), $REPS repetitions, p in $PS, output in $OUT"
for p in $PS; do
	for tr in $TRANSPORTS; do
		job "$p" "$tr"
	done
done
# What sharing a core costs: the smallest p again with all its ranks on one CPU (p = 2 on
# one CPU is two ranks per core, as p = 4 on two CPUs).
if [[ $ONE_CPU == 1 ]]; then
	for tr in $TRANSPORTS; do
		job "${PS%% *}" "$tr" 0
	done
fi

python3 "$HERE/report.py" "$OUT" || FAILED=$((FAILED + 1))
exit $((FAILED > 0))
