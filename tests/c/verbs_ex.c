/* The extended verbs: ibv_create_qp_ex and the ibv_wr_* work-request API, ibv_create_cq_ex
 * and the ibv_start_poll / ibv_next_poll / ibv_wc_read_* API with completion timestamps,
 * ibv_query_rt_values_ex, ibv_resize_cq, and the capability edges rxe answers (queue sizes
 * rounded and written back, max_send_wr / max_recv_wr 0, comp_vector, max_cqe). Through
 * the system's <infiniband/verbs.h>, linked with -libverbs: on xrnic through `xrnic exec`
 * (tests/verbs_abi_c.rs), and meant to run on Linux rxe the same way.
 *
 *   verbs_ex DEVICE GID_INDEX server|client DIR
 *
 * Two processes exchange their QP number, GID, buffer address and rkey through files in
 * DIR. One line per check ("info:" lines are what the device answered, for a comparison
 * with another device), then "N passed, M failed"; exit status 0 only when nothing
 * failed. */
#include <endian.h>
#include "common.h"

struct info {
	uint32_t qpn;
	uint32_t rkey;
	uint64_t addr;
	union ibv_gid gid;
};

#define ALL_ACCESS                                                                     \
	(IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_LOCAL_WRITE |   \
	 IBV_ACCESS_REMOTE_ATOMIC)

/* The next completion of `cq` through the extended API (bounded): 0 with the CQ's
 * current completion set (ibv_end_poll already called), or ENOENT. */
static int next_ex(struct ibv_cq_ex *cq)
{
	struct ibv_poll_cq_attr pa = {0};
	long n;

	for (n = 0; n < 200000000L; n++) {
		int r = ibv_start_poll(cq, &pa);
		if (r == 0)
			return 0;
		if (r != ENOENT)
			return r;
	}
	return ENOENT;
}

/* After a successful start: the next completion through ibv_next_poll (bounded): 0, or
 * ENOENT. */
static int more_ex(struct ibv_cq_ex *cq)
{
	long n;

	for (n = 0; n < 200000000L; n++) {
		int r = ibv_next_poll(cq);
		if (r != ENOENT)
			return r;
	}
	return ENOENT;
}

/* A QP made by ibv_create_qp_ex with `mask` and the given extras; NULL (errno set) on
 * refusal. */
static struct ibv_qp *qp_ex(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq *cq,
			    enum ibv_qp_type t, uint32_t mask, uint32_t create_flags,
			    uint64_t send_ops, uint32_t send_wr, uint32_t recv_wr,
			    struct ibv_qp_cap *cap)
{
	struct ibv_qp_init_attr_ex a;
	struct ibv_qp *qp;

	memset(&a, 0, sizeof a);
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = t;
	a.cap.max_send_wr = send_wr;
	a.cap.max_recv_wr = recv_wr;
	a.cap.max_send_sge = 2;
	a.cap.max_recv_sge = 1;
	a.cap.max_inline_data = 64;
	a.comp_mask = mask;
	a.pd = pd;
	a.create_flags = create_flags;
	a.max_tso_header = 64;
	a.send_ops_flags = send_ops;
	errno = 0;
	qp = ibv_create_qp_ex(ctx, &a);
	if (cap)
		*cap = a.cap;
	return qp;
}

