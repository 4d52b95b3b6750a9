/* The verbs the library implements and their error paths, through the system's
 * <infiniband/verbs.h> (libibverbs-dev), linked with -libverbs: on xrnic through
 * `xrnic exec` (tests/verbs_abi_c.rs), and meant to run on Linux rxe the same way.
 *
 *   verbs_suite DEVICE GID_INDEX server|client DIR
 *
 * Two processes (one per end of a link) exchange their QP number, GID, buffer address
 * and rkey through files in DIR (DIR/server.info, DIR/client.info). One line per check,
 * then "N passed, M failed"; the exit status is 0 only when nothing failed. */
#include "common.h"

struct info {
	uint32_t qpn;
	uint32_t rkey;
	uint64_t addr;
	union ibv_gid gid;
};

static int to_rts_rnr(struct ibv_qp *qp, int rnr_retry)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = rnr_retry;
	a.sq_psn = 0;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
				      IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				      IBV_QP_MAX_QP_RD_ATOMIC);
}

static int to_rts(struct ibv_qp *qp)
{
	return to_rts_rnr(qp, 7);
}

/* INIT (with `access` as the QP's access flags), RTR and (when `rts`) RTS with
 * `rnr_retry`. */
static int modify_ex(struct ibv_qp *qp, const struct info *peer, int gid_index, int rts,
		     int access, int rnr_retry)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = access;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				   IBV_QP_ACCESS_FLAGS))
		return -1;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = peer->qpn;
	a.rq_psn = 0;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = peer->gid;
	a.ah_attr.grh.sgid_index = gid_index;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				   IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;
	return rts ? to_rts_rnr(qp, rnr_retry) : 0;
}

#define ALL_ACCESS (IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE)

/* INIT, RTR and (when `rts`) RTS, every remote access enabled. */
static int modify(struct ibv_qp *qp, const struct info *peer, int gid_index, int rts)
{
	return modify_ex(qp, peer, gid_index, rts, ALL_ACCESS, 7);
}

/* A fresh RC QP on `cq`, in RTS, connected to the peer's QP of the same `tag` (their
 * numbers exchanged through DIR as ROLE-TAG); NULL on failure. */
static struct ibv_qp *pair_qp(struct ibv_pd *pd, struct ibv_cq *cq, struct ibv_mr *mr,
			      const union ibv_gid *gid, int gid_index, const char *dir,
			      int server, const char *tag, int access, int rnr_retry,
			      struct info *peer)
{
	struct ibv_qp_init_attr qia;
	struct ibv_qp *qp;
	struct info me;
	char mine[64], theirs[64];

	memset(&qia, 0, sizeof qia);
	qia.send_cq = cq;
	qia.recv_cq = cq;
	qia.qp_type = IBV_QPT_RC;
	qia.cap.max_send_wr = 16;
	qia.cap.max_recv_wr = 4;
	qia.cap.max_send_sge = 1;
	qia.cap.max_recv_sge = 1;
	qp = ibv_create_qp(pd, &qia);
	if (!qp)
		return NULL;
	me.qpn = qp->qp_num;
	me.rkey = mr->rkey;
	me.addr = (uintptr_t)mr->addr;
	me.gid = *gid;
	snprintf(mine, sizeof mine, "%s-%s", server ? "server" : "client", tag);
	snprintf(theirs, sizeof theirs, "%s-%s", server ? "client" : "server", tag);
	if (write_info(dir, mine, &me) || read_info(dir, theirs, peer) ||
	    modify_ex(qp, peer, gid_index, 1, access, rnr_retry)) {
		ibv_destroy_qp(qp);
		return NULL;
	}
	return qp;
}

/* Post one signaled one-SGE WR on `qp` and poll `cq` for its completion; the status, or
 * -1 when the post failed or nothing came. Prints the status as an info line. */
