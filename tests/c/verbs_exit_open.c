/* A program that leaves its objects behind, run with XRNIC_FINAL_STAT_DIR: the device's
 * last stat snapshot must still be written. MODE "exit": it returns from main with the
 * device open (no ibv_close_device, nothing destroyed; the library's exit handler writes
 * it, src/abi/device.rs `write_final_stats_at_exit`). MODE "close": it closes the device
 * with its QPs, CQ, MR and PD never destroyed (perftest 4.5's ib_send_bw client leaves
 * its receive CQ so; ibv_close_device writes it). One device, two RC QPs joined through
 * the device's own loopback (src/driver/loopback.rs), one SEND from the first to the
 * second. It prints "pid P" and "qpn A B" for tests/verbs_abi_c.rs to find the file and
 * the QPs in it. MODE "reopen": as "close", then the device is opened again and the same
 * exchange runs on new objects, and closed so, twice: a close frees what the program
 * left behind (the kernel's uverbs destroys a context's objects when its file closes,
 * rdma-core's ibv_close_device), the device's interface is free for the next open, and
 * the snapshot is the last open's. argv: DEVICE GID_INDEX MODE. */
#include "common.h"

/* One exchange on a fresh PD, CQ, MR and two QPs of ctx, none destroyed; 0 when it
 * passed. The QP numbers go to qpn. */
static int exchange(struct ibv_context *ctx, int gid_index, uint32_t *qpn)
{
	static char buf[128];
	struct ibv_pd *pd;
	struct ibv_cq *cq;
	struct ibv_mr *mr;
	struct ibv_qp *qp[2];
	struct ibv_qp_init_attr init;
	union ibv_gid gid;
	struct ibv_sge sge;
	struct ibv_send_wr swr, *bad_s;
	struct ibv_recv_wr rwr, *bad_r;
	struct ibv_wc wc;
	int i, ok;

	memset(buf, 0, sizeof buf);
	pd = ibv_alloc_pd(ctx);
	cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	mr = pd ? ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE) : NULL;
	check(pd && cq && mr, "a PD, a CQ and an MR");
	if (!(pd && cq && mr))
		return -1;
	memset(&init, 0, sizeof init);
	init.send_cq = cq;
	init.recv_cq = cq;
	init.qp_type = IBV_QPT_RC;
	init.cap.max_send_wr = 4;
	init.cap.max_recv_wr = 4;
	init.cap.max_send_sge = 1;
	init.cap.max_recv_sge = 1;
	qp[0] = ibv_create_qp(pd, &init);
	qp[1] = ibv_create_qp(pd, &init);
	ok = qp[0] && qp[1] && ibv_query_gid(ctx, 1, gid_index, &gid) == 0;
	check(ok, "two RC QPs and the GID");
	if (!ok)
		return -1;
	ok = connect_qp(qp[0], 0, qp[1]->qp_num, &gid, gid_index) == 0 &&
	     connect_qp(qp[1], 0, qp[0]->qp_num, &gid, gid_index) == 0;
	check(ok, "the QPs connected to each other");
	if (!ok)
		return -1;
	memset(buf, 'x', 64);
	sge.addr = (uintptr_t)(buf + 64);
	sge.length = 64;
	sge.lkey = mr->lkey;
	memset(&rwr, 0, sizeof rwr);
	rwr.wr_id = 2;
	rwr.sg_list = &sge;
	rwr.num_sge = 1;
	ok = ibv_post_recv(qp[1], &rwr, &bad_r) == 0;
	sge.addr = (uintptr_t)buf;
	memset(&swr, 0, sizeof swr);
	swr.wr_id = 1;
	swr.sg_list = &sge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_SIGNALED;
	ok = ok && ibv_post_send(qp[0], &swr, &bad_s) == 0;
	check(ok, "a receive and a SEND posted");
	if (!ok)
		return -1;
	for (i = 0; i < 2 && poll_one(cq, &wc) == 1 && wc.status == IBV_WC_SUCCESS; i++)
		;
	check(i == 2 && memcmp(buf, buf + 64, 64) == 0, "the SEND and its receive complete");
	qpn[0] = qp[0]->qp_num;
	qpn[1] = qp[1]->qp_num;
	return i == 2 ? 0 : -1;
}

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	uint32_t qpn[2];
	int n, gid_index, round, rounds = 1;

	if (argc != 4 || (strcmp(argv[3], "exit") != 0 && strcmp(argv[3], "close") != 0 &&
			  strcmp(argv[3], "reopen") != 0)) {
		fprintf(stderr, "usage: %s DEVICE GID_INDEX exit|close|reopen\n", argv[0]);
		return 2;
	}
	if (strcmp(argv[3], "reopen") == 0)
		rounds = 3;
	gid_index = atoi(argv[2]);
	printf("pid %d\n", (int)getpid());
	list = ibv_get_device_list(&n);
	for (round = 0; round < rounds; round++) {
		ctx = open_named(list, n, argv[1]);
		check(ctx != NULL, "ibv_open_device");
		if (!ctx || exchange(ctx, gid_index, qpn) != 0)
			return summary();
		/* Nothing destroyed; closed in "close" and "reopen" mode only. */
		if (strcmp(argv[3], "exit") != 0)
			check(ibv_close_device(ctx) == 0, "ibv_close_device with every object alive");
	}
	printf("qpn %u %u\n", qpn[0], qpn[1]);
	ibv_free_device_list(list);
	return summary();
}
