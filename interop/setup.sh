#!/usr/bin/env bash
# Prepare the host for the rxe interop harness; idempotent, safe to re-run.
#
#   1. installs the Debian packages the harness uses (only those missing);
#   2. downloads the guest kernel's .deb and extracts it into the cache (the package is NOT
#      installed on the host: the host keeps its own kernel);
#   3. builds the guest's base initramfs: busybox, the rxe/netem modules with their
#      dependencies, rdma-core's verbs tools, perftest, rdmacm-utils, iproute2 (ip, tc,
#      rdma) with the libraries they link, the rxe provider, and guest/init.
#
# Two guest flavours (XRI_FLAVOUR, docs/interop.md "Guest flavours"):
#   bookworm (default; also "6.1")  Debian 12's newest linux-image-6.1.0-*-amd64, and the
#            HOST's own rdma-core / perftest / iproute2 binaries with the libraries ldd names.
#   trixie   (also "6.12")  Debian 13's newest linux-image-6.12.*-amd64 and Debian 13's
#            userland: rdma-core 56, perftest, iproute2, busybox and the glibc they link
#            (newer than the host's, so nothing of the host's goes in). Fetched through an
#            apt configuration of the harness's own under $XRI_CACHE/trixie/apt (its own
#            sources list, package lists, cache and an empty dpkg status, so apt resolves
#            the whole dependency closure); the host's apt sources are not touched. The
#            .debs are unpacked with dpkg-deb -x into a root (no maintainer scripts: the
#            guest runs no services and needs only files), which is smaller and faster to
#            make than a debootstrap'ed system and holds exactly the closure of the tools.
#            The same root serves `interop/setup.sh --host-root`: rdma-core 56's own tools
#            run on the host against xrnic (docs/interop.md).
# The image is cached under a key made of every input's version, so a re-run that changed
# nothing takes a second. Prints the paths as shell assignments (XRI_KERNEL=..., XRI_BASE=...)
# on stdout; everything else goes to stderr.
#
# Environment: XRNIC_INTEROP_CACHE (default /var/cache/xrnic-interop), XRI_FLAVOUR
# (bookworm or trixie), XRI_KERNEL_PKG (force a linux-image package name), XRI_NO_INSTALL=1
# (fail instead of installing).
#
#   setup.sh               prints XRI_KERNEL=..., XRI_BASE=..., XRI_KVER=..., XRI_FLAVOUR=...
#   setup.sh --host-root   (trixie) prints XRI_TRIXIE_ROOT=DIR: the unpacked userland

set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
xri_need_root

PACKAGES=(qemu-system-x86 busybox-static cpio kmod xz-utils zstd rdma-core ibverbs-utils ibverbs-providers
	perftest rdmacm-utils iproute2 tshark)

# Modules the guest loads; their dependencies are added by modprobe --show-depends.
MODULES=(configfs crc32_generic udp_tunnel ip6_udp_tunnel ib_core ib_uverbs rdma_rxe ib_cm
	iw_cm rdma_cm rdma_ucm virtio_pci virtio_net sch_netem sch_red
	bridge sch_htb cls_u32) # bridge (with stp, llc), htb and u32: the DCQCN lab's switch

# Guest programs (host paths). Libraries come from ldd.
PROGRAMS=(/usr/bin/ibv_devinfo /usr/bin/ibv_devices /usr/bin/ibv_rc_pingpong
	/usr/bin/ibv_uc_pingpong /usr/bin/ibv_ud_pingpong /usr/bin/ibv_srq_pingpong
	/usr/bin/ib_write_bw /usr/bin/ib_read_bw /usr/bin/ib_send_bw /usr/bin/ib_atomic_bw
	/usr/bin/ib_write_lat /usr/bin/ib_read_lat /usr/bin/ib_send_lat /usr/bin/ib_atomic_lat
	/usr/bin/rping /usr/bin/ucmatose /usr/bin/udaddy /usr/bin/rdma /sbin/ip /sbin/tc)
# dlopen()ed, so ldd of the programs does not list them: the rxe verbs provider, and
# libgcc_s that glibc loads for pthread_cancel (rping).
EXTRA_LIBS=(/usr/lib/x86_64-linux-gnu/libibverbs/librxe-rdmav34.so
	/lib/x86_64-linux-gnu/libgcc_s.so.1)

