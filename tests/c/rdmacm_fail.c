/* Failure paths of the RDMA CM for tests/rdmacm_failures.rs: a listener that rejects
 * with private data, a listener that accepts and then dies (the test kills it), and a
 * client that prints every event it gets (name, status, private data).
 *
 *   rdmacm_fail reject      ADDR PORT   listen; rdma_reject each request with "go away"
 *   rdmacm_fail established ADDR PORT   listen; accept one request; wait to be killed
 *   rdmacm_fail client      ADDR PORT   connect; after ESTABLISHED wait for a line on
 *                                       stdin, rdma_disconnect, wait for DISCONNECTED
 *
 * Every line is "ROLE: ..." and flushed at once (the test reads them while we run).
 * Exit 0 when the role ran to its end, 1 on an unexpected failure. */
#include <arpa/inet.h>
#include <stdarg.h>
#include <netinet/in.h>
#include <rdma/rdma_cma.h>
#include <sys/socket.h>
#include "common.h"

static const char *role = "?";

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	va_list ap;
	printf("%s: ", role);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	fflush(stdout);
}

static int die(const char *what)
{
	say("%s failed: %s", what, strerror(errno));
	return 1;
}

/* The next event on ch, printed; its type, status and id in *out. */
static int next(struct rdma_event_channel *ch, struct rdma_cm_event *out)
{
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(ch, &e))
		return die("rdma_get_cm_event");
	*out = *e;
	if (e->event == RDMA_CM_EVENT_REJECTED) {
		char pd[64] = { 0 };
		size_t n = e->param.conn.private_data_len;
		if (e->param.conn.private_data && n)
			memcpy(pd, e->param.conn.private_data, n < sizeof(pd) - 1 ? n : sizeof(pd) - 1);
		say("%s status %d private_data_len %zu private '%s'", rdma_event_str(e->event),
		    e->status, n, pd);
	} else {
		say("%s status %d", rdma_event_str(e->event), e->status);
	}
	rdma_ack_cm_event(e);
	return 0;
}

static int qp_for(struct rdma_cm_id *id)
{
	struct ibv_pd *pd = ibv_alloc_pd(id->verbs);
	if (!pd)
		return die("ibv_alloc_pd");
	struct ibv_cq *cq = ibv_create_cq(id->verbs, 8, NULL, NULL, 0);
	if (!cq)
		return die("ibv_create_cq");
	struct ibv_qp_init_attr a = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	if (rdma_create_qp(id, pd, &a))
		return die("rdma_create_qp");
	return 0;
}

static int server(struct rdma_event_channel *ch, struct sockaddr_in *sin, int reject)
{
	struct rdma_cm_id *l;
	struct rdma_cm_event e;
	if (rdma_create_id(ch, &l, NULL, RDMA_PS_TCP))
		return die("rdma_create_id");
	if (rdma_bind_addr(l, (struct sockaddr *)sin))
		return die("rdma_bind_addr");
	if (rdma_listen(l, 4))
		return die("rdma_listen");
	say("listening pid %d", (int)getpid());
	for (;;) {
		if (next(ch, &e))
			return 1;
		if (e.event == RDMA_CM_EVENT_CONNECT_REQUEST && reject) {
			if (rdma_reject(e.id, "go away", 8))
				return die("rdma_reject");
			say("rejected");
			rdma_destroy_id(e.id);
			rdma_destroy_id(l);
			return 0;
		}
		if (e.event == RDMA_CM_EVENT_CONNECT_REQUEST) {
			struct rdma_conn_param p = { .responder_resources = 1, .initiator_depth = 1 };
			if (qp_for(e.id))
				return 1;
			if (rdma_accept(e.id, &p))
				return die("rdma_accept");
		}
		if (e.event == RDMA_CM_EVENT_ESTABLISHED) {
			/* The test kills us here (kill -9): nothing answers the peer's DREQ. */
			for (;;)
				pause();
		}
	}
}

static int client(struct rdma_event_channel *ch, struct sockaddr_in *sin)
{
	struct rdma_cm_id *id;
	struct rdma_cm_event e;
	char line[16];
	if (rdma_create_id(ch, &id, NULL, RDMA_PS_TCP))
		return die("rdma_create_id");
	if (rdma_resolve_addr(id, NULL, (struct sockaddr *)sin, 2000))
		return die("rdma_resolve_addr");
	if (next(ch, &e) || e.event != RDMA_CM_EVENT_ADDR_RESOLVED)
		return 1;
	if (rdma_resolve_route(id, 2000))
		return die("rdma_resolve_route");
	if (next(ch, &e) || e.event != RDMA_CM_EVENT_ROUTE_RESOLVED)
		return 1;
	if (qp_for(id))
		return 1;
	struct rdma_conn_param p = { .responder_resources = 1, .initiator_depth = 1,
				     .retry_count = 7, .rnr_retry_count = 7 };
	if (rdma_connect(id, &p))
		return die("rdma_connect");
	if (next(ch, &e))
		return 1;
	if (e.event != RDMA_CM_EVENT_ESTABLISHED)
		return 0; /* REJECTED, UNREACHABLE ...: printed, the test judges */
	if (!fgets(line, sizeof(line), stdin))
		say("stdin closed");
	if (rdma_disconnect(id))
		return die("rdma_disconnect");
	say("disconnecting");
	do {
		if (next(ch, &e))
			return 1;
	} while (e.event != RDMA_CM_EVENT_DISCONNECTED);
	return 0;
}

int main(int argc, char **argv)
{
	struct sockaddr_in sin = { .sin_family = AF_INET };
	if (argc != 4 || inet_pton(AF_INET, argv[2], &sin.sin_addr) != 1) {
		fprintf(stderr, "usage: %s reject|established|client ADDR PORT\n", argv[0]);
		return 2;
	}
	role = argv[1];
	sin.sin_port = htons((unsigned short)atoi(argv[3]));
	struct rdma_event_channel *ch = rdma_create_event_channel();
	if (!ch)
		return die("rdma_create_event_channel");
	if (!strcmp(role, "reject"))
		return server(ch, &sin, 1);
	if (!strcmp(role, "established"))
		return server(ch, &sin, 0);
	if (!strcmp(role, "client"))
		return client(ch, &sin);
	fprintf(stderr, "unknown role %s\n", role);
	return 2;
}
