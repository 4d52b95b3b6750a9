/* rdma_cm across fork(), as rdma-core's rdma_cm tests run it: the parent uses the CM
 * first (an event channel and an id bound to ADDR: librdmacm's CM port of the device is
 * open, with its context), then forks. The child listens on ADDR:PORT, accepts one
 * connection, receives a SEND and waits for the disconnect; the parent, once the child
 * listens (a pipe), connects to it, sends 64 bytes of 'f' and disconnects. Both through
 * one device: the child's CM and QP must be its own, not its parent's (docs/verbs-abi.md
 * "fork").
 *   rdmacm_fork ADDR PORT
 * One line per check, "child: " before the child's; "N passed, M failed" of each; the
 * exit status is the parent's, 1 also when the child failed. */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include "common.h"

static const char *who = "";

static void ck(int ok, const char *what)
{
	char line[256];

	snprintf(line, sizeof line, "%s%s", who, what);
	check(ok, line);
}

/* The next event on ch if it is `want` (acknowledged); its id in *id. */
static int expect(struct rdma_event_channel *ch, enum rdma_cm_event_type want,
		  struct rdma_cm_id **id)
{
	struct rdma_cm_event *ev;
	int ok;

	if (rdma_get_cm_event(ch, &ev))
		return -1;
	ok = ev->event == want && ev->status == 0;
	if (!ok)
		fprintf(stderr, "%sgot %s (status %d), wanted %s\n", who, rdma_event_str(ev->event),
			ev->status, rdma_event_str(want));
	if (id)
		*id = ev->id;
	rdma_ack_cm_event(ev);
	return ok ? 0 : -1;
}

struct conn {
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	char buf[64];
};

/* A PD, a CQ, an MR and an RC QP on `id`'s device. */
static int make_qp(struct rdma_cm_id *id, struct conn *c)
{
	struct ibv_qp_init_attr init;

	c->pd = ibv_alloc_pd(id->verbs);
	c->cq = ibv_create_cq(id->verbs, 8, NULL, NULL, 0);
	c->mr = c->pd ? ibv_reg_mr(c->pd, c->buf, sizeof c->buf, IBV_ACCESS_LOCAL_WRITE) : NULL;
	if (!c->pd || !c->cq || !c->mr)
		return -1;
	memset(&init, 0, sizeof init);
	init.send_cq = c->cq;
	init.recv_cq = c->cq;
	init.qp_type = IBV_QPT_RC;
	init.cap.max_send_wr = 4;
	init.cap.max_recv_wr = 4;
	init.cap.max_send_sge = 1;
	init.cap.max_recv_sge = 1;
	return rdma_create_qp(id, c->pd, &init);
}

static int child(struct sockaddr_in *addr, int ready)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *listen_id, *id;
	struct ibv_sge sge;
	struct ibv_recv_wr wr, *bad;
	struct ibv_wc wc;
	struct conn c;
	char want[64];
	int ok;

	who = "child: ";
	passed = failed = 0;
	memset(&c, 0, sizeof c);
	ch = rdma_create_event_channel();
	ok = ch && rdma_create_id(ch, &listen_id, NULL, RDMA_PS_TCP) == 0 &&
	     rdma_bind_addr(listen_id, (struct sockaddr *)addr) == 0 && rdma_listen(listen_id, 1) == 0;
	ck(ok, "its own id listens");
	if (write(ready, "l", 1) != 1 || !ok)
		return summary();
	ok = expect(ch, RDMA_CM_EVENT_CONNECT_REQUEST, &id) == 0;
	ck(ok, "RDMA_CM_EVENT_CONNECT_REQUEST");
	if (!ok)
		return summary();
	ok = make_qp(id, &c) == 0;
	sge.addr = (uintptr_t)c.buf;
	sge.length = sizeof c.buf;
	sge.lkey = ok ? c.mr->lkey : 0;
	memset(&wr, 0, sizeof wr);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	ok = ok && ibv_post_recv(id->qp, &wr, &bad) == 0 && rdma_accept(id, NULL) == 0;
	ck(ok, "a QP of its own, a receive posted, rdma_accept");
	ok = ok && expect(ch, RDMA_CM_EVENT_ESTABLISHED, NULL) == 0;
	ck(ok, "RDMA_CM_EVENT_ESTABLISHED");
	memset(want, 'f', sizeof want);
	ok = ok && poll_one(c.cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS &&
	     memcmp(c.buf, want, sizeof want) == 0;
	ck(ok, "the parent's SEND arrived");
	ck(ok && expect(ch, RDMA_CM_EVENT_DISCONNECTED, NULL) == 0, "RDMA_CM_EVENT_DISCONNECTED");
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	rdma_destroy_id(listen_id);
	rdma_destroy_event_channel(ch);
	return summary();
}

