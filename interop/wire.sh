# shellcheck shell=bash
# Capture checks shared by the xrnic ⟷ rxe runners (run-xrnic-rxe.sh, run-stock-rxe.sh).
# Source this file; do not run it. The functions read three globals the runner sets:
# XRNIC (the xrnic binary, for `xrnic decode`), H_MAC (the MAC of xrnic's veth endpoint)
# and G_MAC (the guest's MAC).

# check_capture FILE FAMILY: prints "PACKETS ICRC XRNIC_PKTS RXE_PKTS"; ICRC is "ok" only
# when xrnic decode --strict accepts every RoCE packet (and, for family 0, every RoCE
# packet goes between fe80:: addresses: "ll?" otherwise).
check_capture() {
	local f=$1 fam=$2 n icrc=ok nx nr nll
	n=$("$XRNIC" decode --json "$f" 2>/dev/null | grep -c '^{') || n=0
	"$XRNIC" decode --strict "$f" >"$f.decode.txt" 2>&1 || icrc=BAD
	((n > 0)) || icrc=none
	nx=$(tshark -r "$f" -Y "udp.dstport == 4791 && eth.src == $H_MAC" 2>/dev/null | wc -l)
	nr=$(tshark -r "$f" -Y "udp.dstport == 4791 && eth.src == $G_MAC" 2>/dev/null | wc -l)
	if [[ $fam == 0 && $icrc == ok ]]; then
		nll=$(tshark -r "$f" -Y "udp.dstport == 4791 && ipv6.src == fe80::/64 && ipv6.dst == fe80::/64" 2>/dev/null | wc -l)
		((nll == nx + nr)) || icrc='ll?'
	fi
	echo "$n $icrc $nx $nr"
}

# wire_stats FILE: per sender (xrnic, rxe), from the capture alone: "X_RESENT X_NAKS
# X_RNR R_RESENT R_NAKS R_RNR". A request packet is resent when its (destination QP, PSN)
# was already seen from that sender; NAKs are AETH syndromes 0x60-0x7f (PSN sequence error,
# invalid request, remote access / operation error), RNR NAKs 0x20-0x3f (IBTA vol. 1
# §9.7.5.2.8). The capture sees what crossed the bridge: frames netem dropped inside the
# guest never reach it.
wire_stats() {
	tshark -r "$1" -Y 'udp.dstport == 4791' -T fields -e eth.src -e infiniband.bth.opcode \
		-e infiniband.bth.destqp -e infiniband.bth.psn -e infiniband.aeth.syndrome 2>/dev/null |
		awk -v x="$H_MAC" '
		# tshark prints some fields in hex (0x..), others in decimal; mawk has no strtonum.
		function num(v,  i, n) {
			if (v !~ /^0x/) return v + 0
			v = tolower(substr(v, 3)); n = 0
			for (i = 1; i <= length(v); i++) n = n * 16 + index("0123456789abcdef", substr(v, i, 1)) - 1
			return n
		}
		{
			s = ($1 == x) ? "x" : "r"; op = num($2)
			if (op <= 12 || op == 19 || op == 20) {
				k = s " " $3 " " $4
				if (k in seen) resent[s]++
				seen[k] = 1
			}
			if ($5 != "") {
				syn = num($5)
				if (syn >= 96 && syn < 128) naks[s]++
				if (syn >= 32 && syn < 64) rnr[s]++
			}
		}
		END { printf "%d %d %d %d %d %d\n", resent["x"], naks["x"], rnr["x"], resent["r"], naks["r"], rnr["r"] }'
}
