#!/usr/bin/env bash
# Prepare the host for the rxe interop harness; idempotent, safe to re-run.
#
#   1. installs the Debian packages the harness uses (only those missing);
#   2. downloads the newest linux-image-6.1.0-*-amd64 .deb and extracts it into the cache
#      (the package is NOT installed on the host: the host keeps its own kernel);
#   3. builds the guest's base initramfs: busybox, the rxe/netem modules with their
#      dependencies, rdma-core's verbs tools, perftest, rdmacm-utils, iproute2 (ip, tc,
#      rdma) with the libraries they link, the rxe provider, and guest/init.
# The image is cached under a key made of every input's version, so a re-run that changed
# nothing takes a second. Prints the paths as shell assignments (XRI_KERNEL=..., XRI_BASE=...)
# on stdout; everything else goes to stderr.
#
# Environment: XRNIC_INTEROP_CACHE (default /var/cache/xrnic-interop), XRI_KERNEL_PKG
# (force a linux-image package name), XRI_NO_INSTALL=1 (fail instead of installing).

set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
xri_need_root

PACKAGES=(qemu-system-x86 busybox-static cpio kmod xz-utils rdma-core ibverbs-utils ibverbs-providers
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

# Sets KPKG, KVER (uname -r of the guest) and KROOT (extracted package tree).
fetch_kernel() {
	KPKG=${XRI_KERNEL_PKG:-}
	if [[ -z $KPKG ]]; then
		KPKG=$(apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64$' |
			awk '{print $1}' | sort -V | tail -1)
		if [[ -z $KPKG ]]; then
			apt-get update -q >&2
			KPKG=$(apt-cache search --names-only '^linux-image-6\.1\.0-[0-9]+-amd64$' |
				awk '{print $1}' | sort -V | tail -1)
		fi
	fi
	[[ -n $KPKG ]] || xri_die "no linux-image-6.1.0-*-amd64 package known to apt"
	KVER=${KPKG#linux-image-}
	KROOT=$XRI_CACHE/kernel/$KVER
	if [[ ! -f $KROOT/boot/vmlinuz-$KVER || ! -f $KROOT/lib/modules/$KVER/modules.dep ]]; then
		xri_log "fetching $KPKG"
		local tmp
		tmp=$(mktemp -d "$XRI_CACHE/dl.XXXXXX")
		# apt downloads as its _apt user, which must be able to write there.
		chown _apt "$tmp" 2>/dev/null || true
		(cd "$tmp" && apt-get download -q "$KPKG" >&2)
		rm -rf "$KROOT.part"
		mkdir -p "$KROOT.part"
		dpkg-deb -x "$tmp"/"$KPKG"_*.deb "$KROOT.part"
		dpkg-deb -f "$tmp"/"$KPKG"_*.deb Version >"$KROOT.part/.deb-version"
		rm -rf "$tmp"
		# The package ships no modules.dep (the postinst makes it); build it here.
		depmod -b "$KROOT.part" "$KVER"
		rm -rf "$KROOT"
		mv "$KROOT.part" "$KROOT"
	fi
	if [[ ! -f $KROOT/vmlinux ]]; then
		extract_vmlinux "$KROOT/boot/vmlinuz-$KVER" "$KROOT/vmlinux"
	fi
}

# extract_vmlinux BZIMAGE OUT: the uncompressed ELF kernel inside a bzImage. Debian's is
# XZ-compressed, and under TCG the bzImage's own decompressor (after SeaBIOS) takes about
# 10 s; qemu boots the ELF directly through its PVH entry point (CONFIG_PVH=y) instead.
extract_vmlinux() {
	local in=$1 out=$2 off
	off=$(LC_ALL=C grep -obUaP '\xfd7zXZ\x00' "$in" | head -1 | cut -d: -f1)
	[[ -n $off ]] || xri_die "no XZ stream in $in"
	# xz stops with an error at the bytes after the stream; the stream itself is complete.
	tail -c +$((off + 1)) "$in" | xz -dc >"$out.part" 2>/dev/null || true
	[[ $(head -c 4 "$out.part" | od -An -c | tr -d ' ') == 177ELF ]] ||
		xri_die "could not extract vmlinux from $in"
	mv "$out.part" "$out"
}

pkg_version() { dpkg-query -W -f='${Version}' "$1"; }

# The cache key: versions of everything that goes into the image, and this builder.
image_key() {
	{
		echo "$KPKG $(cat "$KROOT/.deb-version")"
		for p in busybox-static ibverbs-utils ibverbs-providers libibverbs1 librdmacm1 \
			perftest rdmacm-utils iproute2 libc6; do
			echo "$p $(pkg_version "$p")"
		done
		sha256sum "$XRI_DIR/setup.sh" "$XRI_DIR/guest/init" "$XRI_DIR/guest/xr-funcs.sh"
	} | sha256sum | cut -c1-16
}

build_image() {
	local out=$1 stage m p lib
	stage=$(mktemp -d "$XRI_CACHE/stage.XXXXXX")
	xri_on_exit rm -rf "$stage"
	mkdir -p "$stage"/{usr/bin,usr/lib/x86_64-linux-gnu,usr/lib64,etc/libibverbs.d,proc,sys,dev,tmp,root,run}
	for l in bin sbin lib lib64; do
		case $l in bin | sbin) ln -s usr/bin "$stage/$l" ;; *) ln -s "usr/$l" "$stage/$l" ;; esac
	done
	ln -s bin "$stage/usr/sbin"

	# Programs and every library they (and the dlopen()ed extras) link.
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
	# A linker cache, so the dynamic loader finds the libraries without LD_LIBRARY_PATH.
	echo /usr/lib/x86_64-linux-gnu >"$stage/etc/ld.so.conf"
	ldconfig -r "$stage"

	# busybox provides the shell and the small tools; real ip/tc/rdma take precedence.
	cp /bin/busybox "$stage/usr/bin/busybox"
	for p in $(/bin/busybox --list); do
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
}

xri_trap_cleanup
main "$@"