int main(int argc, char **argv)
{
	struct rdma_event_channel *ch;
	struct rdma_cm_id *first, *id;
	struct rdma_conn_param param;
	struct sockaddr_in addr, any;
	struct ibv_sge sge;
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc;
	struct conn c;
	int p[2], ok, status;
	char l;
	pid_t pid;

	if (argc != 3) {
		fprintf(stderr, "usage: %s ADDR PORT\n", argv[0]);
		return 2;
	}
	memset(&addr, 0, sizeof addr);
	addr.sin_family = AF_INET;
	addr.sin_port = htons(atoi(argv[2]));
	if (inet_pton(AF_INET, argv[1], &addr.sin_addr) != 1)
		return 2;
	any = addr;
	any.sin_port = 0;
	memset(&c, 0, sizeof c);
	/* The CM in use before the fork: its port and context are open in the parent. */
	ch = rdma_create_event_channel();
	ok = ch && rdma_create_id(ch, &first, NULL, RDMA_PS_TCP) == 0 &&
	     rdma_bind_addr(first, (struct sockaddr *)&any) == 0 && first->verbs;
	check(ok, "an id bound to the address before the fork (its device open)");
	if (!ok || pipe(p))
		return summary();
	fflush(stdout);
	pid = fork();
	if (pid == 0) {
		close(p[0]);
		status = child(&addr, p[1]);
		fflush(stdout);
		_exit(status);
	}
	close(p[1]);
	check(pid > 0 && read(p[0], &l, 1) == 1, "the child listens");
	ok = rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0 &&
	     rdma_resolve_addr(id, NULL, (struct sockaddr *)&addr, 2000) == 0 &&
	     expect(ch, RDMA_CM_EVENT_ADDR_RESOLVED, NULL) == 0 && rdma_resolve_route(id, 2000) == 0 &&
	     expect(ch, RDMA_CM_EVENT_ROUTE_RESOLVED, NULL) == 0;
	check(ok, "address and route resolved");
	ok = ok && make_qp(id, &c) == 0;
	memset(&param, 0, sizeof param);
	param.retry_count = 7;
	param.rnr_retry_count = 7;
	ok = ok && rdma_connect(id, &param) == 0 && expect(ch, RDMA_CM_EVENT_ESTABLISHED, NULL) == 0;
	check(ok, "connected to the child: RDMA_CM_EVENT_ESTABLISHED");
	memset(c.buf, 'f', sizeof c.buf);
	sge.addr = (uintptr_t)c.buf;
	sge.length = sizeof c.buf;
	sge.lkey = ok ? c.mr->lkey : 0;
	memset(&wr, 0, sizeof wr);
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = IBV_WR_SEND;
	wr.send_flags = IBV_SEND_SIGNALED;
	ok = ok && ibv_post_send(id->qp, &wr, &bad) == 0 && poll_one(c.cq, &wc) == 1 &&
	     wc.status == IBV_WC_SUCCESS;
	check(ok, "a SEND to the child completed");
	ok = ok && rdma_disconnect(id) == 0 && expect(ch, RDMA_CM_EVENT_DISCONNECTED, NULL) == 0;
	check(ok, "rdma_disconnect: RDMA_CM_EVENT_DISCONNECTED");
	check(waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0,
	      "the child exited 0");
	rdma_destroy_qp(id);
	rdma_destroy_id(id);
	rdma_destroy_id(first);
	rdma_destroy_event_channel(ch);
	return summary();
}
