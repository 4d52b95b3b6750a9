/* One device opened several times in one process, as UCX (a context per memory domain
 * and interface), MPI stacks and test suites do: each ibv_open_device is a context of
 * its own (rdma-core: its own file on the uverbs device), with its own PDs, CQs, QPs,
 * completion channels and async events, on one device (src/abi/opened.rs).
 * One end of a veth pair, the QPs of different contexts joined through the device's own
 * loopback (src/driver/loopback.rs):
 *  - contexts A and B: a SEND each way between a QP of A and a QP of B; B's QP waits in
 *    RTR for the first packet, and IBV_EVENT_COMM_EST comes on B's async fd with B's
 *    QP as the element, none on A's (uverbs queues an object's event on its own
 *    context's file);
 *  - objects do not cross contexts: a QP from A's PD with B's CQ, a CQ of A on B's
 *    completion channel: EINVAL, as the kernel's per-file handle lookup fails;
 *  - context C opened beside them, its QP talking to a second QP of A; C closed with
 *    every object alive: the close succeeds, A and B keep working (another SEND), A's
 *    QP that talked to C's gets IBV_WC_RETRY_EXC_ERR (C's QP is gone, as the kernel
 *    destroys a closed context's objects); C's completion channel stays, readable, and
 *    ibv_get_cq_event on it fails EIO (no hang), then it is destroyed;
 *  - C opened again, an exchange with A; then B, A and C closed with objects alive (the
 *    last close lets the device go) and the device opened once more: it works (the
 *    interface's XDP program and AF_XDP socket were released at the last close).
 * argv: DEVICE GID_INDEX. One line per check, then "N passed, M failed". */
#include "common.h"

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char buf[256];
};

static int gid_index;
static union ibv_gid gid;

/* A PD, a CQ (on `ch` when given) and an MR over s->buf in s->ctx; 0 when made. */
static int resources(struct side *s, struct ibv_comp_channel *ch)
{
	s->pd = ibv_alloc_pd(s->ctx);
	s->cq = ibv_create_cq(s->ctx, 32, NULL, ch, 0);
	s->mr = s->pd ? ibv_reg_mr(s->pd, s->buf, sizeof s->buf,
				   IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE)
		      : NULL;
	return s->pd && s->cq && s->mr ? 0 : -1;
}

static struct ibv_qp *rc_qp(struct side *s)
{
	struct ibv_qp_init_attr init;

	memset(&init, 0, sizeof init);
	init.send_cq = s->cq;
	init.recv_cq = s->cq;
	init.qp_type = IBV_QPT_RC;
	init.cap.max_send_wr = 8;
	init.cap.max_recv_wr = 8;
	init.cap.max_send_sge = 1;
	init.cap.max_recv_sge = 1;
	return ibv_create_qp(s->pd, &init);
}

/* RTS, with the retry count given (timeout 14, 67 ms; rnr_retry 7, for ever). */
static int to_rts_retry(struct ibv_qp *qp, int retry_cnt)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = retry_cnt;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_SQ_PSN | IBV_QP_TIMEOUT |
					  IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY |
					  IBV_QP_MAX_QP_RD_ATOMIC);
}

static int to_rts(struct ibv_qp *qp)
{
	return to_rts_retry(qp, 7);
}

/* INIT, then RTR towards `dest` on this device's own GID; RTS too when `rts`. */
static int connect_to(struct ibv_qp *qp, uint32_t dest, int rts)
{
	struct ibv_qp_attr a;

	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
				   IBV_QP_ACCESS_FLAGS))
		return -1;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest;
	a.max_dest_rd_atomic = 1;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = gid;
	a.ah_attr.grh.sgid_index = gid_index;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU |
				   IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				   IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -1;
	return rts ? to_rts(qp) : 0;
}

static int post_recv(struct side *s, struct ibv_qp *qp, uint64_t id)
{
	struct ibv_sge sge = {(uintptr_t)(s->buf + 128), 64, s->mr->lkey};
	struct ibv_recv_wr wr, *bad;

	memset(&wr, 0, sizeof wr);
	wr.wr_id = id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	return ibv_post_recv(qp, &wr, &bad);
}

static int post_send(struct side *s, struct ibv_qp *qp, uint64_t id, char fill)
{
	struct ibv_sge sge = {(uintptr_t)s->buf, 64, s->mr->lkey};
	struct ibv_send_wr wr, *bad;

	memset(s->buf, fill, 64);
	memset(&wr, 0, sizeof wr);
	wr.wr_id = id;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	return ibv_post_send(qp, &wr, &bad);
}

/* A SEND of 64 bytes of `fill` from `qs` (of `s`) to `qr` (of `r`, a receive posted
 * here): 0 when both complete successfully and the bytes arrived. */
