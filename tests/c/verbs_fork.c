/* fork() with a device open (docs/verbs-abi.md "fork"). The parent opens the device,
 * joins two of its QPs through the device's loopback, registers memory, posts a receive
 * that stays pending, and forks. The child:
 *  - finds every inherited object refused, as objects of a context it does not have open:
 *    ibv_query_device, ibv_alloc_pd, ibv_reg_mr and ibv_create_cq on the inherited
 *    context, ibv_post_send, ibv_post_recv, ibv_poll_cq, ibv_req_notify_cq, ibv_modify_qp,
 *    ibv_destroy_qp, ibv_dereg_mr on its objects: EINVAL (or -1 with errno EINVAL), none
 *    of it reaching the parent's objects;
 *  - closes the inherited context: 0, its own copy only;
 *  - opens the device itself (MODE "service": its own context and its own connection to
 *    the device service; a QP of the child and a QP of the parent joined through the
 *    service's one device exchange a SEND each way; MODE "in-process": the parent's
 *    process holds the interface, and the child's open fails EBUSY).
 * The parent, after the child exited: its pending receive is still pending (the child's
 * poll took nothing), a SEND completes it, and its QPs exchange again.
 * argv: DEVICE GID_INDEX MODE. One line per check ("child: " before the child's), then
 * "N passed, M failed" of each process; the exit status is the parent's. */
#include <sys/wait.h>
#include "common.h"

struct side {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char buf[256];
};

static int gid_index;
static union ibv_gid gid;
static const char *who = "";

static void ck(int ok, const char *what)
{
	char line[256];

	snprintf(line, sizeof line, "%s%s", who, what);
	check(ok, line);
}