static int one_wr(struct ibv_qp *qp, struct ibv_cq *cq, enum ibv_wr_opcode op, void *addr,
		  uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey, const char *what)
{
	struct ibv_sge sge = {(uintptr_t)addr, len, lkey};
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc;
	int st = -1;

	memset(&wr, 0, sizeof wr);
	wr.wr_id = 77;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	memset(&wc, 0, sizeof wc);
	if (ibv_post_send(qp, &wr, &bad) == 0 && poll_one(cq, &wc) == 1 && wc.wr_id == 77)
		st = wc.status;
	/* Not a check: what the device said, for a comparison with another device. */
	printf("info: %s: %s\n", what, st < 0 ? "no completion" : ibv_wc_status_str(st));
	return st;
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	union ibv_gid gid;
	struct ibv_pd *pd;
	struct ibv_mr *mr, *mr2;
	struct ibv_comp_channel *ch;
	struct ibv_cq *scq, *rcq, *cq;
	struct ibv_qp *qp, *qp2;
	struct ibv_qp_init_attr qia;
	struct ibv_qp_attr qa;
	struct ibv_sge sge;
	struct ibv_send_wr swr, *bad;
	struct ibv_recv_wr rwr, *rbad;
	struct ibv_wc wc;
	struct info me, peer;
	char *buf;
	int i, n, gid_index, server;
	const size_t len = 4096;

	if (argc != 5) {
		fprintf(stderr, "usage: %s DEVICE GID_INDEX server|client DIR\n", argv[0]);
		return 2;
	}
	gid_index = atoi(argv[2]);
	server = strcmp(argv[3], "server") == 0;

	list = ibv_get_device_list(&n);
	check(list != NULL && n > 0, "ibv_get_device_list lists a device");
	ctx = open_named(list, n, argv[1]);
	check(ctx != NULL, "ibv_open_device");
	if (!ctx)
		goto out;
	check(ibv_query_device(ctx, &da) == 0 && da.max_qp_wr > 0 && da.max_sge > 0,
	      "ibv_query_device");
	check(ibv_query_port(ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE &&
		      pa.link_layer == IBV_LINK_LAYER_ETHERNET,
	      "ibv_query_port: active, Ethernet");
	check(ibv_query_port(ctx, 2, &pa) != 0, "ibv_query_port of port 2 fails");
	check(ibv_query_gid(ctx, 1, gid_index, &gid) == 0 && gid.global.interface_id != 0,
	      "ibv_query_gid");

	pd = ibv_alloc_pd(ctx);
	check(pd != NULL, "ibv_alloc_pd");
	buf = aligned_alloc(4096, 2 * len);
	memset(buf, 0, 2 * len);
	mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
					   IBV_ACCESS_REMOTE_READ);
	check(mr != NULL && mr->lkey != 0 && mr->addr == buf, "ibv_reg_mr");
	mr2 = ibv_reg_mr_iova2(pd, buf + len, len, 0x10000, IBV_ACCESS_LOCAL_WRITE);
	check(mr2 != NULL, "ibv_reg_mr_iova2 at iova 0x10000");
	check(ibv_dealloc_pd(pd) == EBUSY, "ibv_dealloc_pd of a PD in use: EBUSY");

	ch = ibv_create_comp_channel(ctx);
	check(ch != NULL && ch->fd >= 0, "ibv_create_comp_channel has a descriptor");
	scq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	rcq = ibv_create_cq(ctx, 16, NULL, ch, 0);
	check(scq != NULL && rcq != NULL, "ibv_create_cq (one on the channel)");

	memset(&qia, 0, sizeof qia);
	qia.send_cq = scq;
	qia.recv_cq = rcq;
	qia.qp_type = IBV_QPT_RC;
	qia.cap.max_send_wr = 8;
	qia.cap.max_recv_wr = 8;
	qia.cap.max_send_sge = 2;
	qia.cap.max_recv_sge = 2;
	qia.cap.max_inline_data = 1 << 20;
	errno = 0;
	check(ibv_create_qp(pd, &qia) == NULL, "ibv_create_qp with max_inline_data 1 MiB fails");
	qia.cap.max_inline_data = 64;
	qp = ibv_create_qp(pd, &qia);
	check(qp != NULL && qia.cap.max_inline_data >= 64,
	      "ibv_create_qp RC, max_inline_data 64 reported");
	if (!qp)
		goto out;
	check(ibv_destroy_cq(scq) == EBUSY, "ibv_destroy_cq of a CQ in use: EBUSY");
	memset(&qa, 0, sizeof qa);
	check(ibv_query_qp(qp, &qa, IBV_QP_STATE | IBV_QP_CAP, &qia) == 0 &&
		      qa.qp_state == IBV_QPS_RESET && qa.cap.max_inline_data >= 64,
	      "ibv_query_qp: RESET, max_inline_data");

	sge.addr = (uintptr_t)buf;
	sge.length = 16;
	sge.lkey = mr->lkey;
	memset(&swr, 0, sizeof swr);
	swr.sg_list = &sge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_SIGNALED;

	/* A second QP: a post in RESET, then destroyed. Not on the QP under test: rdma-core's
	 * rxe provider queues the WR in user space and only its doorbell fails (EINVAL,
	 * bad_wr left NULL), so the WR would be sent once that QP reaches RTS
	 * (docs/interop.md, the C suite on rxe). */
	qia.cap.max_inline_data = 0;
	qia.cap.max_send_sge = 2;
	qp2 = ibv_create_qp(pd, &qia);
	check(qp2 != NULL, "ibv_create_qp (a second QP)");
	/* rxe sizes the send WQE for the larger of the SGEs and the inline data, and
	 * reports what it holds: 2 SGEs of 16 bytes make 32 bytes of inline data. */
	check(qp2 != NULL && qia.cap.max_inline_data == 32 && qia.cap.max_send_sge == 2,
	      "max_inline_data 0 with 2 send SGEs: 32 reported");
	bad = NULL;
	i = qp2 ? ibv_post_send(qp2, &swr, &bad) : 0;
	check(i != 0, "ibv_post_send on a QP in RESET fails");
	check(i != 0 && bad == &swr, "ibv_post_send on a QP in RESET sets bad_wr to the WR");
	check(qp2 != NULL && ibv_destroy_qp(qp2) == 0, "ibv_destroy_qp (the second QP)");

	/* Connect to the peer. */
	me.qpn = qp->qp_num;
	me.rkey = mr->rkey;
	me.addr = (uintptr_t)buf;
	me.gid = gid;
	check(write_info(argv[4], argv[3], &me) == 0 &&
		      read_info(argv[4], server ? "client" : "server", &peer) == 0,
	      "exchange QP numbers through DIR");
	/* The server stays in RTR until the first packet arrives (COMM_EST). */
	check(modify(qp, &peer, gid_index, !server) == 0,
	      server ? "ibv_modify_qp INIT, RTR" : "ibv_modify_qp INIT, RTR, RTS");

	/* Receives: three, the first one waited for through the channel. */
	for (i = 0; i < 3; i++) {
		struct ibv_sge rs = {(uintptr_t)(buf + 1024 + 256 * i), 256, mr->lkey};
		memset(&rwr, 0, sizeof rwr);
		rwr.wr_id = 100 + i;
		rwr.sg_list = &rs;
		rwr.num_sge = 1;
		if (ibv_post_recv(qp, &rwr, &rbad))
			check(0, "ibv_post_recv");
	}
	check(ibv_req_notify_cq(rcq, 0) == 0, "ibv_req_notify_cq");
	memset(buf, 0xc3, 16); /* what the client's RDMA READ reads */
	/* Both ends have their receives posted before either sends. */
	write_info(argv[4], server ? "server-ready" : "client-ready", &me);
	read_info(argv[4], server ? "client-ready" : "server-ready", &peer);

	if (!server) {
		/* 1: an inline SEND from an unregistered stack buffer. */
		char msg[64];
		struct ibv_sge is = {(uintptr_t)msg, sizeof msg, 0xdeadbeef};
		for (i = 0; i < (int)sizeof msg; i++)
			msg[i] = (char)(i * 7 + 1);
		swr.sg_list = &is;
		swr.wr_id = 1;
		swr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
		check(ibv_post_send(qp, &swr, &bad) == 0, "ibv_post_send inline SEND");
		memset(msg, 0, sizeof msg); /* the data was taken at post time */
		check(poll_one(scq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 1,
		      "inline SEND completes");
		/* An inline request longer than max_inline_data: EINVAL. */
		is.length = 65;
		check(ibv_post_send(qp, &swr, &bad) == EINVAL, "inline past max_inline_data: EINVAL");
		/* 2: a SEND gathering two SGEs. */
		struct ibv_sge two[2] = {{(uintptr_t)buf, 100, mr->lkey},
					 {(uintptr_t)buf + 200, 28, mr->lkey}};
		memset(buf, 0x5a, 128);
		memset(buf + 200, 0xa5, 28);
		swr.sg_list = two;
		swr.num_sge = 2;
		swr.wr_id = 2;
		swr.send_flags = IBV_SEND_SIGNALED;
		check(ibv_post_send(qp, &swr, &bad) == 0 && poll_one(scq, &wc) == 1 &&
			      wc.status == IBV_WC_SUCCESS,
		      "SEND of two SGEs completes");
		/* 3: an RDMA WRITE with immediate into the peer's buffer. */
		memset(buf + 512, 0x33, 64);
		sge.addr = (uintptr_t)buf + 512;
		sge.length = 64;
		sge.lkey = mr->lkey;
		swr.sg_list = &sge;
		swr.num_sge = 1;
		swr.wr_id = 3;
		swr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
		swr.imm_data = htobe32(0x1234);
		swr.wr.rdma.remote_addr = peer.addr + 3072;
		swr.wr.rdma.rkey = peer.rkey;
		check(ibv_post_send(qp, &swr, &bad) == 0 && poll_one(scq, &wc) == 1 &&
			      wc.status == IBV_WC_SUCCESS,
		      "RDMA WRITE with immediate completes");
		/* 4: an RDMA READ of the peer's first bytes. */
		sge.addr = (uintptr_t)buf + 2048;
		swr.wr_id = 4;
		swr.opcode = IBV_WR_RDMA_READ;
		swr.wr.rdma.remote_addr = peer.addr;
		check(ibv_post_send(qp, &swr, &bad) == 0 && poll_one(scq, &wc) == 1 &&
			      wc.status == IBV_WC_SUCCESS && (unsigned char)buf[2048] == 0xc3,
		      "RDMA READ returns the peer's bytes");
		/* 5 (last: the QP goes to ERR): a bad lkey. */
		sge.lkey = mr->lkey + 0x1000;
		swr.wr_id = 5;
		swr.opcode = IBV_WR_SEND;
		memset(&wc, 0, sizeof wc);
		n = ibv_post_send(qp, &swr, &bad) == 0 && poll_one(scq, &wc) == 1;
		/* Not a check: what the device said, for a comparison with another device. */
		printf("info: a bad lkey: %s\n", n ? ibv_wc_status_str(wc.status) : "no completion");
		check(n && wc.status == IBV_WC_LOC_PROT_ERR && wc.wr_id == 5,
		      "a bad lkey completes with IBV_WC_LOC_PROT_ERR");
		{
			/* The completion reported the error: no asynchronous event. */
			struct ibv_async_event ev;
			int got = wait_async(ctx, 300, &ev) == 0;
			if (got) {
				printf("info: async event %s\n", ibv_event_type_str(ev.event_type));
				ibv_ack_async_event(&ev);
			}
			check(!got, "no async event for an error a completion reports");
		}
		/* The QP is in ERR now: what is posted completes flushed. */
		memset(&qa, 0, sizeof qa);
		check(ibv_query_qp(qp, &qa, IBV_QP_STATE | IBV_QP_CAP, &qia) == 0 &&
			      qa.qp_state == IBV_QPS_ERR,
		      "ibv_query_qp: ERR after the error");
		sge.lkey = mr->lkey;
		swr.wr_id = 6;
		memset(&wc, 0, sizeof wc);
		check(ibv_post_send(qp, &swr, &bad) == 0 && poll_one(scq, &wc) == 1 &&
			      wc.status == IBV_WC_WR_FLUSH_ERR && wc.wr_id == 6,
		      "a SEND posted in ERR completes with IBV_WC_WR_FLUSH_ERR");
		{
			struct ibv_sge many[40];
			for (i = 0; i < 40; i++)
				many[i] = sge;
			swr.sg_list = many;
			swr.num_sge = (int)qa.cap.max_send_sge + 1;
			bad = NULL;
			check(swr.num_sge <= 40 && ibv_post_send(qp, &swr, &bad) == EINVAL &&
				      bad == &swr,
			      "more SGEs than max_send_sge: EINVAL, bad_wr the WR");
			swr.sg_list = &sge;
			swr.num_sge = 1;
		}
	} else {
		struct ibv_cq *ev_cq;
		void *ev_ctx;
		struct pollfd pfd = {ch->fd, POLLIN, 0};
		check(poll(&pfd, 1, 30000) == 1, "the channel's descriptor becomes readable");
		check(ibv_get_cq_event(ch, &ev_cq, &ev_ctx) == 0 && ev_cq == rcq,
		      "ibv_get_cq_event names the CQ");
		ibv_ack_cq_events(rcq, 1);
		{
			/* The first packet reached the QP in RTR (IBTA vol. 1 §11.6.3.1). */
			struct ibv_async_event ev;
			int got = wait_async(ctx, 2000, &ev) == 0;
			check(got && ev.event_type == IBV_EVENT_COMM_EST && ev.element.qp == qp,
			      "ibv_get_async_event: IBV_EVENT_COMM_EST on the QP in RTR");
			if (got)
				ibv_ack_async_event(&ev);
			check(!got || qp->events_completed == 1,
			      "ibv_ack_async_event counts on the QP (events_completed)");
		}
		check(to_rts(qp) == 0, "ibv_modify_qp RTS after the first receive");
		cq = rcq;
		check(poll_one(cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 100 &&
			      wc.byte_len == 64 && wc.opcode == IBV_WC_RECV,
		      "inline SEND received, 64 bytes");
		{
			int ok = 1;
			for (i = 0; i < 64; i++)
				ok &= buf[1024 + i] == (char)(i * 7 + 1);
			check(ok, "inline SEND's bytes are the sender's at post time");
		}
		check(poll_one(cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.byte_len == 128 &&
			      (unsigned char)buf[1280 + 99] == 0x5a &&
			      (unsigned char)buf[1280 + 100] == 0xa5,
		      "two-SGE SEND received in order");
		check(poll_one(cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
			      wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM &&
			      be32toh(wc.imm_data) == 0x1234 && (unsigned char)buf[3072] == 0x33 &&
			      (unsigned char)buf[3072 + 63] == 0x33,
		      "RDMA WRITE with immediate landed, immediate received");
		/* Wait for the client's last check before tearing down. */
		read_info(argv[4], "client-done", &peer);
	}
	if (!server)
		write_info(argv[4], "client-done", &me);

	/* Phase 2, the remote errors, each on a fresh pair of QPs (an error ends its QP):
	 * an RDMA WRITE to a QP without IBV_ACCESS_REMOTE_WRITE, an RDMA READ past the end of
	 * the peer's region, a SEND to a QP with no receive posted (rnr_retry 0 and 1), and
	 * a send CQ overrun by completions nobody polls. */
	{
		struct ibv_qp *noacc, *past, *rnr0, *rnr1, *over, *sqd;
		struct ibv_cq *cq2, *small;
		struct info pn, pp, p0, p1, po, pd2;
		const int nw = 8;

		cq2 = ibv_create_cq(ctx, 64, NULL, NULL, 0);
		small = ibv_create_cq(ctx, 2, NULL, NULL, 0);
		check(cq2 != NULL && small != NULL, "ibv_create_cq (phase 2)");
		if (!cq2 || !small)
			goto out;
		noacc = pair_qp(pd, cq2, mr, &gid, gid_index, argv[4], server, "noacc",
				server ? IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ : ALL_ACCESS,
				7, &pn);
		past = pair_qp(pd, cq2, mr, &gid, gid_index, argv[4], server, "past", ALL_ACCESS, 7,
			       &pp);
		rnr0 = pair_qp(pd, cq2, mr, &gid, gid_index, argv[4], server, "rnr0", ALL_ACCESS, 0,
			       &p0);
		rnr1 = pair_qp(pd, cq2, mr, &gid, gid_index, argv[4], server, "rnr1", ALL_ACCESS, 1,
			       &p1);
		over = pair_qp(pd, server ? cq2 : small, mr, &gid, gid_index, argv[4], server, "over",
			       ALL_ACCESS, 7, &po);
		sqd = pair_qp(pd, cq2, mr, &gid, gid_index, argv[4], server, "sqd", ALL_ACCESS, 7,
			      &pd2);
		check(noacc && past && rnr0 && rnr1 && over && sqd,
		      "six more QPs connected (phase 2)");
		if (!noacc || !past || !rnr0 || !rnr1 || !over || !sqd)
			goto out;
		write_info(argv[4], server ? "server-ready2" : "client-ready2", &me);
		read_info(argv[4], server ? "client-ready2" : "server-ready2", &peer);
		if (!server) {
			memset(buf + 2048, 0x77, 64);
			check(one_wr(noacc, cq2, IBV_WR_RDMA_WRITE, buf + 2048, 16, mr->lkey,
				     pn.addr + 3500, pn.rkey,
				     "RDMA WRITE to a QP without REMOTE_WRITE") ==
				      IBV_WC_REM_INV_REQ_ERR,
			      "RDMA WRITE to a QP without IBV_ACCESS_REMOTE_WRITE: IBV_WC_REM_INV_REQ_ERR");
			check(one_wr(past, cq2, IBV_WR_RDMA_READ, buf + 2048, 64, mr->lkey,
				     pp.addr + len - 8, pp.rkey, "RDMA READ past the end of the MR") ==
				      IBV_WC_REM_ACCESS_ERR,
			      "RDMA READ past the end of the peer's MR: IBV_WC_REM_ACCESS_ERR");
			check(one_wr(rnr0, cq2, IBV_WR_SEND, buf, 16, mr->lkey, 0, 0,
				     "SEND, no receive posted, rnr_retry 0") ==
				      IBV_WC_RNR_RETRY_EXC_ERR,
			      "SEND with no receive posted, rnr_retry 0: IBV_WC_RNR_RETRY_EXC_ERR");
			check(one_wr(rnr1, cq2, IBV_WR_SEND, buf, 16, mr->lkey, 0, 0,
				     "SEND, no receive posted, rnr_retry 1") ==
				      IBV_WC_RNR_RETRY_EXC_ERR,
			      "SEND with no receive posted, rnr_retry 1: IBV_WC_RNR_RETRY_EXC_ERR");
			{
				/* More signaled WRITEs than the send CQ holds, none polled: the
				 * overrun is an IBV_EVENT_CQ_ERR on the CQ (IBTA vol. 1 §11.6.3.2). */
				struct ibv_sge ws = {(uintptr_t)buf, 8, mr->lkey};
				struct ibv_send_wr w, *wb;
				struct ibv_async_event ev;
				int posted = 0, got = 0, k;

				memset(&w, 0, sizeof w);
				w.sg_list = &ws;
				w.num_sge = 1;
				w.opcode = IBV_WR_RDMA_WRITE;
				w.send_flags = IBV_SEND_SIGNALED;
				w.wr.rdma.remote_addr = po.addr + 3600;
				w.wr.rdma.rkey = po.rkey;
				for (k = 0; k < nw && small->cqe < nw - 1; k++)
					posted += ibv_post_send(over, &w, &wb) == 0;
				for (k = 0; k < 20 && !got; k++) {
					if (wait_async(ctx, 500, &ev) != 0)
						continue;
					got = ev.event_type == IBV_EVENT_CQ_ERR && ev.element.cq == small;
					if (!got)
						printf("info: async event %s\n",
						       ibv_event_type_str(ev.event_type));
					ibv_ack_async_event(&ev);
				}
				check(posted == nw && got,
				      "send CQ overrun: IBV_EVENT_CQ_ERR on the CQ");
			}
			{
				/* RTS -> SQD behind a WRITE: IBV_EVENT_SQ_DRAINED once it completed
				 * (IBTA vol. 1 §11.6.3.1). */
				struct ibv_sge ws = {(uintptr_t)buf, 8, mr->lkey};
				struct ibv_send_wr w, *wb;
				struct ibv_async_event ev;
				int ok, got = 0, k;

				memset(&w, 0, sizeof w);
				w.sg_list = &ws;
				w.num_sge = 1;
				w.opcode = IBV_WR_RDMA_WRITE;
				w.send_flags = IBV_SEND_SIGNALED;
				w.wr.rdma.remote_addr = pd2.addr + 3700;
				w.wr.rdma.rkey = pd2.rkey;
				ok = ibv_post_send(sqd, &w, &wb) == 0;
				memset(&qa, 0, sizeof qa);
				qa.qp_state = IBV_QPS_SQD;
				qa.en_sqd_async_notify = 1;
				ok = ok && ibv_modify_qp(sqd, &qa, IBV_QP_STATE |
								   IBV_QP_EN_SQD_ASYNC_NOTIFY) == 0;
				check(ok, "ibv_modify_qp RTS -> SQD behind a WRITE");
				for (k = 0; k < 20 && ok && !got; k++) {
					if (wait_async(ctx, 500, &ev) != 0)
						continue;
					got = ev.event_type == IBV_EVENT_SQ_DRAINED &&
					      ev.element.qp == sqd;
					if (!got)
						printf("info: async event %s\n",
						       ibv_event_type_str(ev.event_type));
					ibv_ack_async_event(&ev);
				}
				check(got, "IBV_EVENT_SQ_DRAINED on the QP in SQD");
				memset(&qa, 0, sizeof qa);
				check(ibv_query_qp(sqd, &qa, IBV_QP_STATE, &qia) == 0 &&
					      qa.qp_state == IBV_QPS_SQD && !qa.sq_draining,
				      "ibv_query_qp: SQD, not draining");
				/* Whether the WRITE had begun when the drain started is the device's
				 * choice (IBTA vol. 1 §10.3.1: SQD finishes the WRs in progress and
				 * starts no new one); back in RTS it completes either way. */
				memset(&qa, 0, sizeof qa);
				qa.qp_state = IBV_QPS_RTS;
				check(ibv_modify_qp(sqd, &qa, IBV_QP_STATE) == 0,
				      "ibv_modify_qp SQD -> RTS");
				memset(&wc, 0, sizeof wc);
				check(poll_one(cq2, &wc) == 1 && wc.status == IBV_WC_SUCCESS,
				      "the WRITE posted before SQD completes");
			}
			write_info(argv[4], "client-done2", &me);
		} else {
			read_info(argv[4], "client-done2", &peer);
			check((unsigned char)buf[3500] != 0x77 && (unsigned char)buf[3515] != 0x77,
			      "the refused RDMA WRITE left the buffer as it was");
			memset(&qa, 0, sizeof qa);
			check(ibv_query_qp(noacc, &qa, IBV_QP_STATE, &qia) == 0 &&
				      qa.qp_state == IBV_QPS_ERR,
			      "the QP that refused the WRITE is in ERR");
			memset(&qa, 0, sizeof qa);
			check(ibv_query_qp(rnr0, &qa, IBV_QP_STATE, &qia) == 0 &&
				      qa.qp_state == IBV_QPS_RTS,
			      "the QP that answered RNR NAKs is still in RTS");
		}
		check(ibv_destroy_qp(noacc) == 0 && ibv_destroy_qp(past) == 0 &&
			      ibv_destroy_qp(rnr0) == 0 && ibv_destroy_qp(rnr1) == 0 &&
			      ibv_destroy_qp(over) == 0 && ibv_destroy_qp(sqd) == 0,
		      "ibv_destroy_qp (phase 2)");
		check(ibv_destroy_cq(cq2) == 0 && ibv_destroy_cq(small) == 0,
		      "ibv_destroy_cq (phase 2)");
	}

	check(ibv_dereg_mr(mr2) == 0, "ibv_dereg_mr");
	check(ibv_destroy_qp(qp) == 0, "ibv_destroy_qp");
	check(ibv_destroy_cq(scq) == 0 && ibv_destroy_cq(rcq) == 0, "ibv_destroy_cq");
	check(ibv_destroy_comp_channel(ch) == 0, "ibv_destroy_comp_channel");
	check(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
	check(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	check(ibv_close_device(ctx) == 0, "ibv_close_device");
	ibv_free_device_list(list);
out:
	return summary();
}
