/* What the C test programs of tests/c share: the check counter and its summary, the
 * device opened by name, the exchange of a peer's facts through files in a directory,
 * and bounded waits for a completion and an asynchronous event. Every function is
 * static inline, so a program that uses only some of them builds warning-free under
 * -Wall -Wextra -Werror. Built with cc against the system's <infiniband/verbs.h>
 * (libibverbs-dev): by tests/verbs_abi_c.rs, tests/rdmacm_failures.rs and
 * interop/run-stock-rxe.sh (#include "common.h" is found beside the .c file). */
#ifndef XRNIC_TESTS_C_COMMON_H
#define XRNIC_TESTS_C_COMMON_H

#include <errno.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <infiniband/verbs.h>

static int passed, failed;

/* One line per check, flushed at once (a test reads them while the program runs). */
static inline void check(int ok, const char *what)
{
	printf("%s: %s\n", ok ? "PASS" : "FAIL", what);
	fflush(stdout);
	if (ok)
		passed++;
	else
		failed++;
}

/* The last line, "N passed, M failed", and the exit status: 0 only when nothing failed. */
static inline int summary(void)
{
	printf("%d passed, %d failed\n", passed, failed);
	return failed ? 1 : 0;
}

/* Open the device called `name` from `list` (ibv_get_device_list's, `n` entries): its
 * context, or NULL. */
static inline struct ibv_context *open_named(struct ibv_device **list, int n, const char *name)
{
	int i;

	for (i = 0; list && i < n; i++)
		if (strcmp(ibv_get_device_name(list[i]), name) == 0)
			return ibv_open_device(list[i]);
	return NULL;
}

/* Publish `len` bytes at `p` as DIR/ROLE.info (written aside, then renamed: a reader
 * never sees half of it). */
static inline int write_blob(const char *dir, const char *role, const void *p, size_t len)
{
	char path[512], tmp[520];
	FILE *f;

	snprintf(path, sizeof path, "%s/%s.info", dir, role);
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	f = fopen(tmp, "w");
	if (!f)
		return -1;
	fwrite(p, len, 1, f);
	fclose(f);
	return rename(tmp, path);
}

/* Read DIR/ROLE.info (`len` bytes into `p`), waiting up to 30 s for the peer to write it. */
static inline int read_blob(const char *dir, const char *role, void *p, size_t len)
{
	char path[512];
	FILE *f;
	int n;

	snprintf(path, sizeof path, "%s/%s.info", dir, role);
	for (n = 0; n < 3000; n++) {
		f = fopen(path, "r");
		if (f) {
			size_t r = fread(p, len, 1, f);
			fclose(f);
			if (r == 1)
				return 0;
		}
		usleep(10000);
	}
	return -1;
}

/* A program's own `struct info` through the two above. */
#define write_info(dir, role, i) write_blob((dir), (role), (i), sizeof *(i))
#define read_info(dir, role, i) read_blob((dir), (role), (i), sizeof *(i))

/* Poll `cq` until one completion arrives (bounded): ibv_poll_cq's last answer. */
static inline int poll_one(struct ibv_cq *cq, struct ibv_wc *wc)
{
	long n;

	for (n = 0; n < 200000000L; n++) {
		int r = ibv_poll_cq(cq, 1, wc);
		if (r != 0)
			return r;
	}
	return 0;
}

/* The next asynchronous event within `ms` milliseconds (poll(2) on the async fd, then
 * ibv_get_async_event): 0 with *ev filled (to be acknowledged), -1 when none came. */
static inline int wait_async(struct ibv_context *ctx, int ms, struct ibv_async_event *ev)
{
	struct pollfd pfd = {ctx->async_fd, POLLIN, 0};

	if (poll(&pfd, 1, ms) != 1)
		return -1;
	return ibv_get_async_event(ctx, ev);
}

/* wait_async, acknowledging and skipping the events of type `skip` (-1: none). */
static inline int wait_async_except(struct ibv_context *ctx, int ms, int skip,
				    struct ibv_async_event *ev)
{
	for (;;) {
		if (wait_async(ctx, ms, ev) != 0)
			return -1;
		if ((int)ev->event_type != skip)
			return 0;
		ibv_ack_async_event(ev);
	}
}

/* A connected QP (RC or UC) to RTS with `access` as its access flags; UC takes neither
 * the RDMA-atomic nor the retry attributes (IBTA vol. 1 §10.3). */
static inline int connect_qp_access(struct ibv_qp *qp, int uc, uint32_t dest,
				    const union ibv_gid *dgid, int gid_index, int access)
{
	struct ibv_qp_attr a;
	int m;

	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_INIT;
	a.port_num = 1;
	a.qp_access_flags = access;
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
	a.ah_attr.grh.dgid = *dgid;
	a.ah_attr.grh.sgid_index = gid_index;
	a.ah_attr.grh.hop_limit = 64;
	a.ah_attr.port_num = 1;
	m = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN;
	if (!uc)
		m |= IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
	if (ibv_modify_qp(qp, &a, m))
		return -1;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = 14;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 1;
	m = IBV_QP_STATE | IBV_QP_SQ_PSN;
	if (!uc)
		m |= IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_MAX_QP_RD_ATOMIC;
	return ibv_modify_qp(qp, &a, m);
}

/* connect_qp_access with remote WRITE and local write access. */
static inline int connect_qp(struct ibv_qp *qp, int uc, uint32_t dest,
			     const union ibv_gid *dgid, int gid_index)
{
	return connect_qp_access(qp, uc, dest, dgid, gid_index,
				 IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_LOCAL_WRITE);
}

#endif