static int resources(struct ibv_context *ctx, struct side *s)
{
	s->pd = ibv_alloc_pd(ctx);
	s->cq = ibv_create_cq(ctx, 32, NULL, NULL, 0);
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

static int post_recv(struct side *s, struct ibv_qp *qp, uint64_t id)
{
	struct ibv_sge sge = {(uintptr_t)(s->buf + 128), 64, s->mr->lkey};
	struct ibv_recv_wr wr, *bad;

	memset(s->buf + 128, 0, 64);
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

/* The send completion `id` on s's CQ, then the receive `rid` on r's CQ with 64 bytes of
 * `fill` (a receive posted before): 0 when all is so. */
static int sent_and_received(struct side *s, uint64_t id, struct side *r, uint64_t rid,
			     char fill)
{
	struct ibv_wc wc;
	char want[64];

	if (poll_one(s->cq, &wc) != 1 || wc.status != IBV_WC_SUCCESS || wc.wr_id != id)
		return -1;
	if (poll_one(r->cq, &wc) != 1 || wc.status != IBV_WC_SUCCESS || wc.wr_id != rid ||
	    wc.byte_len != 64)
		return -1;
	memset(want, fill, sizeof want);
	return memcmp(r->buf + 128, want, sizeof want) == 0 ? 0 : -1;
}

/* The send `id` and the receive `rid` (64 bytes of `fill`) both complete on s's one CQ,
 * in either order. */
static int both_done(struct side *s, uint64_t id, uint64_t rid, char fill)
{
	struct ibv_wc wc;
	char want[64];
	int i, seen = 0;

	for (i = 0; i < 2; i++) {
		if (poll_one(s->cq, &wc) != 1 || wc.status != IBV_WC_SUCCESS)
			return -1;
		if (wc.wr_id == id)
			seen |= 1;
		else if (wc.wr_id == rid && wc.byte_len == 64)
			seen |= 2;
	}
	memset(want, fill, sizeof want);
	return seen == 3 && memcmp(s->buf + 128, want, sizeof want) == 0 ? 0 : -1;
}

static int read_full(int fd, void *p, size_t len)
{
	return read(fd, p, len) == (ssize_t)len ? 0 : -1;
}

static int write_full(int fd, const void *p, size_t len)
{
	return write(fd, p, len) == (ssize_t)len ? 0 : -1;
}

/* Everything the child inherited is refused: EINVAL. */
static void inherited_refused(struct ibv_context *ctx, struct side *a, struct ibv_qp *qa)
{
	struct ibv_device_attr attr;
	struct ibv_qp_attr qattr;
	struct ibv_wc wc;
	static char mem[64];

	errno = 0;
	ck(ibv_query_device(ctx, &attr) == EINVAL, "ibv_query_device on the inherited context: EINVAL");
	errno = 0;
	ck(!ibv_alloc_pd(ctx) && errno == EINVAL, "ibv_alloc_pd on the inherited context: EINVAL");
	errno = 0;
	ck(!ibv_create_cq(ctx, 4, NULL, NULL, 0) && errno == EINVAL,
	   "ibv_create_cq on the inherited context: EINVAL");
	errno = 0;
	ck(!ibv_reg_mr(a->pd, mem, sizeof mem, IBV_ACCESS_LOCAL_WRITE) && errno == EINVAL,
	   "ibv_reg_mr on the inherited PD: EINVAL");
	ck(post_send(a, qa, 9, 'x') == EINVAL, "ibv_post_send on the inherited QP: EINVAL");
	ck(post_recv(a, qa, 9) == EINVAL, "ibv_post_recv on the inherited QP: EINVAL");
	errno = 0;
	ck(ibv_poll_cq(a->cq, 1, &wc) < 0 && errno == EINVAL,
	   "ibv_poll_cq on the inherited CQ: -1, errno EINVAL");
	ck(ibv_req_notify_cq(a->cq, 0) == EINVAL, "ibv_req_notify_cq on the inherited CQ: EINVAL");
	memset(&qattr, 0, sizeof qattr);
	qattr.qp_state = IBV_QPS_ERR;
	ck(ibv_modify_qp(qa, &qattr, IBV_QP_STATE) == EINVAL,
	   "ibv_modify_qp of the inherited QP to ERR: EINVAL");
	ck(ibv_destroy_qp(qa) == EINVAL, "ibv_destroy_qp of the inherited QP: EINVAL");
	ck(ibv_dereg_mr(a->mr) == EINVAL, "ibv_dereg_mr of the inherited MR: EINVAL");
	ck(ibv_close_device(ctx) == 0, "ibv_close_device of the inherited context: 0");
}

/* The child: the inherited objects, then a device of its own. `to_parent` carries its
 * QP number, `from_parent` the parent's go. */
static int child(const char *name, int in_process, struct ibv_context *pctx, struct side *a,
		 struct ibv_qp *qa, uint32_t parent_qpn, int to_parent, int from_parent)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct side c;
	struct ibv_qp *qc;
	uint32_t qpn;
	char go;
	int n, ok;

	who = "child: ";
	passed = failed = 0;
	inherited_refused(pctx, a, qa);
	list = ibv_get_device_list(&n);
	errno = 0;
	ctx = open_named(list, n, name);
	if (in_process) {
		ck(!ctx && errno == EBUSY,
		   "ibv_open_device while the parent holds the interface in process: EBUSY");
		qpn = 0;
		write_full(to_parent, &qpn, sizeof qpn);
		return summary();
	}
	ck(ctx != NULL, "ibv_open_device: a context of its own");
	memset(&c, 0, sizeof c);
	ok = ctx && resources(ctx, &c) == 0;
	qc = ok ? rc_qp(&c) : NULL;
	ck(qc != NULL, "a PD, a CQ, an MR and a QP in it");
	qpn = qc ? qc->qp_num : 0;
	if (write_full(to_parent, &qpn, sizeof qpn) || !qc)
		return summary();
	ok = connect_qp(qc, 0, parent_qpn, &gid, gid_index) == 0 && post_recv(&c, qc, 20) == 0;
	ck(ok, "its QP joined to a QP of the parent");
	if (!ok || read_full(from_parent, &go, 1))
		return summary();
	ck(post_send(&c, qc, 21, 'c') == 0, "a SEND to the parent's QP posted");
	/* The send, then the parent's SEND back into the receive posted above. */
	ck(both_done(&c, 21, 20, 'p') == 0,
	   "its SEND completed and the parent's SEND arrived");
	ck(ibv_destroy_qp(qc) == 0 && ibv_close_device(ctx) == 0,
	   "its QP destroyed, its context closed");
	ibv_free_device_list(list);
	return summary();
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct side a, b;
	struct ibv_qp *qa, *qb, *qd;
	int c2p[2], p2c[2], n, ok, status, in_process;
	uint32_t cqpn;
	pid_t pid;

	if (argc != 4) {
		fprintf(stderr, "usage: %s DEVICE GID_INDEX service|in-process\n", argv[0]);
		return 2;
	}
	gid_index = atoi(argv[2]);
	in_process = strcmp(argv[3], "in-process") == 0;
	list = ibv_get_device_list(&n);
	memset(&a, 0, sizeof a);
	memset(&b, 0, sizeof b);
	ctx = open_named(list, n, argv[1]);
	check(ctx != NULL, "ibv_open_device");
	if (!ctx)
		return summary();
	check(ibv_query_gid(ctx, 1, gid_index, &gid) == 0, "ibv_query_gid");
	ok = resources(ctx, &a) == 0 && resources(ctx, &b) == 0;
	qa = ok ? rc_qp(&a) : NULL;
	qb = qa ? rc_qp(&b) : NULL;
	qd = qb ? rc_qp(&b) : NULL;
	ok = qd && connect_qp(qa, 0, qb->qp_num, &gid, gid_index) == 0 &&
	     connect_qp(qb, 0, qa->qp_num, &gid, gid_index) == 0;
	check(ok, "two QPs joined, a third for the child, memory registered");
	if (!ok)
		return summary();
	ok = post_recv(&b, qb, 2) == 0 && post_send(&a, qa, 1, 'a') == 0;
	check(ok && sent_and_received(&a, 1, &b, 2, 'a') == 0, "a SEND between the two QPs");
	/* Pending across the fork: the child's poll of the CQ must not take its completion. */
	check(post_recv(&b, qb, 3) == 0, "a receive posted, pending across the fork");
	if (pipe(c2p) || pipe(p2c))
		return 1;
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		close(c2p[0]);
		close(p2c[1]);
		status = child(argv[1], in_process, ctx, &a, qa, qd->qp_num, c2p[1], p2c[0]);
		fflush(stdout);
		_exit(status);
	}
	check(pid > 0, "fork");
	close(c2p[1]);
	close(p2c[0]);
	if (read_full(c2p[0], &cqpn, sizeof cqpn))
		cqpn = 0;
	if (!in_process) {
		char go = 'g';

		ok = cqpn && connect_qp(qd, 0, cqpn, &gid, gid_index) == 0 &&
		     post_recv(&b, qd, 30) == 0;
		check(ok, "the third QP joined to the child's QP");
		if (ok && write_full(p2c[1], &go, 1) == 0) {
			struct ibv_wc wc;
			char want[64];

			memset(want, 'c', sizeof want);
			ok = poll_one(b.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
			     wc.wr_id == 30 && memcmp(b.buf + 128, want, 64) == 0;
			check(ok, "the child's SEND arrived at the parent's QP");
			ok = ok && post_send(&b, qd, 31, 'p') == 0 && poll_one(b.cq, &wc) == 1 &&
			     wc.status == IBV_WC_SUCCESS && wc.wr_id == 31;
			check(ok, "a SEND back to the child completed");
		}
	}
	check(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "the child exited 0");
	/* The receive posted before the fork is still the parent's, pending. */
	ok = post_send(&a, qa, 4, 'b') == 0 && sent_and_received(&a, 4, &b, 3, 'b') == 0;
	check(ok, "after the child: the receive posted before the fork takes a SEND");
	ok = post_recv(&b, qb, 5) == 0 && post_send(&a, qa, 6, 'd') == 0 &&
	     sent_and_received(&a, 6, &b, 5, 'd') == 0;
	check(ok, "and the parent's QPs exchange again");
	check(ibv_destroy_qp(qd) == 0 && ibv_destroy_qp(qb) == 0 && ibv_destroy_qp(qa) == 0 &&
	      ibv_close_device(ctx) == 0, "the parent's QPs destroyed, its context closed");
	ibv_free_device_list(list);
	return summary();
}
