#!/usr/bin/env bash
# Seed the fuzz corpora from the conformance vectors (never committed: corpus/ is ignored).
#   fuzz/seed.sh [VECTORS_DIR]     default: ../shared/vectors beside the repository
# corpus/decode_pcap gets every capture file, and a pcapng copy of it; corpus/frame gets every frame of every
# capture, one file each (named after the capture and the frame number).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
vectors="${1:-$here/../../shared/vectors}"
if [ ! -d "$vectors" ]; then
    echo "seed.sh: no vectors at $vectors; corpora start empty" >&2
    mkdir -p "$here/corpus/frame" "$here/corpus/decode_pcap"
    exit 0
fi
mkdir -p "$here/corpus/frame" "$here/corpus/decode_pcap"
python3 - "$vectors" "$here/corpus" <<'PY'
import os, struct, sys

vectors, corpus = sys.argv[1], sys.argv[2]

def frames(buf):
    """Frames of a classic pcap (either byte order, us or ns); pcapng is not expected."""
    magic = buf[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        e = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        e = ">"
    else:
        return
    off = 24
    while off + 16 <= len(buf):
        _, _, incl, _ = struct.unpack(e + "IIII", buf[off:off + 16])
        off += 16
        yield buf[off:off + incl]
        off += incl

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
print(f"seed.sh: {n_files} captures -> corpus/decode_pcap, {n_frames} frames -> corpus/frame")
PY
