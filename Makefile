# xrnic: the commands a newcomer needs. Every target first installs the Debian packages it
# needs and lacks (scripts/install-deps.sh: idempotent, silent when all are present), so it
# works on a fresh Debian 12 machine as root. A Rust toolchain (stable; nightly for `fuzz`)
# is assumed.
#
#   make demo        two xrnic devices in two namespaces: rc-pingpong, SEND/WRITE/READ/atomics,
#                    every byte verified, the traffic captured and its ICRCs checked (root)
#   make demo-decode build a capture of an RC exchange with the wire layer and decode it
#   make test        build (the fuzz targets too), all tests (tshark comparison included),
#                    clippy, rustfmt; as root also the tests marked "needs root" (CI=true
#                    requires root)
#   make test-loaded make test (as CI=true) with LOAD_HOGS busy loops (default: one per CPU)
#                    competing for the CPUs: how races that only a slow CI machine hits
#                    show up here (root, ~20 min on 2 cores)
#   make bench-wire  wire-layer benchmarks (criterion); figures into docs/results.md
#   make bench-transport  the transport engine per packet against its floor; figures into
#                    docs/results.md
#   make bench-net   xrnic against raw AF_XDP, kernel UDP and TCP on one veth pair, and
#                    WRITE over 1 to 10 000 QPs (root); figures into docs/results.md;
#                    XRNIC_BENCH_ONLY=a,h,... runs only those sections (benches/net.rs)
#   make demo-rnic   two xrnic devices on a veth pair: SEND, WRITE, READ, FETCH_ADD (root)
#   make verbs-lib   xrnic's libibverbs.so.1 (release): `target/release/xrnic exec -- PROGRAM`
#                    runs an unmodified libibverbs program on xrnic (docs/verbs-abi.md)
#   make deps        only install the Debian packages the build and tests need
#   make interop     xrnic rc-pingpong / perf against the stock ibv_rc_pingpong / ib_*_bw on
#                    Linux rxe in a qemu guest, both roles, IPv4/IPv6/fe80 GIDs, MTU
#                    1024/4096, loss, RNR; the same stock tools on both sides (xrnic
#                    through xrnic exec) and the C verbs suite on rxe0 against xrnic's
#                    output, on a Debian 12 guest (6.1, rdma-core 44) and on a Debian 13
#                    one (6.12, rdma-core 56 on both sides; INTEROP_TRIXIE_ROWS);
#                    then xrnic inside two Debian 6.1 guests (no iproute2,
#                    single-buffer AF_XDP) against xrnic and rxe, both roles
#                    (root, ~40-50 min; CI runs it after make test)
#   make bench-rxe   the same stock perftest over rxe0 and over xrnic (drop-in library) in
#                    the same two qemu guests, interleaved rounds: tables side by side, an
#                    SVG of bandwidth against size, a JSON line (root, ~15-30 min)
#   make bench-mpi   Open MPI (UCX) MPI_Allreduce, ring, 64 KiB to 32 MiB, over xrnic
#                    (rc_verbs) and over kernel TCP, p = 2 and 4 hosts (network namespaces
#                    on a bridge): times against the model 2(p-1)/p * S/B, drops and
#                    retransmissions, an SVG, a JSON line (root, ~5-15 min)
#   make interop-rxe two Linux rxe guests (qemu TCG) run the stock rdma-core/perftest tools
#                    against each other, captured and checked with xrnic decode (root, ~6 min)
#   make conformance rdma-core's own test suite (python3-pyverbs, 273 tests) on xrnic in
#                    process, on xrnic through the device service as nobody, and on rxe0
#                    in a qemu guest: a table test by test, totals, a JSON last line; fails
#                    when a test fails or errors on xrnic (XRNIC_CONFORMANCE_REPORT_ONLY=1:
#                    only report) (root, ~15 min)
#   make interop-offload  xrnic --device rxe0 (offload backend, libibverbs) in an rxe guest:
#                    the verbs API suite, rc-pingpong and perf against the software backend
#                    on the host, both directions, and the stock tools (root, ~1 min)
#   make dcqcn-lab   xrnic QPs through an ECN-marking bottleneck (htb 50mbit + red ecn in
#                    a qemu TCG guest), a ceiling run without congestion control, then
#                    2/4/8 QPs with and without DCQCN: figures checked against the
#                    goals, CSV time series and SVG plots in target/dcqcn-lab, the summary
#                    into docs/results.md (root, ~3 min after the release build)
#   make fuzz        run each fuzz target for FUZZ_SECONDS (cargo-fuzz, installed from
#                    crates.io when missing; the nightly toolchain)

