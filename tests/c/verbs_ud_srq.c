/* UD, UC and SRQ verbs and their error paths, through the system's <infiniband/verbs.h>
 * (libibverbs-dev), linked with -libverbs: on xrnic through `xrnic exec`
 * (tests/verbs_abi_c.rs), written to run on Linux rxe the same way.
 *
 *   verbs_ud_srq DEVICE GID_INDEX server|client DIR
 *
 * As tests/c/verbs_suite.c: the two processes exchange QP numbers, GID, buffer address
 * and rkey through files in DIR; one line per check, then "N passed, M failed". */
#include <fcntl.h>
#include "common.h"

#define QKEY 0x11111111u

struct info {
	uint32_t ud_qpn, uc_qpn, rc_qpn;
	uint32_t rkey;
	uint64_t addr;
	union ibv_gid gid;
};

static int post_recv(struct ibv_qp *qp, struct ibv_srq *srq, char *addr, uint32_t len,
		     uint32_t lkey, uint64_t id)
{
	struct ibv_sge s = {(uintptr_t)addr, len, lkey};
	struct ibv_recv_wr w, *bad;

	memset(&w, 0, sizeof w);
	w.wr_id = id;
	w.sg_list = &s;
	w.num_sge = 1;
	return srq ? ibv_post_srq_recv(srq, &w, &bad) : ibv_post_recv(qp, &w, &bad);
}

/* One UD SEND (with immediate when imm != 0) of `len` bytes at `addr`. */
static int ud_send(struct ibv_qp *qp, struct ibv_ah *ah, uint32_t qpn, char *addr,
		   uint32_t len, uint32_t lkey, uint32_t imm, struct ibv_send_wr **bad)
{
	struct ibv_sge s = {(uintptr_t)addr, len, lkey};
	struct ibv_send_wr w;

	memset(&w, 0, sizeof w);
	w.wr_id = len;
	w.sg_list = &s;
	w.num_sge = 1;
	w.opcode = imm ? IBV_WR_SEND_WITH_IMM : IBV_WR_SEND;
	w.imm_data = htobe32(imm);
	w.send_flags = IBV_SEND_SIGNALED;
	w.wr.ud.ah = ah;
	w.wr.ud.remote_qpn = qpn;
	w.wr.ud.remote_qkey = QKEY;
	return ibv_post_send(qp, &w, bad);
}

