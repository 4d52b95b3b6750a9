/* The device removed under a running program (IBV_EVENT_DEVICE_FATAL), through the
 * system's <infiniband/verbs.h> (libibverbs-dev), linked with -libverbs: on xrnic
 * through `xrnic exec` (tests/verbs_abi_c.rs), which deletes the interface once the
 * program prints "READY".
 *
 *   verbs_fatal DEVICE GID_INDEX
 *
 * Two RC QPs of the device connected to each other (the frames loop back inside the
 * device): three receives posted on the first, and a SEND the second has no receive for
 * (RNR NAKs, retried for ever), so four work requests are outstanding when the device
 * goes. Then: DEVICE_FATAL on the async fd (element.port_num 0, as the kernel's uverbs
 * sends it), the four WRs flushed (the armed CQ's event on its channel, then
 * IBV_WC_WR_FLUSH_ERR), every verb that needs the device failing EIO as rdma-core's do on
 * a disassociated device (queries, req_notify_cq, SRQ and AH verbs included: the kernel
 * refuses every command but a destroy, rdma_core.c rdma_lookup_get_uobject), the async fd and the channel answering EIO instead of
 * blocking, and every destroy succeeding. One line per check, then "N passed, M
 * failed". */
#include "common.h"

int main(int argc, char **argv)
{
	struct ibv_device **list;
	struct ibv_context *ctx;
	struct ibv_device_attr da;
	struct ibv_port_attr pa;
	union ibv_gid gid;
	struct ibv_pd *pd;
	struct ibv_mr *mr;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq, *ecq;
	struct ibv_qp *qa, *qb;
	struct ibv_qp_init_attr qia;
	struct ibv_qp_attr attr;
	struct ibv_sge sge;
	struct ibv_send_wr swr, *bad;
	struct ibv_recv_wr rwr, *rbad;
	struct ibv_async_event ev;
	struct ibv_wc wc[8];
	struct ibv_cq *evcq;
	struct ibv_srq *srq;
	struct ibv_srq_init_attr sia;
	struct ibv_srq_attr sa;
	struct ibv_ah_attr aha;
	struct ibv_gid_entry ge;
	__be16 pkey;
	void *evctx;
	char *buf;
	int i, n, gid_index, got, flushed, fatal, others;
	const size_t len = 4096;

	if (argc != 3) {
		fprintf(stderr, "usage: %s DEVICE GID_INDEX\n", argv[0]);
		return 2;
	}
	gid_index = atoi(argv[2]);
	list = ibv_get_device_list(&n);
	ctx = open_named(list, n, argv[1]);
	check(ctx != NULL, "ibv_open_device");
	if (!ctx)
		goto out;
	check(ibv_query_gid(ctx, 1, gid_index, &gid) == 0, "ibv_query_gid");
	pd = ibv_alloc_pd(ctx);
	buf = aligned_alloc(4096, len);
	mr = pd && buf ? ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE) : NULL;
	ch = ibv_create_comp_channel(ctx);
	cq = ch ? ibv_create_cq(ctx, 16, NULL, ch, 0) : NULL;
	check(pd && mr && ch && cq, "ibv_alloc_pd, ibv_reg_mr, ibv_create_comp_channel, ibv_create_cq");
	if (!(pd && mr && ch && cq))
		goto out;
	memset(&qia, 0, sizeof qia);
	qia.send_cq = cq;
	qia.recv_cq = cq;
	qia.qp_type = IBV_QPT_RC;
	qia.cap.max_send_wr = 4;
	qia.cap.max_recv_wr = 4;
	qia.cap.max_send_sge = 1;
	qia.cap.max_recv_sge = 1;
	qa = ibv_create_qp(pd, &qia);
	qb = ibv_create_qp(pd, &qia);
	check(qa && qb && connect_qp(qa, 0, qb->qp_num, &gid, gid_index) == 0 &&
		      connect_qp(qb, 0, qa->qp_num, &gid, gid_index) == 0,
	      "two QPs of the device connected to each other");
	if (!qa || !qb)
		goto out;
	memset(&sia, 0, sizeof sia);
	sia.attr.max_wr = 4;
	sia.attr.max_sge = 1;
	srq = ibv_create_srq(pd, &sia);
	check(srq != NULL, "ibv_create_srq");
	if (!srq)
		goto out;
	sge.addr = (uintptr_t)buf;
	sge.length = 64;
	sge.lkey = mr->lkey;
	memset(&rwr, 0, sizeof rwr);
	rwr.sg_list = &sge;
	rwr.num_sge = 1;
	for (i = 1; i <= 3; i++) {
		rwr.wr_id = i;
		check(ibv_post_recv(qa, &rwr, &rbad) == 0, "ibv_post_recv");
	}
	memset(&swr, 0, sizeof swr);
	swr.wr_id = 4;
	swr.sg_list = &sge;
	swr.num_sge = 1;
	swr.opcode = IBV_WR_SEND;
	swr.send_flags = IBV_SEND_SIGNALED;
	check(ibv_post_send(qa, &swr, &bad) == 0, "a SEND the other QP has no receive for");
	check(ibv_req_notify_cq(cq, 0) == 0, "ibv_req_notify_cq");
	n = ibv_poll_cq(cq, 8, wc);
	check(n == 0, "nothing completes before the device goes");

	printf("READY\n");
	fflush(stdout);

	/* PORT_ERR may come first: the kernel takes the link down before it deletes it. */
	fatal = 0;
	others = 0;
	for (i = 0; i < 4 && !fatal; i++) {
		if (wait_async(ctx, 30000, &ev) != 0)
			break;
		if (ev.event_type == IBV_EVENT_DEVICE_FATAL)
			fatal = ev.element.port_num == 0 ? 1 : -1;
		else if (ev.event_type != IBV_EVENT_PORT_ERR)
			others++;
		ibv_ack_async_event(&ev);
	}
	check(fatal == 1, "ibv_get_async_event: IBV_EVENT_DEVICE_FATAL, element.port_num 0");
	check(others == 0, "no other event than PORT_ERR before it");
	got = ibv_get_cq_event(ch, &evcq, &evctx) == 0 && evcq == cq;
	check(got, "ibv_get_cq_event: the flushes' event on the armed CQ");
	if (got)
		ibv_ack_cq_events(cq, 1);
	flushed = 0;
	for (i = 0; i < 100 && flushed < 4; i++) {
		int k, m = ibv_poll_cq(cq, 8, wc);

		for (k = 0; k < m; k++)
			if (wc[k].status == IBV_WC_WR_FLUSH_ERR && wc[k].wr_id >= 1 &&
			    wc[k].wr_id <= 4)
				flushed++;
		if (m == 0)
			usleep(10000);
	}
	check(flushed == 4, "the 3 receives and the SEND complete with IBV_WC_WR_FLUSH_ERR");
	check(ibv_poll_cq(cq, 8, wc) == 0, "nothing else completes");
	memset(&attr, 0, sizeof attr);
	errno = 0;
	check(ibv_query_qp(qa, &attr, IBV_QP_STATE, &qia) == EIO, "ibv_query_qp: EIO");

	/* Every verb that needs the device: EIO (uverbs on a disassociated device). */
	errno = 0;
	check(ibv_post_recv(qa, &rwr, &rbad) == EIO, "ibv_post_recv: EIO");
	check(ibv_post_send(qa, &swr, &bad) == EIO, "ibv_post_send: EIO");
	errno = 0;
	check(ibv_reg_mr(pd, buf, len, IBV_ACCESS_LOCAL_WRITE) == NULL && errno == EIO,
	      "ibv_reg_mr: NULL, errno EIO");
	errno = 0;
	check(ibv_alloc_pd(ctx) == NULL && errno == EIO, "ibv_alloc_pd: NULL, errno EIO");
	errno = 0;
	ecq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	check(ecq == NULL && errno == EIO, "ibv_create_cq: NULL, errno EIO");
	errno = 0;
	check(ibv_create_qp(pd, &qia) == NULL && errno == EIO, "ibv_create_qp: NULL, errno EIO");
	errno = 0;
	check(ibv_create_comp_channel(ctx) == NULL && errno == EIO,
	      "ibv_create_comp_channel: NULL, errno EIO");
	memset(&attr, 0, sizeof attr);
	attr.qp_state = IBV_QPS_RESET;
	check(ibv_modify_qp(qb, &attr, IBV_QP_STATE) == EIO, "ibv_modify_qp: EIO");
	check(ibv_query_port(ctx, 1, &pa) == EIO, "ibv_query_port: EIO");
	check(ibv_query_device(ctx, &da) == EIO, "ibv_query_device: EIO");
	errno = 0;
	check(ibv_query_gid(ctx, 1, gid_index, &gid) == -1 && errno == EIO,
	      "ibv_query_gid: -1, errno EIO");
	check(ibv_query_gid_ex(ctx, 1, gid_index, &ge, 0) == EIO, "ibv_query_gid_ex: EIO");
	errno = 0;
	check(ibv_query_pkey(ctx, 1, 0, &pkey) == -1 && errno == EIO,
	      "ibv_query_pkey: -1, errno EIO");
	check(ibv_get_pkey_index(ctx, 1, 0xffff) < 0, "ibv_get_pkey_index: fails");
	check(ibv_req_notify_cq(cq, 0) == EIO, "ibv_req_notify_cq: EIO");
	memset(&sa, 0, sizeof sa);
	sa.srq_limit = 1;
	check(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) == EIO, "ibv_modify_srq: EIO");
	check(ibv_query_srq(srq, &sa) == EIO, "ibv_query_srq: EIO");
	check(ibv_post_srq_recv(srq, &rwr, &rbad) == EIO, "ibv_post_srq_recv: EIO");
	errno = 0;
	check(ibv_create_srq(pd, &sia) == NULL && errno == EIO, "ibv_create_srq: NULL, errno EIO");
	memset(&aha, 0, sizeof aha);
	aha.is_global = 1;
	aha.port_num = 1;
	aha.grh.dgid = gid;
	aha.grh.sgid_index = gid_index;
	aha.grh.hop_limit = 1;
	errno = 0;
	check(ibv_create_ah(pd, &aha) == NULL && errno == EIO, "ibv_create_ah: NULL, errno EIO");
	/* No more events: the fds answer EIO rather than block. */
	errno = 0;
	check(ibv_get_async_event(ctx, &ev) == -1 && errno == EIO,
	      "ibv_get_async_event after DEVICE_FATAL: -1, errno EIO (no hang)");
	errno = 0;
	check(ibv_get_cq_event(ch, &evcq, &evctx) == -1 && errno == EIO,
	      "ibv_get_cq_event with no event left: -1, errno EIO (no hang)");

	/* Clean-up succeeds. */
	check(ibv_destroy_qp(qa) == 0 && ibv_destroy_qp(qb) == 0, "ibv_destroy_qp");
	check(ibv_destroy_srq(srq) == 0, "ibv_destroy_srq");
	check(ibv_destroy_cq(cq) == 0, "ibv_destroy_cq");
	check(ibv_destroy_comp_channel(ch) == 0, "ibv_destroy_comp_channel");
	check(ibv_dereg_mr(mr) == 0, "ibv_dereg_mr");
	check(ibv_dealloc_pd(pd) == 0, "ibv_dealloc_pd");
	check(ibv_close_device(ctx) == 0, "ibv_close_device");
	ibv_free_device_list(list);
	free(buf);
out:
	return summary();
}