SHELL := /bin/bash
CARGO ?= cargo
DEPS := scripts/install-deps.sh

# gcc links Rust binaries (and builds libFuzzer's C++ for `fuzz`). clang/llvm and the
# libbpf headers compile bpf/xrnic.bpf.c (build.rs); m4, libelf, zlib and pkg-config build
# the vendored libbpf/libxdp of libbpf-sys / libxdp-sys (xsk-rs, libbpf-rs).
DEB_BUILD := gcc g++ make clang llvm libc6-dev m4 libelf-dev zlib1g-dev pkg-config \
	linux-libc-dev libbpf-dev
# tshark: tests/tshark.rs compares our decoding with Wireshark's (required under CI=true).
# iproute2 (ip netns, veth), ping and setpriv: the AF_XDP / XDP / namespace tests (root).
# libibverbs-dev and librdmacm-dev: the headers tests/c/*.c build against
# (tests/verbs_abi_c.rs, tests/rdmacm_failures.rs, src/abi/tests/symbol_versions.rs;
# required under CI=true, the tests ignored without: build.rs, src/abi/build.rs).
# infiniband-diags: ibstat and ibstatus in the device view's test (tests/exec_devview.rs).
# python3-pyverbs: rdma-core's test suite, which `make conformance` runs
# (interop/conformance.sh).
DEB_TEST := tshark iproute2 iputils-ping util-linux libibverbs-dev librdmacm-dev \
	ibverbs-utils perftest rdmacm-utils ucx-utils infiniband-diags python3-pyverbs

# Open MPI and UCX's tools for `make bench-mpi` (benches/mpi/), python3 for its report.
DEB_MPI := openmpi-bin libopenmpi-dev ucx-utils python3 iproute2 iputils-ping util-linux

DEMO_PCAP ?= target/demo.pcapng
DEMO_WIRE_PCAP ?= target/demo-wire.pcapng
FUZZ_SECONDS ?= 300
FUZZ_TARGETS ?= frame decode_pcap engine gsi_relay

.PHONY: help deps verbs-lib demo demo-decode demo-rnic test test-loaded bench-wire bench-transport bench-net bench-rxe bench-mpi fuzz interop-setup interop-selftest interop-rxe interop interop-offload conformance dcqcn-lab

help:
	@sed -n 's/^#   //p' Makefile

deps:
	@$(DEPS) $(DEB_BUILD) $(DEB_TEST)

# The C-ABI library and the xrnic binary that execs programs on it (xrnic exec finds
# target/release/xrnic-verbs/libibverbs.so.1, made here).
verbs-lib:
	@$(DEPS) $(DEB_BUILD)
	$(CARGO) build --release -p xrnic-verbs
	$(CARGO) build --release --bin xrnic
	mkdir -p target/release/xrnic-verbs
	ln -sf ../libibverbs.so target/release/xrnic-verbs/libibverbs.so.1
	ln -sf ../libibverbs.so target/release/xrnic-verbs/librdmacm.so.1

# `xrnic demo` ends with "demo: all data verified (...)" or exits non-zero.
demo:
	@$(DEPS) $(DEB_BUILD) $(DEB_TEST)
	$(CARGO) run --quiet --release --bin xrnic -- demo --pcap $(DEMO_WIRE_PCAP)

