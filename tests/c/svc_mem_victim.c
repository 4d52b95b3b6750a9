/* The victim of tests/service_sec_mem.rs: a program (installed set-uid root, or not)
 * that keeps a secret in a page of its heap, prints the page's address on stdout, waits
 * for one line on stdin, then says on stderr whether any byte of the page changed
 * meanwhile: "victim euid=E intact" or "victim euid=E changed". No libibverbs. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define PAGE 4096
#define SECRET "xrnic-victim-secret-0123456789"

int main(void)
{
	char *page, *copy, line[64];

	if (posix_memalign((void **)&page, PAGE, PAGE) != 0 || !(copy = malloc(PAGE)))
		return 2;
	memset(page, 0, PAGE);
	strcpy(page, SECRET);
	memcpy(copy, page, PAGE);
	printf("%p\n", (void *)page);
	fflush(stdout);
	if (!fgets(line, sizeof line, stdin))
		line[0] = 0;
	fprintf(stderr, "victim euid=%d %s\n", (int)geteuid(),
		memcmp(page, copy, PAGE) == 0 ? "intact" : "changed");
	return 0;
}
