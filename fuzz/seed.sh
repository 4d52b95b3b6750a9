#!/usr/bin/env bash
# Seed the fuzz corpora from the conformance vectors (never committed: corpus/ is ignored).
#   fuzz/seed.sh [VECTORS_DIR]     default: ../shared/vectors beside the repository
# corpus/decode_pcap gets every capture file, and a pcapng copy of it; corpus/frame gets every frame of every
# capture, one file each (named after the capture and the frame number), and RoCE v1 copies
# of the IPv6 ones (v1-*, in both corpora); corpus/engine gets,
# per capture of the vectors and of interop/captures, a program for fuzz_targets/engine.rs:
# four receive buffers posted, then each frame replayed (action 8) with a drain every 8 frames.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
vectors="${1:-$here/../../shared/vectors}"
if [ ! -d "$vectors" ]; then
    echo "seed.sh: no vectors at $vectors; corpora start empty" >&2
    mkdir -p "$here/corpus/frame" "$here/corpus/decode_pcap" "$here/corpus/engine"
    exit 0
fi
mkdir -p "$here/corpus/frame" "$here/corpus/decode_pcap" "$here/corpus/engine"
python3 - "$vectors" "$here/corpus" "$here/../interop/captures" <<'PY'
import os, struct, sys

vectors, corpus, captures = sys.argv[1], sys.argv[2], sys.argv[3]

def frames(buf):
    """Frames of a classic pcap (either byte order, us or ns); pcapng is not expected."""
    magic = buf[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        e = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        e = ">"
    elif magic == b"\x0a\x0d\x0d\x0a":
        yield from pcapng_frames(buf)
        return
    else:
        return
    off = 24
    while off + 16 <= len(buf):
        _, _, incl, _ = struct.unpack(e + "IIII", buf[off:off + 16])
        off += 16
        yield buf[off:off + incl]
        off += incl

def pcapng_frames(buf):
    """Frames of the enhanced/simple packet blocks of a pcapng (byte order from its SHB)."""
    e = "<" if buf[8:12] == b"\x4d\x3c\x2b\x1a" else ">"
    off = 0
    while off + 12 <= len(buf):
        kind, n = struct.unpack(e + "II", buf[off:off + 8])
        if n < 12 or off + n > len(buf):
            return
        body = buf[off + 8:off + n - 4]
        if kind == 6 and len(body) >= 20:
            incl = struct.unpack(e + "I", body[12:16])[0]
            yield body[20:20 + incl]
        elif kind == 3 and len(body) >= 4:
            yield body[4:]
        off += n

def engine_program(frs):
    """fuzz_targets/engine.rs actions: post_recv x4 (action 6), then replay (8) each frame,
    drain (5) every 8 frames; each action is followed by one 'poll CQ?' byte."""
    out = b""
    for i in range(4):
        out += bytes([6, 0]) + struct.pack("<HH", i * 512, 512) + bytes([i, 1])
    for i, fr in enumerate(frs[:200]):
        out += bytes([8, 0]) + struct.pack("<H", len(fr)) + fr + b"\x01"
        if i % 8 == 7:
            out += bytes([5, 64, 1])
    return out

def pcapng(frs):
    """The same frames as a little-endian pcapng (SHB, one Ethernet IDB, EPBs), so that the
    pcapng reader starts from valid input too."""
    def block(kind, body):
        body += b"\0" * (-len(body) % 4)
        n = 12 + len(body)
        return struct.pack("<II", kind, n) + body + struct.pack("<I", n)
    out = block(0x0A0D0D0A, struct.pack("<IHHq", 0x1A2B3C4D, 1, 0, -1))
    out += block(1, struct.pack("<HHI", 1, 0, 65535))
    for i, fr in enumerate(frs):
        out += block(6, struct.pack("<IIIII", 0, 0, i, len(fr), len(fr)) + fr)
    return out

def to_v1(fr):
    """The RoCE v1 frame (EtherType 0x8915, GRH + BTH, IBTA vol. 1 annex A16) carrying the
    transport of an untagged RoCE v2 over IPv6 frame; None for any other frame."""
    if len(fr) < 14 + 40 + 8 + 12 + 4 or fr[12:14] != b"\x86\xdd" or fr[20] != 17:
        return None
    if fr[54 + 2:54 + 4] != (4791).to_bytes(2, "big"):
        return None
    transport = fr[62:]
    grh = bytearray(fr[14:54])
    grh[4:6] = len(transport).to_bytes(2, "big")
    grh[6] = 0x1B
    return fr[:12] + b"\x89\x15" + bytes(grh) + transport

n_files = n_frames = 0
for root, _, files in os.walk(vectors):
    for name in sorted(files):
        if not name.endswith((".pcap", ".pcapng")):
            continue
        data = open(os.path.join(root, name), "rb").read()
        stem = os.path.splitext(name)[0]
        open(os.path.join(corpus, "decode_pcap", name), "wb").write(data)
        n_files += 1
        frs = list(frames(data))
        open(os.path.join(corpus, "decode_pcap", stem + ".pcapng"), "wb").write(pcapng(frs))
        n_files += 1
        for i, fr in enumerate(frs, 1):
            open(os.path.join(corpus, "frame", f"{stem}-{i:03}"), "wb").write(fr)
            n_frames += 1
        # RoCE v1 copies of the IPv6 RoCE v2 frames (the vectors hold no v1 frame): the
        # IPv6 header becomes the GRH (next header 0x1B, PayLen from the BTH to the ICRC),
        # the UDP header goes, the rest stays (its ICRC then no longer checks).
        v1 = [to_v1(fr) for fr in frs]
        v1 = [fr for fr in v1 if fr]
        for i, fr in enumerate(v1, 1):
            open(os.path.join(corpus, "frame", f"v1-{stem}-{i:03}"), "wb").write(fr)
            n_frames += 1
        if v1:
            open(os.path.join(corpus, "decode_pcap", f"v1-{stem}.pcapng"), "wb").write(pcapng(v1))
            n_files += 1
n_engine = 0
for d in (vectors, captures):
    for root, _, files in os.walk(d):
        for name in sorted(files):
            if not name.endswith((".pcap", ".pcapng")):
                continue
            frs = list(frames(open(os.path.join(root, name), "rb").read()))
            if frs:
                stem = os.path.splitext(name)[0]
                open(os.path.join(corpus, "engine", stem), "wb").write(engine_program(frs))
                n_engine += 1
print(f"seed.sh: {n_files} captures -> corpus/decode_pcap, {n_frames} frames -> corpus/frame, "
      f"{n_engine} programs -> corpus/engine")
PY