demo-decode:
	@$(DEPS) $(DEB_BUILD)
	$(CARGO) build --quiet --bin xrnic --example write_capture
	$(CARGO) run --quiet --example write_capture -- $(DEMO_PCAP)
	@# --strict: exit 1 unless every packet parses and carries a correct ICRC.
	$(CARGO) run --quiet --bin xrnic -- decode --strict $(DEMO_PCAP)
	@echo "demo: all ICRCs ok (also try: cargo run -q -- decode --json $(DEMO_PCAP))"

demo-rnic:
	@$(DEPS) $(DEB_BUILD) $(DEB_TEST)
	$(CARGO) run --quiet --example rnic_veth
	$(CARGO) run --quiet --example rnic_veth -- 6 9000

# Tests that need root carry #[ignore = "needs root"] (docs/testing.md): as root `make test`
# runs them with the others (--include-ignored); not root they show as ignored, and under
# CI=true not being root is an error. The offload::* cases need an RDMA device: without one
# on this machine they are left out by name (offload_in_rxe_guest runs them in an rxe guest).
TEST_SKIP := $(if $(or $(XRNIC_RDMA_DEVICE),$(wildcard /sys/class/infiniband/*)),,--skip offload::)

test:
	@if [[ $$(id -u) != 0 && $${CI:-} == true ]]; then \
		echo "make test: CI=true needs root: the tests marked 'needs root' must run there" >&2; \
		exit 1; \
	fi
	@$(DEPS) $(DEB_BUILD) $(DEB_TEST)
	$(CARGO) build --workspace --all-targets
	@# Every fuzz target compiles (the fuzz crate is a workspace of its own, built here on
	@# stable without the sanitizer flags `make fuzz` adds), and passes clippy.
	$(CARGO) build --manifest-path fuzz/Cargo.toml
	$(CARGO) clippy --manifest-path fuzz/Cargo.toml -- -D warnings
	@if [[ $$(id -u) == 0 ]]; then \
		echo "$(CARGO) test --workspace --no-fail-fast -- --include-ignored $(TEST_SKIP)"; \
		$(CARGO) test --workspace --no-fail-fast -- --include-ignored $(TEST_SKIP); \
	else \
		echo "$(CARGO) test --workspace  (not root: the tests marked 'needs root' are ignored)"; \
		$(CARGO) test --workspace; \
	fi
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) fmt --all --check
	$(CARGO) fmt --manifest-path fuzz/Cargo.toml --check
	RUSTDOCFLAGS="-D warnings" $(CARGO) doc --no-deps --quiet

LOAD_HOGS ?= $(shell nproc)

# The busy loops run at normal priority and are killed however the run ends.
test-loaded:
	@hogs=(); for _ in $$(seq $(LOAD_HOGS)); do (while :; do :; done) & hogs+=($$!); done; \
	trap 'kill $${hogs[@]} 2>/dev/null' EXIT; \
	echo "test-loaded: $(LOAD_HOGS) busy loops: $${hogs[*]}"; \
	CI=true $(MAKE) --no-print-directory test

# Each benchmark target writes its figures into its section of docs/results.md
# (scripts/results.sh): the ratio report, not criterion's own groups.
RESULTS := scripts/results.sh
# Then the summary table of docs/performance.md follows results.md (src/cli/summary.rs).
SUMMARY = $(CARGO) run --quiet -p xrnic-cli --bin xrnic -- bench-summary

bench-wire:
	@$(DEPS) $(DEB_BUILD)
	@mkdir -p target
	set -o pipefail; $(CARGO) bench --bench wire | tee target/bench-wire.txt
	sed -n '/^ratios to bare_crc32/,/^{/p' target/bench-wire.txt | $(RESULTS) bench-wire "make bench-wire"
	$(SUMMARY)

bench-transport:
	@$(DEPS) $(DEB_BUILD)
	@mkdir -p target
	set -o pipefail; $(CARGO) bench --bench transport -- nomatch 2>&1 | tee target/bench-transport.txt
	grep '^transport:' target/bench-transport.txt | $(RESULTS) bench-transport "make bench-transport"
	$(SUMMARY)

bench-net:
	@$(DEPS) $(DEB_BUILD) $(DEB_TEST)
	@mkdir -p target
	$(CARGO) build --release -p xrnic-verbs
	$(CARGO) build --release --bin xrnic
	set -o pipefail; $(CARGO) bench --bench net | tee target/bench-net.txt
	sed -n '/^best of/,$$p' target/bench-net.txt | $(RESULTS) bench-net "make bench-net"
	$(SUMMARY)

# One target at a time at the lowest priority (shared machine); corpora seeded from
# ../shared/vectors by fuzz/seed.sh (fuzz/corpus is gitignored, never committed).
fuzz:
	@$(DEPS) $(DEB_BUILD) python3
	@rustup toolchain list | grep -q '^nightly' || { \
		echo "make fuzz: needs the nightly toolchain (rustup toolchain install nightly)" >&2; \
		exit 1; }
	@command -v cargo-fuzz >/dev/null || $(CARGO) install --locked cargo-fuzz
	fuzz/seed.sh
	@for t in $(FUZZ_TARGETS); do \
		echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
		nice -n 19 $(CARGO) +nightly fuzz run $$t -- -max_total_time=$(FUZZ_SECONDS) || exit 1; \
	done

# The rxe interop harness (docs/interop.md). interop/setup.sh installs its own packages
# (qemu, busybox, rdma-core tools, ...) and builds the guest image, cached.
interop-setup:
	interop/setup.sh >/dev/null
	XRI_FLAVOUR=trixie interop/setup.sh >/dev/null

interop-selftest: interop-setup
	interop/net.sh selftest 1500 && interop/net.sh selftest 9000

interop-rxe: interop-setup
	$(CARGO) build --quiet --bin xrnic
	interop/run-rxe-pair.sh -o target/interop

# The stock-tool scenarios run Debian's binaries on xrnic through the debug library that
# `cargo build -p xrnic-verbs` leaves beside target/debug/xrnic: on the bookworm guest
# (6.1's rxe, the host's rdma-core 44 on both sides), then on the trixie guest (6.12's rxe,
# rdma-core 56 on both sides; docs/interop.md "Guest flavours") the rows of
# INTEROP_TRIXIE_ROWS (shell globs; empty: all 76, about as long as the bookworm run,
# ~15 min): by default one or two rows of each tool, both roles, the fe80:: GID, MTU
# 4096, loss, UD/UC/SRQ, the rdmacm tools, the service and the C suite (~6 min).
# INTEROP_TRIXIE_HOST_TOOLS=host runs the host's rdma-core 44 against the 6.12 guest.
INTEROP_TRIXIE_ROWS ?= pp_xc_v4 pp_xs_ll pp_xs_m4096 write_bw_xc write_bw_xs read_bw_xc \
	read_bw_xs send_bw_xs atomic_bw_xc atomic_lat_xs write_lat_xc send_lat_xs \
	loss_write_bw_xc ud_pp_xc ud_send_bw_xs uc_pp_xs srq_pp_xs srq_send_bw_xc rping_xc \
	rping_xs ucmatose_xs udaddy_xc mckey_xc rdma_server_xc write_bw_cm_xs svc_pp_xc \
	svc_write_bw_xs svc_rping_xs verbs_suite
INTEROP_TRIXIE_HOST_TOOLS ?= trixie
interop: interop-setup
	$(CARGO) build --quiet --bin xrnic
	$(CARGO) build --quiet -p xrnic-verbs
	interop/run-xrnic-rxe.sh -o target/interop/xrnic
	interop/run-stock-rxe.sh -o target/interop/stock
	XRI_FLAVOUR=trixie XRI_HOST_TOOLS=$(INTEROP_TRIXIE_HOST_TOOLS) \
		interop/run-stock-rxe.sh -o target/interop/stock-trixie $(INTEROP_TRIXIE_ROWS)
	interop/run-rxe-pair.sh -x -o target/interop/guest

# rxe against xrnic with the same stock perftest in the same two guests (docs/interop.md);
# the release library and binary go into the guests. BENCH_RXE_ROUNDS interleaved rounds;
# BENCH_RXE_MTU the guests' link MTU (1500 or 9000). The report and JSON line go into
# docs/results.md.
BENCH_RXE_ROUNDS ?= 2
BENCH_RXE_MTU ?= 1500
bench-rxe: interop-setup verbs-lib
	@$(DEPS) python3
	$(CARGO) build --quiet --bin xrnic
	@mkdir -p target
	set -o pipefail; XRI_BENCH_MTU=$(BENCH_RXE_MTU) interop/bench-rxe.sh -o target/bench-rxe \
		-r $(BENCH_RXE_ROUNDS) | tee target/bench-rxe.txt
	sed -n '/^rxe ⟷ xrnic/,$$p' target/bench-rxe.txt | $(RESULTS) bench-rxe \
		"make bench-rxe BENCH_RXE_ROUNDS=$(BENCH_RXE_ROUNDS) BENCH_RXE_MTU=$(BENCH_RXE_MTU)"
	$(SUMMARY)

# MPI all-reduce over xrnic and over kernel TCP against the ring's cost model
# (docs/performance.md "All-reduce"): BENCH_MPI_REPS timed calls per figure (the median is
# reported). The table goes into docs/results.md, the plot into docs/bench-mpi.svg.
BENCH_MPI_REPS ?= 5
bench-mpi: verbs-lib
	@$(DEPS) $(DEB_BUILD) $(DEB_MPI)
	@mkdir -p target
	set -o pipefail; benches/mpi/bench-mpi.sh -o target/bench-mpi -r $(BENCH_MPI_REPS) | \
		tee target/bench-mpi.txt
	sed -n '/^ *p  *S  *transport/,$$p' target/bench-mpi.txt | grep -v '^plot:' | \
		$(RESULTS) bench-mpi "make bench-mpi BENCH_MPI_REPS=$(BENCH_MPI_REPS)"
	cp target/bench-mpi/allreduce.svg docs/bench-mpi.svg

interop-offload: interop-setup
	$(CARGO) build --quiet --bin xrnic
	interop/run-offload.sh -o target/interop/offload

# rdma-core's test suite side by side on xrnic (in process, through the service) and on
# rxe0 (docs/interop.md "Conformance: rdma-core's suite"); the debug binary and library.
conformance: interop-setup
	@$(DEPS) $(DEB_BUILD) $(DEB_TEST)
	$(CARGO) build --quiet --bin xrnic
	$(CARGO) build --quiet -p xrnic-verbs
	interop/conformance.sh -o target/conformance

# The DCQCN lab (docs/congestion.md): not in `make test` (a qemu guest, ~2 minutes, and its
# figures depend on the host having CPU for the guest). DCQCN_LAB_ARGS e.g.
# "--cc-param rp_ai_rate=1 -D 12".
DCQCN_LAB_ARGS ?=
dcqcn-lab: interop-setup
	@$(DEPS) python3
	$(CARGO) build --quiet --release --bin xrnic
	@# A run that misses a goal is a result too: its summary (with the MISS lines) goes into
	@# docs/results.md, then the target fails.
	rm -f target/dcqcn-lab/summary.txt
	interop/dcqcn-lab.sh -o target/dcqcn-lab $(DCQCN_LAB_ARGS); rc=$$?; \
	if [[ -s target/dcqcn-lab/summary.txt ]]; then \
		$(RESULTS) dcqcn-lab "make dcqcn-lab$(if $(DCQCN_LAB_ARGS), DCQCN_LAB_ARGS='$(DCQCN_LAB_ARGS)')" \
			<target/dcqcn-lab/summary.txt || rc=1; \
		$(SUMMARY) || rc=1; \
	fi; \
	exit $$rc
