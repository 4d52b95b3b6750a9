// SPDX-License-Identifier: (MIT OR Apache-2.0)
//
// xrnic's XDP filter: RoCE v2 frames go to the AF_XDP socket of the receive queue, every
// other frame goes on to the kernel stack.
//
// RoCE v2 (IBTA Annex A17, "RoCEv2") is UDP with destination port 4791 over IPv4 or IPv6,
// optionally behind one 802.1Q tag. Such a frame is redirected to `xsks[rx_queue_index]`;
// when that slot holds no socket, bpf_redirect_map() returns its fallback action XDP_PASS,
// so the kernel sees the frame (and answers with ICMP port unreachable, as it would
// without us). ARP, IPv6 ND, ICMP, TCP and other UDP are passed so that the host's normal
// networking keeps working on the interface while xrnic owns RoCE.
//
// Frames too short for the headers they announce are passed too: the kernel's own
// checks drop and count them, we count them in `stats[STAT_MALFORMED]`.
//
// The section is `xdp.frags`: jumbo frames (4096-byte path MTU on a 9000-byte link) arrive
// as multi-buffer xdp_buffs. Only the linear part is parsed, which always holds the
// Ethernet, IP and UDP headers.

#include <linux/bpf.h>
#include <linux/in.h>
#include <linux/if_ether.h>
#include <linux/ip.h>
#include <linux/ipv6.h>
#include <linux/udp.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

#define ROCE_V2_PORT 4791
#define ETH_P_8021Q_ 0x8100
#define IP_MF_OFFSET 0x3fff /* MF flag and fragment offset */

/* Indices of the per-CPU counters; keep in step with src/io/afxdp/filter.rs. */
enum {
	STAT_REDIRECTED = 0, /* RoCE v2, handed to the AF_XDP socket */
	STAT_NO_SOCKET = 1,  /* RoCE v2, but no socket on this queue: passed */
	STAT_NOT_ROCE = 2,   /* anything else: passed */
	STAT_MALFORMED = 3,  /* shorter than its headers, or IPv4 fragment: passed */
	STAT_COUNT = 4,
};

struct {
	__uint(type, BPF_MAP_TYPE_XSKMAP);
	__uint(max_entries, 64);
	__type(key, __u32);
	__type(value, __u32);
} xsks SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, STAT_COUNT);
	__type(key, __u32);
	__type(value, __u64);
} stats SEC(".maps");

struct vlan_hdr_ {
	__be16 tci;
	__be16 encap_proto;
};

static __always_inline int count(__u32 idx, int action)
{
	__u64 *c = bpf_map_lookup_elem(&stats, &idx);

	if (c)
		*c += 1;
	return action;
}

SEC("xdp.frags")
int xrnic_filter(struct xdp_md *ctx)
{
	void *data = (void *)(long)ctx->data;
	void *data_end = (void *)(long)ctx->data_end;
	struct ethhdr *eth = data;
	struct udphdr *udp;
	__u16 proto;
	void *l3;

	if ((void *)(eth + 1) > data_end)
		return count(STAT_MALFORMED, XDP_PASS);
	proto = eth->h_proto;
	l3 = eth + 1;

	if (proto == bpf_htons(ETH_P_8021Q_)) {
		struct vlan_hdr_ *vlan = l3;

		if ((void *)(vlan + 1) > data_end)
			return count(STAT_MALFORMED, XDP_PASS);
		proto = vlan->encap_proto;
		l3 = vlan + 1;
	}

	if (proto == bpf_htons(ETH_P_IP)) {
		struct iphdr *ip = l3;
		__u32 ihl;

		if ((void *)(ip + 1) > data_end)
			return count(STAT_MALFORMED, XDP_PASS);
		if (ip->protocol != IPPROTO_UDP)
			return count(STAT_NOT_ROCE, XDP_PASS);
		ihl = ip->ihl * 4;
		if (ip->version != 4 || ihl < sizeof(*ip))
			return count(STAT_MALFORMED, XDP_PASS);
		/* A fragment has no (or a partial) UDP datagram: RoCE v2 is never
		 * fragmented (it sets DF), so leave reassembly to the kernel. */
		if (ip->frag_off & bpf_htons(IP_MF_OFFSET))
			return count(STAT_MALFORMED, XDP_PASS);
		udp = l3 + ihl;
	} else if (proto == bpf_htons(ETH_P_IPV6)) {
		struct ipv6hdr *ip6 = l3;

		if ((void *)(ip6 + 1) > data_end)
			return count(STAT_MALFORMED, XDP_PASS);
		/* RoCE v2 senders (rxe, ConnectX) put UDP right after the fixed
		 * header; anything behind extension headers is not ours. */
		if (ip6->nexthdr != IPPROTO_UDP)
			return count(STAT_NOT_ROCE, XDP_PASS);
		udp = (void *)(ip6 + 1);
	} else {
		return count(STAT_NOT_ROCE, XDP_PASS);
	}

	if ((void *)(udp + 1) > data_end)
		return count(STAT_MALFORMED, XDP_PASS);
	if (udp->dest != bpf_htons(ROCE_V2_PORT))
		return count(STAT_NOT_ROCE, XDP_PASS);

	/* XDP_PASS as the fallback: with no socket on this queue the frame goes on
	 * to the kernel rather than vanishing. */
	if (bpf_redirect_map(&xsks, ctx->rx_queue_index, XDP_PASS) == XDP_REDIRECT)
		return count(STAT_REDIRECTED, XDP_REDIRECT);
	return count(STAT_NO_SOCKET, XDP_PASS);
}

char LICENSE[] SEC("license") = "Dual MIT/GPL";