static void edges(struct ibv_context *ctx, struct ibv_pd *pd)
{
	struct ibv_device_attr_ex dx;
	struct ibv_values_ex rt;
	struct ibv_cq *cq;
	struct ibv_cq_ex *cqx;
	struct ibv_cq_init_attr_ex ca;
	struct ibv_qp *qp;
	struct ibv_qp_cap cap;
	const uint32_t pdm = IBV_QP_INIT_ATTR_PD;

	memset(&dx, 0, sizeof dx);
	check(ibv_query_device_ex(ctx, NULL, &dx) == 0 && dx.completion_timestamp_mask != 0 &&
		      dx.hca_core_clock != 0,
	      "ibv_query_device_ex: completion_timestamp_mask and hca_core_clock");
	printf("info: hca_core_clock %llu kHz, completion_timestamp_mask 0x%llx\n",
	       (unsigned long long)dx.hca_core_clock,
	       (unsigned long long)dx.completion_timestamp_mask);
	memset(&rt, 0, sizeof rt);
	rt.comp_mask = IBV_VALUES_MASK_RAW_CLOCK;
	check(ibv_query_rt_values_ex(ctx, &rt) == 0 && (rt.comp_mask & IBV_VALUES_MASK_RAW_CLOCK) &&
		      (rt.raw_clock.tv_sec != 0 || rt.raw_clock.tv_nsec != 0),
	      "ibv_query_rt_values_ex: the raw clock");

	/* CQs. */
	printf("info: num_comp_vectors %d, max_cqe %d\n", ctx->num_comp_vectors,
	       dx.orig_attr.max_cqe);
	errno = 0;
	cq = ibv_create_cq(ctx, 16, NULL, NULL, ctx->num_comp_vectors);
	check(cq == NULL && errno == EINVAL, "ibv_create_cq with comp_vector num_comp_vectors: EINVAL");
	cq = ibv_create_cq(ctx, 100, NULL, NULL, 0);
	check(cq != NULL && cq->cqe >= 100, "ibv_create_cq 100: cqe >= 100 reported");
	if (cq) {
		printf("info: ibv_create_cq 100: cqe %d\n", cq->cqe);
		ibv_destroy_cq(cq);
	}
	cq = ibv_create_cq(ctx, dx.orig_attr.max_cqe, NULL, NULL, 0);
	check(cq != NULL, "ibv_create_cq with max_cqe");
	if (cq)
		ibv_destroy_cq(cq);
	errno = 0;
	cq = ibv_create_cq(ctx, dx.orig_attr.max_cqe + 1, NULL, NULL, 0);
	check(cq == NULL && errno == EINVAL, "ibv_create_cq past max_cqe: EINVAL");
	memset(&ca, 0, sizeof ca);
	ca.cqe = 16;
	ca.wc_flags = IBV_WC_EX_WITH_FLOW_TAG;
	errno = 0;
	cqx = ibv_create_cq_ex(ctx, &ca);
	check(cqx == NULL && errno == EOPNOTSUPP, "ibv_create_cq_ex with FLOW_TAG: EOPNOTSUPP");

	/* QP creation variants and edges. */
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	qp = qp_ex(ctx, pd, cq, IBV_QPT_RC, pdm | IBV_QP_INIT_ATTR_CREATE_FLAGS, 0, 0, 4, 4, NULL);
	check(qp != NULL, "ibv_create_qp_ex PD|CREATE_FLAGS, flags 0");
	if (qp)
		ibv_destroy_qp(qp);
	qp = qp_ex(ctx, pd, cq, IBV_QPT_RC, pdm | IBV_QP_INIT_ATTR_CREATE_FLAGS,
		   IBV_QP_CREATE_SCATTER_FCS, 0, 4, 4, NULL);
	check(qp == NULL && errno == EOPNOTSUPP, "ibv_create_qp_ex with a create flag: EOPNOTSUPP");
	qp = qp_ex(ctx, pd, cq, IBV_QPT_RC, pdm | IBV_QP_INIT_ATTR_MAX_TSO_HEADER, 0, 0, 4, 4,
		   NULL);
	check(qp == NULL && errno == EOPNOTSUPP, "ibv_create_qp_ex MAX_TSO_HEADER: EOPNOTSUPP");
	qp = qp_ex(ctx, pd, cq, IBV_QPT_UD, pdm | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, 0,
		   IBV_QP_EX_WITH_RDMA_WRITE, 4, 4, NULL);
	check(qp == NULL && errno == EOPNOTSUPP,
	      "ibv_create_qp_ex UD with WITH_RDMA_WRITE: EOPNOTSUPP");
	qp = qp_ex(ctx, pd, cq, IBV_QPT_UD, pdm | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, 0,
		   IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM, 4, 4, NULL);
	check(qp != NULL && ibv_qp_to_qp_ex(qp) != NULL,
	      "ibv_create_qp_ex UD with SEND ops, ibv_qp_to_qp_ex");
	if (qp)
		ibv_destroy_qp(qp);
	qp = qp_ex(ctx, pd, cq, IBV_QPT_RC, pdm, 0, 0, 0, 4, &cap);
	check(qp != NULL && cap.max_send_wr == 0, "a QP with max_send_wr 0 (receive only)");
	if (qp)
		ibv_destroy_qp(qp);
	qp = qp_ex(ctx, pd, cq, IBV_QPT_RC, pdm, 0, 0, 4, 0, &cap);
	check(qp != NULL && cap.max_recv_wr == 0, "a QP with max_recv_wr 0 (send only)");
	if (qp)
		ibv_destroy_qp(qp);
	qp = qp_ex(ctx, pd, cq, IBV_QPT_RC, pdm, 0, 0, 10, 10, &cap);
	check(qp != NULL && cap.max_send_wr >= 10 && cap.max_recv_wr >= 10,
	      "max_send_wr / max_recv_wr 10: at least 10 written back");
	printf("info: max_send_wr 10 -> %u, max_recv_wr 10 -> %u, max_inline_data 64 -> %u\n",
	       cap.max_send_wr, cap.max_recv_wr, cap.max_inline_data);
	if (qp)
		ibv_destroy_qp(qp);
	/* A full receive queue: ENOMEM for one receive more than max_recv_wr. */
	qp = qp_ex(ctx, pd, cq, IBV_QPT_RC, pdm, 0, 0, 4, 2, &cap);
	if (qp) {
		struct ibv_qp_attr a;
		struct ibv_recv_wr rwr, *rbad;
		uint32_t k, ok = 0;

		memset(&a, 0, sizeof a);
		a.qp_state = IBV_QPS_INIT;
		a.port_num = 1;
		ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					      IBV_QP_ACCESS_FLAGS);
		memset(&rwr, 0, sizeof rwr);
		for (k = 0; k < cap.max_recv_wr; k++)
			ok += ibv_post_recv(qp, &rwr, &rbad) == 0;
		check(ok == cap.max_recv_wr, "max_recv_wr receives posted in INIT");
		check(ibv_post_recv(qp, &rwr, &rbad) == ENOMEM && rbad == &rwr,
		      "one receive more: ENOMEM, bad_wr the WR");
		ibv_destroy_qp(qp);
	}

	/* At the advertised maxima: a QP with max_qp_wr send requests, an SRQ of max_srq_wr
	 * with max_srq_sge; one more is EINVAL. */
	qp = qp_ex(ctx, pd, cq, IBV_QPT_RC, pdm, 0, 0, dx.orig_attr.max_qp_wr, 4, &cap);
	check(qp != NULL && cap.max_send_wr >= (uint32_t)dx.orig_attr.max_qp_wr,
	      "a QP with max_send_wr max_qp_wr");
	if (qp)
		ibv_destroy_qp(qp);
	qp = qp_ex(ctx, pd, cq, IBV_QPT_RC, pdm, 0, 0, dx.orig_attr.max_qp_wr + 1, 4, NULL);
	check(qp == NULL && errno == EINVAL, "max_send_wr past max_qp_wr: EINVAL");
	{
		struct ibv_srq_init_attr sa;
		struct ibv_srq *srq;

		memset(&sa, 0, sizeof sa);
		sa.attr.max_wr = dx.orig_attr.max_srq_wr;
		sa.attr.max_sge = dx.orig_attr.max_srq_sge;
		srq = ibv_create_srq(pd, &sa);
		check(srq != NULL && sa.attr.max_wr >= (uint32_t)dx.orig_attr.max_srq_wr,
		      "an SRQ with max_srq_wr and max_srq_sge");
		printf("info: max_qp_wr %d, max_srq_wr %d, max_srq_sge %d\n", dx.orig_attr.max_qp_wr,
		       dx.orig_attr.max_srq_wr, dx.orig_attr.max_srq_sge);
		if (srq)
			ibv_destroy_srq(srq);
		sa.attr.max_wr = dx.orig_attr.max_srq_wr + 1;
		sa.attr.max_sge = 1;
		errno = 0;
		srq = ibv_create_srq(pd, &sa);
		check(srq == NULL && errno == EINVAL, "an SRQ past max_srq_wr: EINVAL");
		if (srq)
			ibv_destroy_srq(srq);
	}
	ibv_destroy_cq(cq);
}