static int is_v4(const union ibv_gid *g)
{
	static const uint8_t pfx[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	return memcmp(g->raw, pfx, 12) == 0;
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	struct ibv_port_attr pa;
	union ibv_gid gid, mgid;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq *ud_cq, *uc_cq, *rc_scq, *rc_rcq;
	struct ibv_qp *ud, *uc, *rc;
	struct ibv_srq *srq;
	struct ibv_ah *ah = NULL, *ah_fl = NULL;
	struct ibv_ah_attr aa;
	struct ibv_qp_init_attr qia;
	struct ibv_srq_init_attr sia;
	struct ibv_srq_attr sa;
	struct ibv_qp_attr qa;
	struct ibv_send_wr swr, *bad;
	struct ibv_async_event ev;
	struct ibv_wc wc;
	struct info me, peer;
	char *buf;
	int i, n, gid_index, server, xrnic = 0;
	const size_t len = 16384;

	if (argc != 5) {
		fprintf(stderr, "usage: %s DEVICE GID_INDEX server|client DIR\n", argv[0]);
		return 2;
	}
	gid_index = atoi(argv[2]);
	server = strcmp(argv[3], "server") == 0;
	list = ibv_get_device_list(&n);
	ctx = open_named(list, n, argv[1]);
	check(ctx != NULL, "ibv_open_device");
	if (!ctx)
		goto out;
	xrnic = strncmp(argv[1], "xrnic_", 6) == 0;
	check(ibv_query_port(ctx, 1, &pa) == 0 && ibv_query_gid(ctx, 1, gid_index, &gid) == 0,
	      "ibv_query_port, ibv_query_gid");
	pd = ibv_alloc_pd(ctx);
	buf = aligned_alloc(4096, len);
	memset(buf, 0, len);
	mr = ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
	check(pd != NULL && mr != NULL, "ibv_alloc_pd, ibv_reg_mr");
	ud_cq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
	uc_cq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
	rc_scq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
	rc_rcq = ibv_create_cq(ctx, 32, NULL, NULL, 0);

	/* Address handles: RoCE needs the GRH. */
	memset(&aa, 0, sizeof aa);
	aa.port_num = 1;
	errno = 0;
	check(ibv_create_ah(pd, &aa) == NULL && errno == EINVAL,
	      "ibv_create_ah without a GRH: NULL, EINVAL");

	/* UD QP: INIT needs PKEY_INDEX | PORT | QKEY, RTR only STATE, RTS STATE | SQ_PSN. */
	memset(&qia, 0, sizeof qia);
	qia.send_cq = ud_cq;
	qia.recv_cq = ud_cq;
	qia.qp_type = IBV_QPT_UD;
	qia.cap.max_send_wr = 16;
	qia.cap.max_recv_wr = 16;
	qia.cap.max_send_sge = 1;
	qia.cap.max_recv_sge = 1;
	ud = ibv_create_qp(pd, &qia);
	check(ud != NULL && ud->qp_type == IBV_QPT_UD, "ibv_create_qp UD");
	if (!ud)
		goto out;
	memset(&qa, 0, sizeof qa);
	qa.qp_state = IBV_QPS_INIT;
	qa.port_num = 1;
	qa.qkey = QKEY;
	check(ibv_modify_qp(ud, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT) == EINVAL,
	      "UD RESET->INIT without IBV_QP_QKEY: EINVAL");
	check(ibv_modify_qp(ud, &qa, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					     IBV_QP_QKEY) == 0,
	      "UD RESET->INIT with PKEY_INDEX | PORT | QKEY");
	qa.qp_state = IBV_QPS_RTR;
	check(ibv_modify_qp(ud, &qa, IBV_QP_STATE | IBV_QP_PATH_MTU) == EINVAL,
	      "UD INIT->RTR with a path MTU: EINVAL");
	check(ibv_modify_qp(ud, &qa, IBV_QP_STATE) == 0, "UD INIT->RTR with STATE");
	qa.qp_state = IBV_QPS_RTS;
	qa.sq_psn = 0;
	check(ibv_modify_qp(ud, &qa, IBV_QP_STATE | IBV_QP_SQ_PSN) == 0,
	      "UD RTR->RTS with STATE | SQ_PSN");
	memset(&qa, 0, sizeof qa);
	check(ibv_query_qp(ud, &qa, IBV_QP_STATE | IBV_QP_QKEY, &qia) == 0 &&
		      qa.qp_state == IBV_QPS_RTS && qa.qkey == QKEY && qia.qp_type == IBV_QPT_UD,
	      "ibv_query_qp UD: RTS, the Q_Key, the type");
	/* Multicast (ib_core ib_attach_mcast, uverbs, rxe_mcast.c): a UD QP joins the
	 * IPv4 group 239.1.2.3 as its mapped GID. */
	memset(&mgid, 0, sizeof mgid);
	mgid.raw[10] = mgid.raw[11] = 0xff;
	mgid.raw[12] = 239;
	mgid.raw[13] = 1;
	mgid.raw[14] = 2;
	mgid.raw[15] = 3;
	check(ibv_attach_mcast(ud, &gid, 0) == EINVAL,
	      "ibv_attach_mcast with a unicast GID: EINVAL");
	check(ibv_attach_mcast(ud, &mgid, 0) == 0 && ibv_attach_mcast(ud, &mgid, 0) == 0,
	      "ibv_attach_mcast UD to ::ffff:239.1.2.3, twice: 0");
	check(ibv_detach_mcast(ud, &mgid, 0) == 0, "ibv_detach_mcast: 0");
	check(ibv_detach_mcast(ud, &mgid, 0) == EINVAL,
	      "ibv_detach_mcast of a group not attached: EINVAL");

	/* UC QP. */
	qia.send_cq = uc_cq;
	qia.recv_cq = uc_cq;
	qia.qp_type = IBV_QPT_UC;
	uc = ibv_create_qp(pd, &qia);
	check(uc != NULL && uc->qp_type == IBV_QPT_UC, "ibv_create_qp UC");
	if (!uc)
		goto out;
	check(ibv_attach_mcast(uc, &mgid, 0) == EINVAL,
	      "ibv_attach_mcast of a UC QP: EINVAL (UD only)");

	/* SRQ, and an RC QP on it. */
	memset(&sia, 0, sizeof sia);
	sia.attr.max_wr = 16;
	sia.attr.max_sge = 1000;
	errno = 0;
	check(ibv_create_srq(pd, &sia) == NULL && errno == EINVAL,
	      "ibv_create_srq with max_sge past max_srq_sge: NULL, EINVAL");
	sia.attr.max_sge = 1;
	srq = ibv_create_srq(pd, &sia);
	check(srq != NULL && sia.attr.max_wr >= 16, "ibv_create_srq");
	if (!srq)
		goto out;
	sa.srq_limit = 17;
	check(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) == EINVAL,
	      "ibv_modify_srq with srq_limit past max_wr: EINVAL");
	memset(&sa, 0, sizeof sa);
	check(ibv_query_srq(srq, &sa) == 0 && sa.max_wr >= 16 && sa.srq_limit == 0,
	      "ibv_query_srq: max_wr, no limit armed");
	qia.send_cq = rc_scq;
	qia.recv_cq = rc_rcq;
	qia.qp_type = IBV_QPT_RC;
	qia.srq = srq;
	rc = ibv_create_qp(pd, &qia);
	check(rc != NULL && rc->srq == srq, "ibv_create_qp RC on the SRQ");
	if (!rc)
		goto out;
	check(ibv_destroy_srq(srq) == EBUSY, "ibv_destroy_srq of an SRQ in use: EBUSY");

	/* The async fd: non-blocking, nothing yet. */
	fcntl(ctx->async_fd, F_SETFL, fcntl(ctx->async_fd, F_GETFL) | O_NONBLOCK);
	errno = 0;
	check(ibv_get_async_event(ctx, &ev) == -1 && errno == EAGAIN,
	      "ibv_get_async_event on a non-blocking fd with no event: -1, EAGAIN");

	me.ud_qpn = ud->qp_num;
	me.uc_qpn = uc->qp_num;
	me.rc_qpn = rc->qp_num;
	me.rkey = mr->rkey;
	me.addr = (uintptr_t)buf;
	me.gid = gid;
	check(write_info(argv[4], argv[3], &me) == 0 &&
		      read_info(argv[4], server ? "client" : "server", &peer) == 0,
	      "exchange QP numbers through DIR");
	check(connect_qp(uc, 1, peer.uc_qpn, &peer.gid, gid_index) == 0,
	      "UC INIT, RTR, RTS (no RDMA-atomic or retry attributes)");
	check(connect_qp(rc, 0, peer.rc_qpn, &peer.gid, gid_index) == 0,
	      "RC on the SRQ: INIT, RTR, RTS");
	check(post_recv(rc, NULL, buf, 64, mr->lkey, 1) == EINVAL,
	      "ibv_post_recv on a QP with an SRQ: EINVAL");

	memset(&aa, 0, sizeof aa);
	aa.is_global = 1;
	aa.port_num = 1;
	aa.grh.dgid = peer.gid;
	aa.grh.sgid_index = gid_index;
	aa.grh.hop_limit = 64;
	if (server) {
		/* Four UD receives (GRH + 256), four SRQ receives, one UC receive. */
		for (i = 0; i < 4; i++)
			post_recv(ud, NULL, buf + 512 * i, 40 + 256, mr->lkey, 10 + i);
		for (i = 0; i < 4; i++)
			post_recv(NULL, srq, buf + 4096 + 64 * i, 64, mr->lkey, 20 + i);
		post_recv(uc, NULL, buf, 0, mr->lkey, 30);
		sa.srq_limit = 3;
		check(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) == 0, "ibv_modify_srq arms limit 3");
	} else {
		post_recv(ud, NULL, buf, 40 + 256, mr->lkey, 10);
		ah = ibv_create_ah(pd, &aa);
		check(ah != NULL, "ibv_create_ah to the peer's GID");
	}
	write_info(argv[4], server ? "server-ready" : "client-ready", &me);
	read_info(argv[4], server ? "client-ready" : "server-ready", &peer);

	if (!server) {
		for (i = 0; i < 100; i++)
			buf[8192 + i] = (char)(i * 3 + 1);
		check(ud_send(ud, ah, peer.ud_qpn, buf + 8192, 100, mr->lkey, 0xabc, &bad) == 0 &&
			      poll_one(ud_cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
			      wc.opcode == IBV_WC_SEND,
		      "UD SEND with immediate completes");
		/* rxe's provider follows the pointer; xrnic looks it up. */
		if (xrnic)
			check(ud_send(ud, NULL, peer.ud_qpn, buf + 8192, 10, mr->lkey, 0, &bad) ==
					  EINVAL,
			      "UD SEND without an address handle: EINVAL");
		/* Longer than the path MTU: completes successfully and is not sent (IBTA
		 * C10-93.1.1; rxe fakes it the same way). */
		check((int)pa.active_mtu <= IBV_MTU_1024 &&
			      ud_send(ud, ah, peer.ud_qpn, buf + 8192, 2000, mr->lkey, 0, &bad) == 0 &&
			      poll_one(ud_cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS,
		      "UD SEND past the MTU completes successfully");
		/* A flow label past the GRH's 20 bits, as UCX 1.13's UD transport passes
		 * (0xffffffff): ib_core stores it and the wire takes the low 20 bits; xrnic
		 * refused every send through such an AH with EINVAL. Checked on xrnic only
		 * (rxe's answer was not checked here). */
		ah_fl = ah;
		if (xrnic) {
			aa.grh.flow_label = 0xffffffff;
			ah_fl = ibv_create_ah(pd, &aa);
			aa.grh.flow_label = 0;
			check(ah_fl != NULL, "ibv_create_ah with flow label 0xffffffff");
		}
		check(ah_fl && ud_send(ud, ah_fl, peer.ud_qpn, buf + 8192, 10, mr->lkey, 0, &bad) == 0 &&
			      poll_one(ud_cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS,
		      "UD SEND of 10 bytes completes");
		check(poll_one(ud_cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
			      wc.opcode == IBV_WC_RECV && (wc.wc_flags & IBV_WC_GRH) &&
			      wc.src_qp == peer.ud_qpn && wc.byte_len == 40 + 8,
		      "the reply through an AH made from the receive arrives");

		/* UC: RDMA WRITE with immediate. */
		struct ibv_sge s = {(uintptr_t)buf + 8192, 64, mr->lkey};
		memset(&swr, 0, sizeof swr);
		swr.sg_list = &s;
		swr.num_sge = 1;
		swr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
		swr.send_flags = IBV_SEND_SIGNALED;
		swr.imm_data = htobe32(0x77);
		swr.wr.rdma.remote_addr = peer.addr + 12288;
		swr.wr.rdma.rkey = peer.rkey;
		check(ibv_post_send(uc, &swr, &bad) == 0 && poll_one(uc_cq, &wc) == 1 &&
			      wc.status == IBV_WC_SUCCESS,
		      "UC RDMA WRITE with immediate completes");
		swr.opcode = IBV_WR_RDMA_READ;
		check(ibv_post_send(uc, &swr, &bad) == EINVAL, "RDMA READ on UC: EINVAL");
		/* RC on the SRQ: two SENDs. */
		swr.opcode = IBV_WR_SEND;
		s.length = 32;
		for (i = 0; i < 2; i++)
			check(ibv_post_send(rc, &swr, &bad) == 0 && poll_one(rc_scq, &wc) == 1 &&
				      wc.status == IBV_WC_SUCCESS,
			      "RC SEND to the QP on the SRQ completes");
		write_info(argv[4], "client-done", &me);
	} else {
		struct pollfd pfd = {ctx->async_fd, POLLIN, 0};
		union ibv_gid sg, dg;
		int ok = 1;

		check(poll_one(ud_cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
			      wc.opcode == IBV_WC_RECV && wc.wr_id == 10 &&
			      (wc.wc_flags & IBV_WC_GRH) && (wc.wc_flags & IBV_WC_WITH_IMM) &&
			      be32toh(wc.imm_data) == 0xabc && wc.src_qp == peer.ud_qpn &&
			      wc.byte_len == 40 + 100 && wc.slid == 0 && wc.pkey_index == 0,
		      "UD receive: GRH flag, immediate, src_qp, 40 + 100 bytes");
		for (i = 0; i < 100; i++)
			ok &= buf[40 + i] == (char)(i * 3 + 1);
		check(ok, "UD payload after the 40-byte GRH");
		/* The RoCE v2 packet type in wc.sl as a ConnectX reports it (bit 3 UDP, then 2
		 * IPv4 or 1 IPv6), which UCX 1.13's UD transport needs; rxe reports 0. */
		if (xrnic)
			check(wc.sl == (is_v4(&gid) ? 0xa : 0x9),
			      "UD receive: wc.sl names the frame's IP version");
		if (is_v4(&gid)) {
			/* 20 bytes, then the IPv4 header (rxe, RoCE v2 over IPv4). */
			check((uint8_t)buf[20] == 0x45 && buf[20 + 9] == 17 &&
				      memcmp(buf + 32, peer.gid.raw + 12, 4) == 0 &&
				      memcmp(buf + 36, gid.raw + 12, 4) == 0,
			      "GRH: the IPv4 header, the peer's and our address");
		} else {
			memcpy(sg.raw, buf + 8, 16);
			memcpy(dg.raw, buf + 24, 16);
			check(((uint8_t)buf[0] >> 4) == 6 && buf[6] == 17 &&
				      memcmp(&sg, &peer.gid, 16) == 0 && memcmp(&dg, &gid, 16) == 0,
			      "GRH: the IPv6 header, source and destination GIDs");
		}
		check(ibv_init_ah_from_wc(ctx, 1, &wc, (struct ibv_grh *)buf, &aa) == 0 &&
			      aa.is_global && memcmp(&aa.grh.dgid, &peer.gid, 16) == 0 &&
			      aa.grh.sgid_index == gid_index && aa.port_num == 1,
		      "ibv_init_ah_from_wc: the peer's GID, our GID index");
		ah = ibv_create_ah_from_wc(pd, &wc, (struct ibv_grh *)buf, 1);
		check(ah != NULL, "ibv_create_ah_from_wc");
		check(poll_one(ud_cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS && wc.wr_id == 11 &&
			      wc.byte_len == 40 + 10,
		      "the datagram past the MTU never arrived: the next one is the 10 bytes");
		check(ah && ud_send(ud, ah, wc.src_qp, buf + 8192, 8, mr->lkey, 0, &bad) == 0 &&
			      poll_one(ud_cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS,
		      "reply through the AH made from the receive");

		check(poll_one(uc_cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
			      wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && be32toh(wc.imm_data) == 0x77 &&
			      buf[12288] == 1 && buf[12288 + 63] == (char)(63 * 3 + 1),
		      "UC RDMA WRITE with immediate landed");
		for (i = 0; i < 2; i++)
			check(poll_one(rc_rcq, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
				      wc.wr_id == (uint64_t)(20 + i) && wc.byte_len == 32,
			      "RC SEND received into the SRQ's WQE, in order");
		/* 4 WQEs, 2 taken: 2 < 3, the limit event. */
		check(poll(&pfd, 1, 30000) == 1, "the async fd becomes readable");
		check(wait_async_except(ctx, 30000, IBV_EVENT_COMM_EST, &ev) == 0 &&
			      ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED && ev.element.srq == srq,
		      "ibv_get_async_event: IBV_EVENT_SRQ_LIMIT_REACHED on the SRQ");
		ibv_ack_async_event(&ev);
		check(srq->events_completed == 1,
		      "ibv_ack_async_event counts on the SRQ (events_completed)");
		memset(&sa, 0, sizeof sa);
		check(ibv_query_srq(srq, &sa) == 0 && sa.srq_limit == 0,
		      "the limit is disarmed after the event");
		read_info(argv[4], "client-done", &peer);
		{
			/* A QP on an SRQ entering ERR: IBV_EVENT_QP_LAST_WQE_REACHED
			 * (IBTA vol. 1 §10.2.9.5). */
			struct ibv_qp_attr ea;
			int got;
			memset(&ea, 0, sizeof ea);
			ea.qp_state = IBV_QPS_ERR;
			check(ibv_modify_qp(rc, &ea, IBV_QP_STATE) == 0, "RC on the SRQ to ERR");
			got = wait_async_except(ctx, 30000, IBV_EVENT_COMM_EST, &ev) == 0;
			check(got && ev.event_type == IBV_EVENT_QP_LAST_WQE_REACHED &&
				      ev.element.qp == rc,
			      "ibv_get_async_event: IBV_EVENT_QP_LAST_WQE_REACHED on the QP");
			if (got)
				ibv_ack_async_event(&ev);
		}
	}

	check(ibv_destroy_qp(rc) == 0 && ibv_destroy_srq(srq) == 0,
	      "ibv_destroy_qp, then ibv_destroy_srq");
	check(!ah || ibv_destroy_ah(ah) == 0, "ibv_destroy_ah");
	check(!ah_fl || ah_fl == ah || ibv_destroy_ah(ah_fl) == 0, "ibv_destroy_ah (flow label)");
	check(ibv_destroy_qp(ud) == 0 && ibv_destroy_qp(uc) == 0, "ibv_destroy_qp UD, UC");
	ibv_destroy_cq(ud_cq);
	ibv_destroy_cq(uc_cq);
	ibv_destroy_cq(rc_scq);
	ibv_destroy_cq(rc_rcq);
	check(ibv_dereg_mr(mr) == 0 && ibv_dealloc_pd(pd) == 0, "ibv_dereg_mr, ibv_dealloc_pd");
	check(ibv_close_device(ctx) == 0, "ibv_close_device");
	ibv_free_device_list(list);
out:
	return summary();
}