install_packages() {
	local missing=() p
	for p in "${PACKAGES[@]}"; do
		dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" ||
			missing+=("$p")
	done
	((${#missing[@]} == 0)) && return 0
	[[ -z ${XRI_NO_INSTALL:-} ]] || xri_die "missing packages: ${missing[*]}"
	xri_log "installing ${missing[*]}"
	# tshark asks whether non-root users may capture; the harness runs as root, so no.
	echo "wireshark-common wireshark-common/install-setuid boolean false" | debconf-set-selections
	# Refresh the package lists once a day at most, then install.
	if [[ -z $(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 -print -quit) ]]; then
		apt-get update -q >&2
	fi
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q -o DPkg::Lock::Timeout=600 \
		--no-install-recommends "${missing[@]}" >&2
}

# The flavour's apt commands and kernel package pattern. bookworm: the host's own apt.
# trixie: apt with a configuration of its own (see the header), which apt-get update fills.
APT_GET=(apt-get)
APT_CACHE=(apt-cache)
case $XRI_FLAVOUR in
bookworm) KPATTERN='^linux-image-6\.1\.0-[0-9]+-amd64$' ;;
trixie) KPATTERN='^linux-image-6\.12\.[0-9]+\+deb13-amd64$' ;;
esac
TRIXIE_APT=$XRI_CACHE/trixie/apt
# The rdma-core 56 userland of the trixie guest (and of --host-root); apt adds the closure.
TRIXIE_PACKAGES=(libibverbs1 ibverbs-providers ibverbs-utils librdmacm1t64 rdmacm-utils perftest
	iproute2 busybox-static libgcc-s1)
# The packages whose programs go into the guest (their libraries follow).
TRIXIE_TOOL_PACKAGES=(ibverbs-utils rdmacm-utils perftest iproute2 busybox-static)

trixie_apt_setup() {
	local o=(-o "Dir::Etc::sourcelist=$TRIXIE_APT/sources.list" -o Dir::Etc::sourceparts=-
		-o "Dir::State::Lists=$TRIXIE_APT/lists" -o "Dir::Cache=$TRIXIE_APT/cache"
		-o "Dir::State::status=$TRIXIE_APT/status" -o Debug::NoLocking=1
		-o APT::Get::List-Cleanup=0)
	APT_GET=(apt-get "${o[@]}")
	APT_CACHE=(apt-cache "${o[@]}")
	mkdir -p "$TRIXIE_APT"/{lists/partial,cache/archives/partial}
	chown -R _apt "$TRIXIE_APT/lists/partial" "$TRIXIE_APT/cache/archives/partial" 2>/dev/null || true
	# Empty: apt must see nothing installed, so the closure includes libc6 and the rest.
	[[ -f $TRIXIE_APT/status ]] || : >"$TRIXIE_APT/status"
	echo "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian trixie main" \
		>"$TRIXIE_APT/sources.list"
	# The package lists, refreshed once a day at most.
	if [[ -z $(find "$TRIXIE_APT/lists" -maxdepth 1 -name '*trixie*Packages*' -mtime -1 -print -quit) ]]; then
		xri_log "apt-get update (trixie, harness-private lists in $TRIXIE_APT)"
		"${APT_GET[@]}" update -q >&2
	fi
}

# Sets KPKG, KVER (uname -r of the guest) and KROOT (extracted package tree).
fetch_kernel() {
	KPKG=${XRI_KERNEL_PKG:-}
	if [[ -z $KPKG ]]; then
		KPKG=$("${APT_CACHE[@]}" search --names-only "$KPATTERN" | awk '{print $1}' | sort -V | tail -1)
		if [[ -z $KPKG && $XRI_FLAVOUR == bookworm ]]; then
			apt-get update -q >&2
			KPKG=$(apt-cache search --names-only "$KPATTERN" | awk '{print $1}' | sort -V | tail -1)
		fi
	fi
	[[ -n $KPKG ]] || xri_die "no package matching $KPATTERN known to apt ($XRI_FLAVOUR)"
	KVER=${KPKG#linux-image-}
	KROOT=$XRI_CACHE/kernel/$KVER
	if [[ ! -f $KROOT/boot/vmlinuz-$KVER || ! -f $KROOT/lib/modules/$KVER/modules.dep ]]; then
		xri_log "fetching $KPKG"
		local tmp
		tmp=$(mktemp -d "$XRI_CACHE/dl.XXXXXX")
		# apt downloads as its _apt user, which must be able to write there.
		chown _apt "$tmp" 2>/dev/null || true
		(cd "$tmp" && "${APT_GET[@]}" download -q "$KPKG" >&2)
		rm -rf "$KROOT.part"
		mkdir -p "$KROOT.part"
		dpkg-deb -x "$tmp"/"$KPKG"_*.deb "$KROOT.part"
		dpkg-deb -f "$tmp"/"$KPKG"_*.deb Version >"$KROOT.part/.deb-version"
		rm -rf "$tmp"
		# Debian 13's kernel package is merged-/usr (usr/lib/modules); depmod -b and
		# modprobe -d look in lib/modules.
		if [[ ! -e $KROOT.part/lib && -d $KROOT.part/usr/lib/modules ]]; then
			ln -s usr/lib "$KROOT.part/lib"
		fi
		# The package ships no modules.dep (the postinst makes it); build it here.
		depmod -b "$KROOT.part" "$KVER"
		rm -rf "$KROOT"
		mv "$KROOT.part" "$KROOT"
	fi
	if [[ ! -f $KROOT/vmlinux ]]; then
		extract_vmlinux "$KROOT/boot/vmlinuz-$KVER" "$KROOT/vmlinux"
	fi
}

# Sets TROOT: TRIXIE_PACKAGES and their dependency closure, unpacked. apt resolves the
# closure against the empty status (a simulated install lists it), apt-get download
# fetches exactly those versions; the root is cached under the hash of that list.
fetch_trixie_root() {
	local list key tmp
	list=$("${APT_GET[@]}" -s -q install --no-install-recommends "${TRIXIE_PACKAGES[@]}" |
		awk '$1 == "Inst" { v = $3; gsub(/[()]/, "", v); print $2 "=" v }' | LC_ALL=C sort)
	[[ -n $list ]] || xri_die "apt resolved no trixie packages"
	key=$(echo "$list" | sha256sum | cut -c1-16)
	TROOT=$XRI_CACHE/trixie/root-$key
	TROOT_LIST=$list
	[[ -f $TROOT/.packages ]] && return 0
	xri_log "fetching and unpacking $(echo "$list" | wc -l) trixie packages"
	tmp=$(mktemp -d "$XRI_CACHE/dl.XXXXXX")
	chown _apt "$tmp" 2>/dev/null || true
	local pkgs
	mapfile -t pkgs <<<"$list"
	(cd "$tmp" && "${APT_GET[@]}" download -q "${pkgs[@]}" >&2)
	rm -rf "$TROOT.part"
	mkdir -p "$TROOT.part"
	local deb
	mkdir -p "$TROOT.part/.files"
	for deb in "$tmp"/*.deb; do
		dpkg-deb -x "$deb" "$TROOT.part"
		dpkg-deb -c "$deb" | awk '{ print $6 }' >"$TROOT.part/.files/$(dpkg-deb -f "$deb" Package)"
	done
	rm -rf "$tmp"
	echo "$list" >"$TROOT.part/.packages"
	rm -rf "$TROOT"
	mv "$TROOT.part" "$TROOT"
	# Roots of other package sets, unused for a day.
	find "$XRI_CACHE/trixie" -maxdepth 1 -name 'root-*' ! -path "$TROOT" -mtime +1 -exec rm -rf {} +
}

# extract_vmlinux BZIMAGE OUT: the uncompressed ELF kernel inside a bzImage. Debian 12's is
# XZ-compressed, Debian 13's zstd-compressed (CONFIG_KERNEL_ZSTD), and under TCG the
# bzImage's own decompressor (after SeaBIOS) takes about 10 s; qemu boots the ELF directly
# through its PVH entry point (CONFIG_PVH=y) instead.
extract_vmlinux() {
	local in=$1 out=$2 off
	# The decompressors stop with an error at the bytes after the stream; the stream
	# itself is complete.
	off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$in" | head -1 | cut -d: -f1 || true)
	if [[ -n $off ]]; then
		tail -c +$((off + 1)) "$in" | xz -dc >"$out.part" 2>/dev/null || true
	else
		off=$(LC_ALL=C grep -obUaP '\x28\xb5\x2f\xfd' "$in" | head -1 | cut -d: -f1 || true)
		[[ -n $off ]] || xri_die "no XZ or zstd stream in $in"
		tail -c +$((off + 1)) "$in" | zstd -dcq >"$out.part" 2>/dev/null || true
	fi
	[[ $(head -c 4 "$out.part" | od -An -c | tr -d ' ') == 177ELF ]] ||
		xri_die "could not extract vmlinux from $in"
	mv "$out.part" "$out"
}

pkg_version() { dpkg-query -W -f='${Version}' "$1"; }

# The cache key: versions of everything that goes into the image, and this builder.
image_key() {
	{
		echo "$XRI_FLAVOUR $KPKG $(cat "$KROOT/.deb-version")"
		if [[ $XRI_FLAVOUR == trixie ]]; then
			echo "$TROOT_LIST"
		else
			for p in busybox-static ibverbs-utils ibverbs-providers libibverbs1 librdmacm1 \
				perftest rdmacm-utils iproute2 libc6; do
				echo "$p $(pkg_version "$p")"
			done
		fi
		sha256sum "$XRI_DIR/setup.sh" "$XRI_DIR/guest/init" "$XRI_DIR/guest/xr-funcs.sh"
	} | sha256sum | cut -c1-16
}

# stage_host_userland STAGE (bookworm): the host's programs and every library they (and
# the dlopen()ed extras) link.
stage_host_userland() {
	local stage=$1 p lib
	for p in "${PROGRAMS[@]}"; do
		[[ -x $p ]] || xri_die "missing $p"
		cp -L "$p" "$stage/usr/bin/"
	done
	for lib in "${EXTRA_LIBS[@]}"; do
		[[ -f $lib ]] || xri_die "missing $lib"
	done
	mkdir -p "$stage/usr/lib/x86_64-linux-gnu/libibverbs"
	cp -L "${EXTRA_LIBS[0]}" "$stage/usr/lib/x86_64-linux-gnu/libibverbs/"
	cp -L /etc/libibverbs.d/rxe.driver "$stage/etc/libibverbs.d/"
	{
		ldd "${PROGRAMS[@]}" "${EXTRA_LIBS[@]}" 2>/dev/null |
			awk '$2 == "=>" && $3 ~ /^\// { print $3 } $1 ~ /^\/.*[^:]$/ { print $1 }'
		echo "${EXTRA_LIBS[1]}"
	} | sort -u | while read -r lib; do
		case $lib in
		/lib64/*) mkdir -p "$stage/usr/lib64" && cp -L "$lib" "$stage/usr/lib64/" ;;
		*) cp -L "$lib" "$stage/usr/lib/x86_64-linux-gnu/" ;;
		esac
	done
	cp /bin/busybox "$stage/usr/bin/busybox"
}

# stage_trixie_userland STAGE: the programs of TRIXIE_TOOL_PACKAGES from the unpacked
# trixie root, the rxe provider (dlopen()ed) and libgcc_s (glibc dlopen()s it for
# pthread_cancel: rping), and every library those link, as trixie's own loader lists them
# (ld.so --list: the host's ldd would resolve against the host's libraries).
stage_trixie_userland() {
	local stage=$1 f pkg lib
	local loader=$TROOT/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2
	local libdir=$TROOT/usr/lib/x86_64-linux-gnu
	[[ -x $loader ]] || xri_die "no loader in $TROOT"
	for pkg in "${TRIXIE_TOOL_PACKAGES[@]}"; do
		[[ -f $TROOT/.files/$pkg ]] || xri_die "no file list of $pkg in $TROOT"
		# One bin for all (the stage's sbin is a link to it); sbin's links into ../bin
		# (iproute2's usr/sbin/ip -> ../bin/ip) name the same file and are left out.
		grep -E '^\./(usr/)?s?bin/[^/]+$' "$TROOT/.files/$pkg" | while read -r f; do
			f=$TROOT/${f#./}
			[[ -L $f && $(readlink "$f") == ../bin/* ]] && continue
			cp -a --remove-destination "$f" "$stage/usr/bin/"
		done
	done
	# The rxe provider only, as in the bookworm image (the others' drivers would warn).
	mkdir -p "$stage/usr/lib/x86_64-linux-gnu/libibverbs"
	cp -L "$libdir/libibverbs/librxe-rdmav34.so" "$stage/usr/lib/x86_64-linux-gnu/libibverbs/"
	cp -L "$TROOT/etc/libibverbs.d/rxe.driver" "$stage/etc/libibverbs.d/"
	{
		for f in "$stage"/usr/bin/* "$libdir"/libibverbs/librxe-rdmav34.so "$libdir"/libgcc_s.so.1; do
			[[ -f $f && ! -L $f ]] || continue
			# Only dynamic ELF files (ld.so --verify: 0 a program, 2 a library; 1 static
			# busybox or a script, on which --list crashes or has nothing to list).
			"$loader" --verify "$f" >/dev/null 2>&1 || (($? == 2)) || continue
			"$loader" --library-path "$libdir" --list "$f"
		done | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
		echo "$libdir/libgcc_s.so.1"
		echo "$loader"
	} | sort -u | while read -r lib; do
		[[ $lib == "$TROOT"/* ]] || xri_die "$lib: not from the trixie root"
		cp -L "$lib" "$stage/usr/lib/x86_64-linux-gnu/"
	done
	ln -s ../lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 "$stage/usr/lib64/ld-linux-x86-64.so.2"
	for f in ibv_devinfo ibv_rc_pingpong ib_write_bw rping rdma_server mckey ip tc rdma busybox; do
		[[ -x $stage/usr/bin/$f ]] || xri_die "trixie root lacks $f"
	done
}

build_image() {
	local out=$1 stage m p
	stage=$(mktemp -d "$XRI_CACHE/stage.XXXXXX")
	xri_on_exit rm -rf "$stage"
	mkdir -p "$stage"/{usr/bin,usr/lib/x86_64-linux-gnu,usr/lib64,etc/libibverbs.d,proc,sys,dev,tmp,root,run}
	for l in bin sbin lib lib64; do
		case $l in bin | sbin) ln -s usr/bin "$stage/$l" ;; *) ln -s "usr/$l" "$stage/$l" ;; esac
	done
	ln -s bin "$stage/usr/sbin"

	if [[ $XRI_FLAVOUR == trixie ]]; then
		stage_trixie_userland "$stage"
	else
		stage_host_userland "$stage"
	fi
	# A linker cache, so the dynamic loader finds the libraries without LD_LIBRARY_PATH.
	echo /usr/lib/x86_64-linux-gnu >"$stage/etc/ld.so.conf"
	ldconfig -r "$stage"

	# busybox provides the shell and the small tools; real ip/tc/rdma take precedence.
	for p in $("$stage/usr/bin/busybox" --list); do
		[[ -e $stage/usr/bin/$p ]] || ln -s busybox "$stage/usr/bin/$p"
	done

	# Modules, in load order.
	local kmods=$stage/lib/modules/$KVER
	mkdir -p "$kmods"
	: >"$stage/etc/xr-modules"
	for m in "${MODULES[@]}"; do
		modprobe -d "$KROOT" -S "$KVER" --show-depends "$m"
	done | awk '$1 == "insmod" && !seen[$2]++ { print $2 }' | while read -r p; do
		cp "$p" "$kmods/"
		echo "/lib/modules/$KVER/$(basename "$p")" >>"$stage/etc/xr-modules"
	done
	[[ $(wc -l <"$stage/etc/xr-modules") -ge ${#MODULES[@]} ]] || xri_die "module list incomplete"

	# No /etc/services, hosts or passwd: the tools get numeric ports and addresses.
	install -m 755 "$XRI_DIR/guest/init" "$stage/init"
	install -m 644 "$XRI_DIR/guest/xr-funcs.sh" "$stage/usr/lib/xr-funcs.sh"

	(cd "$stage" && find . -mindepth 1 | LC_ALL=C sort | cpio -o -H newc --quiet -R 0:0) |
		gzip -1 >"$out.part"
	mv "$out.part" "$out"
}

main() {
	mkdir -p "$XRI_CACHE"
	install_packages
	if [[ $XRI_FLAVOUR == trixie ]]; then
		trixie_apt_setup
		fetch_trixie_root
		if [[ ${1:-} == --host-root ]]; then
			echo "XRI_TRIXIE_ROOT=$TROOT"
			return 0
		fi
	fi
	[[ -z ${1:-} ]] || xri_die "unknown argument $1 (--host-root needs XRI_FLAVOUR=trixie)"
	fetch_kernel
	local key image
	key=$(image_key)
	image=$XRI_CACHE/initramfs-$KVER-$key.cpio.gz
	if [[ ! -f $image ]]; then
		xri_log "building $image"
		local t0
		t0=$(xri_now)
		build_image "$image"
		xri_log "built in $(xri_elapsed "$t0") s, $(du -h "$image" | cut -f1)"
		# Images of other inputs, unused for a day (a run in progress may still use one).
		find "$XRI_CACHE" -maxdepth 1 -name 'initramfs-*.cpio.gz' ! -path "$image" -mtime +1 -delete
	fi
	echo "XRI_KERNEL=$KROOT/vmlinux"
	echo "XRI_BASE=$image"
	echo "XRI_KVER=$KVER"
	echo "XRI_FLAVOUR=$XRI_FLAVOUR"
}

xri_trap_cleanup
main "$@"