/* ibv_resize_cq with completions queued: five receives flushed on a QP in ERR. */
static void resize(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_mr *mr, char *buf)
{
	struct ibv_cq *cq = ibv_create_cq(ctx, 8, NULL, NULL, 0);
	struct ibv_qp_init_attr qia;
	struct ibv_qp_attr a;
	struct ibv_recv_wr rwr, *bad;
	struct ibv_sge s = {(uintptr_t)buf, 16, mr->lkey};
	struct ibv_wc wc[8];
	struct ibv_qp *qp;
	int i, n = 0, got = 0, inorder = 1, r;

	if (!cq) {
		check(0, "ibv_create_cq (resize)");
		return;
	}
	memset(&qia, 0, sizeof qia);
	qia.send_cq = cq;
	qia.recv_cq = cq;
	qia.qp_type = IBV_QPT_RC;
	qia.cap.max_send_wr = 1;
	qia.cap.max_recv_wr = 8;
	qia.cap.max_send_sge = 1;
	qia.cap.max_recv_sge = 1;
	qp = ibv_create_qp(pd, &qia);
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_ERR;
	check(qp != NULL && ibv_modify_qp(qp, &a, IBV_QP_STATE) == 0, "a QP in ERR (resize)");
	if (!qp)
		return;
	for (i = 0; i < 5; i++) {
		memset(&rwr, 0, sizeof rwr);
		rwr.wr_id = 500 + i;
		rwr.sg_list = &s;
		rwr.num_sge = 1;
		n += ibv_post_recv(qp, &rwr, &bad) == 0;
	}
	check(n == 5, "five receives posted in ERR");
	/* Wait until the five are queued (the flush is the device's). */
	for (i = 0; i < 1000; i++) {
		usleep(1000);
		if (ibv_resize_cq(cq, 4) != 0)
			break;
	}
	check(ibv_resize_cq(cq, 4) == EINVAL, "ibv_resize_cq below the completions queued: EINVAL");
	check(ibv_resize_cq(cq, 5) == 0 && cq->cqe >= 5, "ibv_resize_cq shrinks to the five queued");
	printf("info: ibv_resize_cq 5: cqe %d\n", cq->cqe);
	check(ibv_resize_cq(cq, 200) == 0 && cq->cqe >= 200, "ibv_resize_cq grows to 200");
	printf("info: ibv_resize_cq 200: cqe %d\n", cq->cqe);
	while (got < 5 && (r = poll_one(cq, wc)) == 1) {
		inorder &= wc[0].wr_id == (uint64_t)(500 + got) && wc[0].status == IBV_WC_WR_FLUSH_ERR;
		got++;
	}
	check(got == 5 && inorder, "the five flushed completions, in order, after the resizes");
	check(ibv_resize_cq(cq, 0) == EINVAL, "ibv_resize_cq 0: EINVAL");
	ibv_destroy_qp(qp);
	ibv_destroy_cq(cq);
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_context *ctx = NULL;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_cq_ex *cqx;
	struct ibv_cq *cq;
	struct ibv_cq_init_attr_ex ca;
	struct ibv_qp *qp;
	struct ibv_qp_ex *qx;
	struct ibv_qp_cap cap;
	struct info me, peer;
	union ibv_gid gid;
	char *buf;
	int i, n, gid_index, server;
	const size_t len = 8192;
	const uint64_t ops = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_SEND_WITH_IMM |
			     IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_RDMA_WRITE_WITH_IMM |
			     IBV_QP_EX_WITH_RDMA_READ | IBV_QP_EX_WITH_ATOMIC_CMP_AND_SWP |
			     IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD;

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
		return summary();
	check(ibv_query_gid(ctx, 1, gid_index, &gid) == 0, "ibv_query_gid");
	pd = ibv_alloc_pd(ctx);
	buf = aligned_alloc(4096, len);
	memset(buf, 0, len);
	mr = ibv_reg_mr(pd, buf, len, ALL_ACCESS);
	check(pd != NULL && mr != NULL, "ibv_alloc_pd, ibv_reg_mr");
	if (!mr)
		return summary();

	edges(ctx, pd);
	resize(ctx, pd, mr, buf);

	/* The pair: an extended CQ with timestamps, an extended QP with the WR API. */
	memset(&ca, 0, sizeof ca);
	ca.cqe = 32;
	ca.wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP;
	cqx = ibv_create_cq_ex(ctx, &ca);
	check(cqx != NULL, "ibv_create_cq_ex with the standard flags and COMPLETION_TIMESTAMP");
	if (!cqx) {
		/* A device without a completion clock (rxe): the rest without timestamps. */
		ca.wc_flags = IBV_WC_STANDARD_FLAGS;
		cqx = ibv_create_cq_ex(ctx, &ca);
	}
	if (!cqx)
		return summary();
	cq = ibv_cq_ex_to_cq(cqx);
	qp = qp_ex(ctx, pd, cq, IBV_QPT_RC, IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
		   0, ops, 16, 16, &cap);
	qx = qp ? ibv_qp_to_qp_ex(qp) : NULL;
	check(qp != NULL && qx != NULL && &qx->qp_base == qp,
	      "ibv_create_qp_ex RC with SEND_OPS_FLAGS, ibv_qp_to_qp_ex");
	if (!qx)
		return summary();
	me.qpn = qp->qp_num;
	me.rkey = mr->rkey;
	me.addr = (uintptr_t)buf;
	me.gid = gid;
	check(write_info(argv[4], argv[3], &me) == 0 &&
		      read_info(argv[4], server ? "client" : "server", &peer) == 0 &&
		      connect_qp_access(qp, 0, peer.qpn, &peer.gid, gid_index, ALL_ACCESS) == 0,
	      "exchange, INIT, RTR, RTS");

	if (server) {
		struct ibv_recv_wr rwr, *rbad;
		uint64_t t0;
		int ok;

		for (i = 0; i < 2; i++) {
			struct ibv_sge rs = {(uintptr_t)(buf + 1024 + 256 * i), 256, mr->lkey};
			memset(&rwr, 0, sizeof rwr);
			rwr.wr_id = 100 + i;
			rwr.sg_list = &rs;
			rwr.num_sge = 1;
			ibv_post_recv(qp, &rwr, &rbad);
		}
		memset(buf, 0xc3, 16); /* what the client's RDMA READ reads */
		write_info(argv[4], "server-ready", &me);
		ok = next_ex(cqx) == 0;
		check(ok && cqx->status == IBV_WC_SUCCESS && cqx->wr_id == 100 &&
			      ibv_wc_read_opcode(cqx) == IBV_WC_RECV &&
			      ibv_wc_read_byte_len(cqx) == 32 &&
			      !(ibv_wc_read_wc_flags(cqx) & IBV_WC_WITH_IMM) &&
			      ibv_wc_read_qp_num(cqx) == qp->qp_num &&
			      ibv_wc_read_src_qp(cqx) == peer.qpn,
		      "ibv_start_poll: the SEND's receive, its accessors");
		t0 = ok && (ca.wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) ?
			     ibv_wc_read_completion_ts(cqx) : 0;
		if (ok)
			ibv_end_poll(cqx);
		ok = next_ex(cqx) == 0;
		check(ok && cqx->wr_id == 101 && ibv_wc_read_byte_len(cqx) == 16 &&
			      (ibv_wc_read_wc_flags(cqx) & IBV_WC_WITH_IMM) &&
			      ibv_wc_read_imm_data(cqx) == htobe32(0x1234) &&
			      memcmp(buf + 1024 + 256, "inline-sixteen!", 16) == 0,
		      "the inline SEND with immediate: its data and immediate");
		check(ok && t0 != 0 && ibv_wc_read_completion_ts(cqx) >= t0,
		      "completion timestamps, in order");
		/* (t0 is 0 without the clock: the check fails without reading it.) */
		if (ok)
			ibv_end_poll(cqx);
		read_info(argv[4], "client-done", &peer);
		for (i = 0, ok = 1; i < 64; i++)
			ok &= buf[2048 + i] == (char)(i + 1);
		check(ok, "the RDMA WRITE's bytes arrived");
		check(*(uint64_t *)(buf + 4096) == 9, "the atomics' result: 9");
	} else {
		struct ibv_sge two[3];
		uint64_t ids[3] = {0}, t0 = 0, tlast = 0;
		int ops_ok = 1, ts_ok = 1;
		char *w = buf + 2048;

		read_info(argv[4], "server-ready", &peer);
		for (i = 0; i < 64; i++)
			w[i] = (char)(i + 1);
		memset(buf, 0x5a, 32);
		ibv_wr_start(qx);
		qx->wr_id = 1;
		qx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_send(qx);
		ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)buf, 32);
		qx->wr_id = 2;
		qx->wr_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
		ibv_wr_send_imm(qx, htobe32(0x1234));
		ibv_wr_set_inline_data(qx, "inline-sixteen!", 16);
		qx->wr_id = 3;
		qx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(qx, peer.rkey, peer.addr + 2048);
		ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)w, 64);
		check(ibv_wr_complete(qx) == 0, "ibv_wr_complete: SEND, inline SEND_IMM, RDMA WRITE");
		/* One start, then ibv_next_poll for the others, one end. */
		for (i = 0; i < 3; i++) {
			if ((i == 0 ? next_ex(cqx) : more_ex(cqx)) != 0) {
				ops_ok = 0;
				break;
			}
			ids[i] = cqx->wr_id;
			ops_ok &= cqx->status == IBV_WC_SUCCESS;
			if (ca.wc_flags & IBV_WC_EX_WITH_COMPLETION_TIMESTAMP) {
				ts_ok &= ibv_wc_read_completion_ts(cqx) >= tlast;
				tlast = ibv_wc_read_completion_ts(cqx);
			}
			if (i == 0)
				t0 = tlast;
		}
		if (i > 0)
			ibv_end_poll(cqx);
		check(ops_ok && ids[0] == 1 && ids[1] == 2 && ids[2] == 3,
		      "the three complete in order, successfully");
		check(ts_ok && t0 != 0, "their completion timestamps");

		/* RDMA READ and the two atomics. */
		ibv_wr_start(qx);
		qx->wr_id = 4;
		qx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_read(qx, peer.rkey, peer.addr);
		ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)(buf + 512), 16);
		qx->wr_id = 5;
		ibv_wr_atomic_fetch_add(qx, peer.rkey, peer.addr + 4096, 5);
		ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)(buf + 600), 8);
		qx->wr_id = 6;
		ibv_wr_atomic_cmp_swp(qx, peer.rkey, peer.addr + 4096, 5, 9);
		ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)(buf + 608), 8);
		check(ibv_wr_complete(qx) == 0, "ibv_wr_complete: RDMA READ, FETCH_ADD, CMP_SWP");
		for (i = 0, ops_ok = 1; i < 3; i++) {
			if (next_ex(cqx) != 0) {
				ops_ok = 0;
				break;
			}
			ops_ok &= cqx->status == IBV_WC_SUCCESS && cqx->wr_id == (uint64_t)(4 + i);
			ibv_end_poll(cqx);
		}
		check(ops_ok && (unsigned char)buf[512] == 0xc3 && buf[527] == (char)0xc3,
		      "the RDMA READ's bytes");
		check(ops_ok && *(uint64_t *)(buf + 600) == 0 && *(uint64_t *)(buf + 608) == 5,
		      "FETCH_ADD returned 0, CMP_SWP returned 5");

		/* More SGEs than max_send_sge: wr_complete fails and posts nothing; an
		 * aborted batch posts nothing. */
		for (i = 0; i < 3; i++) {
			two[i].addr = (uintptr_t)buf;
			two[i].length = 8;
			two[i].lkey = mr->lkey;
		}
		ibv_wr_start(qx);
		qx->wr_id = 7;
		qx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_rdma_write(qx, peer.rkey, peer.addr + 3072);
		ibv_wr_set_sge_list(qx, cap.max_send_sge + 1, two);
		i = ibv_wr_complete(qx);
		printf("info: ibv_wr_complete with max_send_sge + 1 SGEs: %d\n", i);
		check(i != 0, "ibv_wr_complete with too many SGEs fails");
		ibv_wr_start(qx);
		qx->wr_id = 8;
		ibv_wr_rdma_write(qx, peer.rkey, peer.addr + 3072);
		ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)buf, 8);
		ibv_wr_abort(qx);
		/* A last WRITE: the only completion that follows is its own. */
		ibv_wr_start(qx);
		qx->wr_id = 9;
		ibv_wr_rdma_write(qx, peer.rkey, peer.addr + 3072);
		ibv_wr_set_sge(qx, mr->lkey, (uintptr_t)buf, 8);
		check(ibv_wr_complete(qx) == 0, "ibv_wr_complete after the failed and aborted ones");
		check(next_ex(cqx) == 0 && cqx->wr_id == 9 && cqx->status == IBV_WC_SUCCESS,
		      "nothing of the failed or aborted batches was posted");
		ibv_end_poll(cqx);
		write_info(argv[4], "client-done", &me);
	}
	check(ibv_destroy_qp(qp) == 0 && ibv_destroy_cq(cq) == 0, "ibv_destroy_qp, ibv_destroy_cq");
	ibv_dereg_mr(mr);
	ibv_dealloc_pd(pd);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
	free(buf);
	return summary();
}
