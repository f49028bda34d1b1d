/*
 * sum: the example project of thermite's example kit (examples/kits/sum).
 *
 *   sum LIST CASES OUT
 *
 * LIST names one case per line. Each case is CASES/<name>.txt: lines of two
 * numbers "a b". For each line, sum prints "a b s" to OUT/<name>.txt, where s
 * is the sum of the Collatz stopping times of every n in [a, b] (the steps
 * n -> n/2 or 3n+1 takes to reach 1). It is deliberately CPU-bound: a
 * candidate that finds a faster way to the same sums times better.
 * On stdout: one line per case with its total.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t steps(uint64_t n)
{
	uint64_t s = 0;
	while (n != 1) {
		n = (n & 1) ? 3 * n + 1 : n / 2;
		s++;
	}
	return s;
}

static int valid_name(const char *s)
{
	if (*s == '\0')
		return 0;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') ||
		      (*s >= '0' && *s <= '9') || *s == '_' || *s == '-'))
			return 0;
	return 1;
}

static int run_case(const char *cases, const char *out, const char *name)
{
	char in_path[4096], out_path[4096];
	snprintf(in_path, sizeof in_path, "%s/%s.txt", cases, name);
	snprintf(out_path, sizeof out_path, "%s/%s.txt", out, name);
	FILE *in = fopen(in_path, "r");
	if (!in) {
		fprintf(stderr, "sum: %s: %s\n", in_path, strerror(errno));
		return -1;
	}
	FILE *o = fopen(out_path, "w");
	if (!o) {
		fprintf(stderr, "sum: %s: %s\n", out_path, strerror(errno));
		fclose(in);
		return -1;
	}
	uint64_t a, b, total = 0;
	int r;
	while ((r = fscanf(in, "%" SCNu64 " %" SCNu64, &a, &b)) == 2) {
		if (a < 1 || b < a || b > 100000000) {
			fprintf(stderr, "sum: %s: bad range %" PRIu64 " %" PRIu64 "\n", in_path, a, b);
			fclose(in);
			fclose(o);
			return -1;
		}
		uint64_t s = 0;
		for (uint64_t n = a; n <= b; n++)
			s += steps(n);
		fprintf(o, "%" PRIu64 " %" PRIu64 " %" PRIu64 "\n", a, b, s);
		total += s;
	}
	fclose(in);
	if (r != EOF) {
		fprintf(stderr, "sum: %s: not pairs of numbers\n", in_path);
		fclose(o);
		return -1;
	}
	if (fclose(o) != 0) {
		fprintf(stderr, "sum: %s: %s\n", out_path, strerror(errno));
		return -1;
	}
	printf("%s %" PRIu64 "\n", name, total);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc != 4) {
		fprintf(stderr, "usage: sum LIST CASES OUT\n");
		return 2;
	}
	FILE *list = fopen(argv[1], "r");
	if (!list) {
		fprintf(stderr, "sum: %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	char name[256];
	int failed = 0;
	while (fscanf(list, "%255s", name) == 1) {
		if (!valid_name(name)) {
			fprintf(stderr, "sum: %s: bad case name\n", argv[1]);
			failed = 1;
			continue;
		}
		if (run_case(argv[2], argv[3], name) != 0)
			failed = 1;
	}
	fclose(list);
	return failed;
}
