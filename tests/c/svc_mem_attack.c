/* The attacker of tests/service_sec_mem.rs, run (as nobody) through `xrnic exec` with the
 * device service up: it opens device argv[1] (its connection to the service is this
 * process's) and makes a PD, a CQ and two RC QPs, then forks. This process exec's
 * argv[2] (the victim: a set-uid program, or an ordinary one) with its stdin and stdout
 * on pipes to the child. The child, still holding the connection, connects the two QPs
 * to each other (loopback), registers an MR at the victim's secret page and posts, from
 * one QP to the other, an RDMA WRITE of the page's first 64 bytes to its offset 2048 and
 * an RDMA READ of them into its offset 1024: on a service that copies "the memory of
 * the pid that connected" with its own rights, both move root's bytes. One line per
 * step on stdout:
 *   "attack: reg refused errno=N" | "attack: reg ok"
 *   "attack: write status=S", "attack: read status=S" (S: the completion's, -1: none)
 *   "attack: done"
 * then one line to the victim, which reports on stderr whether its page changed
 * (tests/c/svc_mem_victim.c). The fork is a raw clone(2) with SIGCHLD, as a hostile
 * program may make it: no pthread_atfork handler runs, so the library in the child does
 * not know it is a child and still uses the parent's connection (a fork(3) child's
 * library refuses inherited objects, docs/verbs-abi.md "fork"; the service must hold
 * either way). */
#include "common.h"

#include <signal.h>
#include <sys/syscall.h>

#define PAGE 4096

static struct ibv_qp *rc_qp(struct ibv_pd *pd, struct ibv_cq *cq)
{
	struct ibv_qp_init_attr a;

	memset(&a, 0, sizeof a);
	a.send_cq = cq;
	a.recv_cq = cq;
	a.qp_type = IBV_QPT_RC;
	a.cap.max_send_wr = 4;
	a.cap.max_recv_wr = 4;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	return ibv_create_qp(pd, &a);
}

/* One RDMA op on `qp`: `len` bytes at `local` of `mr` and at `raddr` of `rkey`; the
 * completion's status, or -1 when posting failed or none came. */
static int rdma(struct ibv_qp *qp, struct ibv_cq *cq, enum ibv_wr_opcode op,
		struct ibv_mr *mr, uint64_t local, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = {local, 64, mr->lkey};
	struct ibv_send_wr wr, *bad;
	struct ibv_wc wc;

	memset(&wr, 0, sizeof wr);
	wr.wr_id = 1;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.opcode = op;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (ibv_post_send(qp, &wr, &bad))
		return -1;
	if (poll_one(cq, &wc) != 1)
		return -1;
	return (int)wc.status;
}

static int child(struct ibv_context *ctx, struct ibv_pd *pd, struct ibv_cq *cq,
		 struct ibv_qp *qa, struct ibv_qp *qb, FILE *from_victim, int to_victim)
{
	union ibv_gid gid;
	struct ibv_qp_attr ra;
	struct ibv_mr *mv;
	unsigned long long v = 0;
	char line[64];

	if (!fgets(line, sizeof line, from_victim) || sscanf(line, "%llx", &v) != 1) {
		printf("attack: no address from the victim\n");
		return 1;
	}
	if (ibv_query_gid(ctx, 1, 0, &gid) || connect_qp(qa, 0, qb->qp_num, &gid, 0) ||
	    connect_qp(qb, 0, qa->qp_num, &gid, 0)) {
		printf("attack: setup failed: connecting (errno %d)\n", errno);
		return 1;
	}
	/* common.h's connect_qp grants remote writes only: remote reads too. */
	memset(&ra, 0, sizeof ra);
	ra.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
			     IBV_ACCESS_REMOTE_READ;
	if (ibv_modify_qp(qa, &ra, IBV_QP_ACCESS_FLAGS) ||
	    ibv_modify_qp(qb, &ra, IBV_QP_ACCESS_FLAGS)) {
		printf("attack: setup failed: access flags (errno %d)\n", errno);
		return 1;
	}
	mv = ibv_reg_mr(pd, (void *)(uintptr_t)v, PAGE,
			IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ |
				IBV_ACCESS_REMOTE_WRITE);
	if (!mv) {
		printf("attack: reg refused errno=%d\n", errno);
	} else {
		printf("attack: reg ok\n");
		fflush(stdout);
		printf("attack: write status=%d\n",
		       rdma(qa, cq, IBV_WR_RDMA_WRITE, mv, v, v + 2048, mv->rkey));
		fflush(stdout);
		printf("attack: read status=%d\n",
		       rdma(qa, cq, IBV_WR_RDMA_READ, mv, v + 1024, v, mv->rkey));
	}
	printf("attack: done\n");
	fflush(stdout);
	if (write(to_victim, "done\n", 5) != 5)
		return 1;
	return 0;
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_qp *qa, *qb;
	int n, out[2], in[2];
	pid_t pid;

	if (argc != 3) {
		fprintf(stderr, "usage: %s DEVICE VICTIM\n", argv[0]);
		return 2;
	}
	list = ibv_get_device_list(&n);
	ctx = open_named(list, n, argv[1]);
	pd = ctx ? ibv_alloc_pd(ctx) : NULL;
	cq = ctx ? ibv_create_cq(ctx, 8, NULL, NULL, 0) : NULL;
	qa = pd && cq ? rc_qp(pd, cq) : NULL;
	qb = pd && cq ? rc_qp(pd, cq) : NULL;
	if (!qa || !qb || pipe(out) || pipe(in)) {
		printf("attack: setup failed (errno %d)\n", errno);
		return 1;
	}
	fflush(stdout);
	pid = (pid_t)syscall(SYS_clone, SIGCHLD, 0, NULL, NULL, 0);
	if (pid < 0)
		return 1;
	if (pid == 0) {
		FILE *f;

		close(out[1]);
		close(in[0]);
		f = fdopen(out[0], "r");
		return f ? child(ctx, pd, cq, qa, qb, f, in[1]) : 1;
	}
	/* The process that connected becomes the victim. */
	if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0)
		return 1;
	close(in[1]);
	close(out[0]);
	execl(argv[2], argv[2], (char *)NULL);
	return 127;
}
