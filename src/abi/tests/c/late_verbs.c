/* Calls verbs that rdma-core added late (IBVERBS_1.10 ... 1.14, and ibv_wr_opcode_str at
 * IBVERBS_PRIVATE_34 from rdma-core 49) on an open device, and prints what each answers:
 * src/abi/tests/symbol_versions.rs compares the lines. Each call's contract is rdma-core's
 * libibverbs/verbs.h; where xrnic does not implement a verb, rdma-core's own library
 * answers the same for a provider without it (libibverbs/dummy_ops.c: EOPNOTSUPP). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <infiniband/verbs.h>

/* verbs.h declares it from rdma-core 49 on; Debian 12's (44) does not. */
const char *ibv_wr_opcode_str(enum ibv_wr_opcode opcode);

static int fail(const char *what)
{
	printf("FAIL %s: %s\n", what, strerror(errno));
	return 1;
}

int main(void)
{
	struct ibv_device **list = ibv_get_device_list(NULL);
	if (!list || !list[0])
		return fail("ibv_get_device_list");
	struct ibv_context *ctx = ibv_open_device(list[0]);
	if (!ctx)
		return fail("ibv_open_device");
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	if (!pd)
		return fail("ibv_alloc_pd");
	struct ibv_cq *cq = ibv_create_cq(ctx, 4, NULL, NULL, 0);
	if (!cq)
		return fail("ibv_create_cq");
	struct ibv_qp_init_attr init = {
		.send_cq = cq,
		.recv_cq = cq,
		.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
		.qp_type = IBV_QPT_RC,
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &init);
	if (!qp)
		return fail("ibv_create_qp");

	/* IBVERBS_1.14: 0 claims no in-order guarantee. */
	printf("ibv_query_qp_data_in_order %d\n",
	       ibv_query_qp_data_in_order(qp, IBV_WR_RDMA_WRITE, 0));

	/* IBVERBS_1.12: no dma-buf memory. */
	int fd = open("/dev/null", O_RDONLY);
	errno = 0;
	struct ibv_mr *mr = ibv_reg_dmabuf_mr(pd, 0, 4096, 0, fd, IBV_ACCESS_LOCAL_WRITE);
	printf("ibv_reg_dmabuf_mr %s errno %d\n", mr ? "mr" : "NULL", errno);

	/* IBVERBS_1.10: no kernel command fd to import a context from. */
	errno = 0;
	struct ibv_context *imported = ibv_import_device(fd);
	printf("ibv_import_device %s errno %d\n", imported ? "context" : "NULL", errno);
	struct ibv_ece ece;
	printf("ibv_query_ece %d\n", ibv_query_ece(qp, &ece));

	/* IBVERBS_1.13 */
	printf("ibv_is_fork_initialized %d\n", (int)ibv_is_fork_initialized());

	/* IBVERBS_PRIVATE_34, a public declaration of rdma-core 49's verbs.h */
	printf("ibv_wr_opcode_str %s\n", ibv_wr_opcode_str(IBV_WR_SEND));

	close(fd);
	if (ibv_destroy_qp(qp) || ibv_destroy_cq(cq) || ibv_dealloc_pd(pd) ||
	    ibv_close_device(ctx))
		return fail("destroy");
	ibv_free_device_list(list);
	printf("done\n");
	return 0;
}