static int send_between(struct side *s, struct ibv_qp *qs, struct side *r, struct ibv_qp *qr,
			char fill)
{
	struct ibv_wc wc;
	char want[64];

	memset(r->buf + 128, 0, 64);
	if (post_recv(r, qr, 2) || post_send(s, qs, 1, fill))
		return -1;
	if (s->cq == r->cq) {
		/* One CQ: the two completions in either order. */
		int seen = 0, i;

		for (i = 0; i < 2; i++) {
			if (poll_one(s->cq, &wc) != 1 || wc.status != IBV_WC_SUCCESS)
				return -1;
			seen |= (int)wc.wr_id;
		}
		return seen == 3 && memcmp(r->buf + 128, s->buf, 64) == 0 ? 0 : -1;
	}
	if (poll_one(s->cq, &wc) != 1 || wc.status != IBV_WC_SUCCESS || wc.wr_id != 1)
		return -1;
	if (poll_one(r->cq, &wc) != 1 || wc.status != IBV_WC_SUCCESS || wc.wr_id != 2 ||
	    wc.byte_len != 64 || wc.qp_num != qr->qp_num)
		return -1;
	memset(want, fill, sizeof want);
	return memcmp(r->buf + 128, want, sizeof want) == 0 ? 0 : -1;
}

/* The async fd of ctx has no event within `ms`. */
static int no_async(struct ibv_context *ctx, int ms)
{
	struct pollfd pfd = {ctx->async_fd, POLLIN, 0};

	return poll(&pfd, 1, ms) == 0;
}

