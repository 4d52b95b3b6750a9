/* An attacker of tests/service_sec_mem.rs that speaks the service's protocol itself
 * (src/service/wire.rs: one JSON request per SOCK_SEQPACKET message on @xrnic/IF): it
 * connects (the service records this process's pid, SO_PEERCRED), forks, and this
 * process exec's argv[2] (the victim, tests/c/svc_mem_victim.c) with its stdin and
 * stdout on pipes to the child. Only then does the child say hello on the connection,
 * allocate a PD and register the victim's page: on a service that binds a client's
 * memory to the pid that connected, the hello is the victim's. One line per answer on
 * stdout ("hello: JSON", "pd: JSON", "reg: JSON"), "attack: done", then a line to the
 * victim, which reports on stderr whether its page changed. argv[1]: the interface. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/socket.h>
#include <sys/un.h>

/* Send `req`, print the answer as "what: ANSWER" (descriptors it carries are closed);
 * 0 when the answer is not an error. */
static int call(int s, const char *what, const char *req)
{
	char buf[4096], ctl[CMSG_SPACE(16 * sizeof(int))];
	struct iovec io = {buf, sizeof buf - 1};
	struct msghdr m;
	struct cmsghdr *c;
	ssize_t n;

	if (send(s, req, strlen(req), 0) < 0)
		return -1;
	memset(&m, 0, sizeof m);
	m.msg_iov = &io;
	m.msg_iovlen = 1;
	m.msg_control = ctl;
	m.msg_controllen = sizeof ctl;
	n = recvmsg(s, &m, MSG_CMSG_CLOEXEC);
	if (n <= 0) {
		printf("%s: no answer\n", what);
		return -1;
	}
	for (c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
			int *fd = (int *)CMSG_DATA(c);
			size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);

			while (k--)
				close(fd[k]);
		}
	}
	buf[n] = 0;
	printf("%s: %s\n", what, buf);
	fflush(stdout);
	return strstr(buf, "\"Err\"") ? -1 : 0;
}

int main(int argc, char **argv)
{
	struct sockaddr_un a;
	char line[64], req[256];
	unsigned long long v = 0;
	int s, out[2], in[2];
	socklen_t len;
	pid_t pid;
	FILE *f;

	if (argc != 3) {
		fprintf(stderr, "usage: %s IF VICTIM\n", argv[0]);
		return 2;
	}
	memset(&a, 0, sizeof a);
	a.sun_family = AF_UNIX;
	/* Abstract name: a NUL, then "xrnic/IF" (src/service/wire.rs socket_name). */
	snprintf(a.sun_path + 1, sizeof a.sun_path - 1, "xrnic/%s", argv[1]);
	len = offsetof(struct sockaddr_un, sun_path) + 1 + strlen(a.sun_path + 1);
	s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0 || connect(s, (struct sockaddr *)&a, len) || pipe(out) || pipe(in)) {
		printf("attack: setup failed\n");
		return 1;
	}
	fflush(stdout);
	pid = fork();
	if (pid < 0)
		return 1;
	if (pid > 0) {
		/* The process that connected becomes the victim. */
		if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0)
			return 1;
		execl(argv[2], argv[2], (char *)NULL);
		return 127;
	}
	close(out[1]);
	close(in[0]);
	f = fdopen(out[0], "r");
	if (!f || !fgets(line, sizeof line, f) || sscanf(line, "%llx", &v) != 1) {
		printf("attack: no address from the victim\n");
		return 1;
	}
	if (call(s, "hello", "{\"Hello\":{\"comm\":\"attack\"}}") == 0 &&
	    call(s, "pd", "\"AllocPd\"") == 0) {
		snprintf(req, sizeof req,
			 "{\"RegMr\":{\"pd\":1,\"addr\":%llu,\"len\":4096,\"iova\":%llu,"
			 "\"access\":15}}",
			 v, v);
		call(s, "reg", req);
	}
	printf("attack: done\n");
	fflush(stdout);
	if (write(in[1], "done\n", 5) != 5)
		return 1;
	return 0;
}
