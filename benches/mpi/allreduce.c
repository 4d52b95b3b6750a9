/*
 * allreduce: the figures `make bench-mpi` prints (benches/mpi/bench-mpi.sh), measured in one
 * MPI job.
 *
 *   allreduce [-r REPS]
 *
 * 1. B, the point-to-point bandwidth of the transport the job runs on: rank 0 streams
 *    STREAM_MSGS messages of STREAM_BYTES to rank 1 (MPI_Isend / MPI_Irecv, all posted at
 *    once), rank 1 answers with one byte when all arrived; B = bytes / time, REPS times,
 *    the other ranks waiting in a barrier. Then the same in both directions at once
 *    (each of ranks 0 and 1 sends STREAM_MSGS messages and receives as many): a ring
 *    all-reduce has every rank sending and receiving at the same time, and a software
 *    transport spends the CPU of both directions on the same core.
 * 2. MPI_Allreduce (MPI_FLOAT, MPI_SUM, in place) of 64 KiB, 1 MiB, 8 MiB and 32 MiB,
 *    one warm-up and REPS timed calls each, a barrier before each call; a call's time is
 *    the slowest rank's (MPI_MAX over the ranks). Rank r contributes (r + 1) * (i % 61 + 1)
 *    at index i: every partial sum is a small integer, exact in a float whatever order
 *    the algorithm adds in, so each result is compared for equality with
 *    p (p + 1) / 2 * (i % 61 + 1), every element, after every call.
 *
 * Rank 0 prints one line per figure, each time a sorted list of the repetitions:
 *   bw BYTES_PER_MSG MSGS SECONDS...      (one direction)
 *   bibw BYTES_PER_MSG MSGS SECONDS...    (both directions, MSGS each way)
 *   allreduce P BYTES OK|BAD SECONDS...
 * and exits non-zero (MPI_Abort) when any element of any result on any rank is wrong.
 */
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define STREAM_BYTES (8u << 20)
#define STREAM_MSGS 8
#define MAX_REPS 1000

static const size_t SIZES[] = {64u << 10, 1u << 20, 8u << 20, 32u << 20};

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

static void print_sorted(double *t, int n)
{
	qsort(t, (size_t)n, sizeof(double), cmp_double);
	for (int i = 0; i < n; i++)
		printf(" %.6f", t[i]);
	printf("\n");
}

/*
 * Rank 0 -> rank 1 streaming bandwidth, or both ways at once when `both` (`buf` then holds
 * two STREAM_BYTES halves: one sent, one received into). Ranks past 1 only take part in
 * the barriers.
 */
static void stream_bw(int rank, int reps, char *buf, int both)
{
	MPI_Request req[2 * STREAM_MSGS];
	double t[MAX_REPS];
	char ack = 0;
	for (int r = -1; r < reps; r++) { /* r = -1: warm-up (connection, registration) */
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime();
		if (both && rank < 2) {
			int peer = 1 - rank;
			for (int m = 0; m < STREAM_MSGS; m++) {
				MPI_Irecv(buf + STREAM_BYTES, STREAM_BYTES, MPI_BYTE, peer, m,
					  MPI_COMM_WORLD, &req[m]);
				MPI_Isend(buf, STREAM_BYTES, MPI_BYTE, peer, m, MPI_COMM_WORLD,
					  &req[STREAM_MSGS + m]);
			}
			MPI_Waitall(2 * STREAM_MSGS, req, MPI_STATUSES_IGNORE);
			double mine = MPI_Wtime() - t0, other = 0;
			MPI_Sendrecv(&mine, 1, MPI_DOUBLE, peer, 998, &other, 1, MPI_DOUBLE, peer, 998,
				     MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			if (r >= 0)
				t[r] = mine > other ? mine : other;
		} else if (both) {
			/* not in the exchange */
		} else if (rank == 0) {
			for (int m = 0; m < STREAM_MSGS; m++)
				MPI_Isend(buf, STREAM_BYTES, MPI_BYTE, 1, m, MPI_COMM_WORLD, &req[m]);
			MPI_Waitall(STREAM_MSGS, req, MPI_STATUSES_IGNORE);
			MPI_Recv(&ack, 1, MPI_BYTE, 1, 999, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			if (r >= 0)
				t[r] = MPI_Wtime() - t0;
		} else if (rank == 1) {
			for (int m = 0; m < STREAM_MSGS; m++)
				MPI_Irecv(buf, STREAM_BYTES, MPI_BYTE, 0, m, MPI_COMM_WORLD, &req[m]);
			MPI_Waitall(STREAM_MSGS, req, MPI_STATUSES_IGNORE);
			MPI_Send(&ack, 1, MPI_BYTE, 0, 999, MPI_COMM_WORLD);
		}
	}
	if (rank == 0) {
		printf("%s %u %d", both ? "bibw" : "bw", STREAM_BYTES, STREAM_MSGS);
		print_sorted(t, reps);
	}
}

/* One size: warm-up plus `reps` checked calls. Returns the number of wrong elements. */
static long allreduce_size(int rank, int p, int reps, size_t bytes, float *v)
{
	size_t n = bytes / sizeof(float);
	double t[MAX_REPS];
	long bad = 0;
	for (int r = -1; r < reps; r++) {
		for (size_t i = 0; i < n; i++)
			v[i] = (float)((rank + 1) * (int)(i % 61 + 1));
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime();
		MPI_Allreduce(MPI_IN_PLACE, v, (int)n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
		double mine = MPI_Wtime() - t0, slowest = 0;
		MPI_Reduce(&mine, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
		if (r >= 0)
			t[r] = slowest;
		for (size_t i = 0; i < n; i++)
			if (v[i] != (float)(p * (p + 1) / 2 * (int)(i % 61 + 1)))
				bad++;
	}
	long all_bad = 0;
	MPI_Reduce(&bad, &all_bad, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
	if (rank == 0) {
		printf("allreduce %d %zu %s", p, bytes, all_bad ? "BAD" : "OK");
		print_sorted(t, reps);
	}
	MPI_Bcast(&all_bad, 1, MPI_LONG, 0, MPI_COMM_WORLD);
	return all_bad;
}

int main(int argc, char **argv)
{
	int reps = 5, opt, rank, p;
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &p);
	while ((opt = getopt(argc, argv, "r:")) != -1) {
		if (opt == 'r')
			reps = atoi(optarg);
		else
			reps = 0;
	}
	if (reps < 1 || reps > MAX_REPS || p < 2) {
		if (rank == 0)
			fprintf(stderr, "usage: mpirun -np P (P >= 2) allreduce [-r REPS (1..%d)]\n",
				MAX_REPS);
		MPI_Finalize();
		return 2;
	}
	size_t max = SIZES[sizeof SIZES / sizeof SIZES[0] - 1];
	float *v = malloc(max > 2 * STREAM_BYTES ? max : 2 * STREAM_BYTES);
	if (!v) {
		fprintf(stderr, "rank %d: out of memory\n", rank);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	memset(v, 0, max > 2 * STREAM_BYTES ? max : 2 * STREAM_BYTES);
	stream_bw(rank, reps, (char *)v, 0);
	stream_bw(rank, reps, (char *)v, 1);
	fflush(stdout);
	long bad = 0;
	for (size_t s = 0; s < sizeof SIZES / sizeof SIZES[0]; s++) {
		bad += allreduce_size(rank, p, reps, SIZES[s], v);
		fflush(stdout);
	}
	free(v);
	if (bad) {
		if (rank == 0)
			fprintf(stderr, "allreduce: %ld wrong elements\n", bad);
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	MPI_Finalize();
	return 0;
}