/* Open, one context, a loopback SEND between two of its QPs: the device works. */
static void fresh_open_works(struct ibv_device **list, int n, const char *name)
{
	struct side s;
	struct ibv_qp *q0, *q1;
	int ok;

	memset(&s, 0, sizeof s);
	s.ctx = open_named(list, n, name);
	check(s.ctx != NULL, "the device opens again after its last context closed");
	if (!s.ctx)
		return;
	ok = resources(&s, NULL) == 0;
	q0 = ok ? rc_qp(&s) : NULL;
	q1 = q0 ? rc_qp(&s) : NULL;
	ok = q0 && q1 && connect_to(q0, q1->qp_num, 1) == 0 && connect_to(q1, q0->qp_num, 1) == 0;
	check(ok && send_between(&s, q0, &s, q1, 'f') == 0, "and a SEND through it completes");
	check(ibv_close_device(s.ctx) == 0, "ibv_close_device");
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct side a, b, c;
	struct ibv_qp *qa, *qb, *qa2, *qc, *bad;
	struct ibv_qp_init_attr init;
	struct ibv_comp_channel *chb, *chc;
	struct ibv_async_event ev;
	struct ibv_wc wc;
	struct ibv_cq *evcq;
	void *evctx;
	int n, ok;

	if (argc != 3) {
		fprintf(stderr, "usage: %s DEVICE GID_INDEX\n", argv[0]);
		return 2;
	}
	gid_index = atoi(argv[2]);
	list = ibv_get_device_list(&n);
	memset(&a, 0, sizeof a);
	memset(&b, 0, sizeof b);
	memset(&c, 0, sizeof c);

	a.ctx = open_named(list, n, argv[1]);
	check(a.ctx != NULL, "ibv_open_device: context A");
	b.ctx = open_named(list, n, argv[1]);
	check(b.ctx != NULL, "ibv_open_device of the same device again: context B");
	if (!a.ctx || !b.ctx)
		return summary();
	check(a.ctx != b.ctx && a.ctx->async_fd != b.ctx->async_fd,
	      "A and B are distinct contexts with distinct async fds");
	check(ibv_query_gid(a.ctx, 1, gid_index, &gid) == 0, "ibv_query_gid on A");
	chb = ibv_create_comp_channel(b.ctx);
	ok = resources(&a, NULL) == 0 && chb && resources(&b, NULL) == 0;
	check(ok, "a PD, a CQ and an MR in each context, a channel in B");
	if (!ok)
		return summary();

	/* Objects stay in their context. */
	memset(&init, 0, sizeof init);
	init.send_cq = b.cq;
	init.recv_cq = b.cq;
	init.qp_type = IBV_QPT_RC;
	init.cap.max_send_wr = 1;
	init.cap.max_recv_wr = 1;
	init.cap.max_send_sge = 1;
	init.cap.max_recv_sge = 1;
	errno = 0;
	bad = ibv_create_qp(a.pd, &init);
	check(!bad && errno == EINVAL, "a QP from A's PD with B's CQ: EINVAL");
	errno = 0;
	evcq = ibv_create_cq(a.ctx, 4, NULL, chb, 0);
	check(!evcq && errno == EINVAL, "a CQ of A on B's completion channel: EINVAL");

	/* A QP of A and a QP of B, B's left in RTR until A's first packet. */
	qa = rc_qp(&a);
	qb = rc_qp(&b);
	ok = qa && qb && connect_to(qa, qb->qp_num, 1) == 0 && connect_to(qb, qa->qp_num, 0) == 0;
	check(ok, "a QP in A (RTS) and a QP in B (RTR) joined");
	if (!ok)
		return summary();
	check(send_between(&a, qa, &b, qb, 'a') == 0, "SEND from A's QP to B's QP");
	ok = wait_async(b.ctx, 5000, &ev) == 0;
	check(ok && ev.event_type == IBV_EVENT_COMM_EST && ev.element.qp == qb,
	      "IBV_EVENT_COMM_EST on B's async fd, element B's QP");
	if (ok)
		ibv_ack_async_event(&ev);
	check(no_async(a.ctx, 200), "no event on A's async fd");
	check(to_rts(qb) == 0, "B's QP to RTS");
	check(send_between(&b, qb, &a, qa, 'b') == 0, "SEND from B's QP to A's QP");

	/* C beside A and B, talking to a second QP of A; then closed with all alive. */
	c.ctx = open_named(list, n, argv[1]);
	check(c.ctx != NULL, "a third context, C");
	if (!c.ctx)
		return summary();
	chc = ibv_create_comp_channel(c.ctx);
	ok = chc && resources(&c, chc) == 0;
	qa2 = ok ? rc_qp(&a) : NULL;
	qc = ok ? rc_qp(&c) : NULL;
	ok = qa2 && qc && connect_to(qa2, qc->qp_num, 0) == 0 && to_rts_retry(qa2, 1) == 0 &&
	     connect_to(qc, qa2->qp_num, 1) == 0;
	check(ok, "C's QP and a second QP of A joined");
	if (!ok)
		return summary();
	check(send_between(&c, qc, &a, qa2, 'c') == 0, "SEND from C's QP to A's second QP");
	check(ibv_req_notify_cq(c.cq, 0) == 0, "C's CQ armed on C's channel");
	check(post_recv(&c, qc, 9) == 0, "a receive left posted on C's QP");
	check(ibv_close_device(c.ctx) == 0, "ibv_close_device of C with every object alive");
	check(send_between(&a, qa, &b, qb, 'd') == 0, "A and B still exchange after C closed");
	check(send_between(&b, qb, &a, qa, 'e') == 0, "and back");
	ok = post_send(&a, qa2, 7, 'x') == 0 && poll_one(a.cq, &wc) == 1;
	check(ok && wc.wr_id == 7 && wc.status == IBV_WC_RETRY_EXC_ERR,
	      "a SEND to C's QP, destroyed by the close: IBV_WC_RETRY_EXC_ERR");
	{
		struct pollfd pfd = {chc->fd, POLLIN, 0};
		int r = poll(&pfd, 1, 2000);

		check(r == 1, "C's completion channel is readable after the close");
		errno = 0;
		ok = r == 1 && ibv_get_cq_event(chc, &evcq, &evctx) == -1 && errno == EIO;
		check(ok, "ibv_get_cq_event on C's channel: -1, errno EIO (no hang)");
		check(ibv_destroy_comp_channel(chc) == 0,
		      "ibv_destroy_comp_channel of C's channel after the close");
	}

	/* C again. */
	memset(&c, 0, sizeof c);
	c.ctx = open_named(list, n, argv[1]);
	check(c.ctx != NULL, "C opened again while A and B are open");
	if (!c.ctx)
		return summary();
	ok = resources(&c, NULL) == 0;
	qc = ok ? rc_qp(&c) : NULL;
	qa2 = qc ? rc_qp(&a) : NULL;
	ok = qa2 && qc && connect_to(qa2, qc->qp_num, 1) == 0 &&
	     connect_to(qc, qa2->qp_num, 1) == 0;
	check(ok && send_between(&a, qa2, &c, qc, 'g') == 0,
	      "SEND from A to the reopened C");

	/* Every context closed with its objects alive, the last close lets the device go. */
	check(ibv_close_device(b.ctx) == 0, "ibv_close_device of B with its objects alive");
	check(send_between(&c, qc, &a, qa2, 'h') == 0, "A and C exchange after B closed");
	check(ibv_close_device(a.ctx) == 0, "ibv_close_device of A with its objects alive");
	check(ibv_close_device(c.ctx) == 0, "ibv_close_device of C, the last context");
	fresh_open_works(list, n, argv[1]);

	ibv_free_device_list(list);
	return summary();
}
