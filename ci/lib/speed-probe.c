/*
 * ci/lib/speed-probe.c: how fast the machine runs right now.
 *
 * A fixed amount of CPU work with no system calls in it (a linear
 * congruential generator updating a 32 KiB table), timed with
 * CLOCK_MONOTONIC; prints the milliseconds it took. ci/bench runs it on both
 * vCPUs of the guest before every pair, and natively on the host before the
 * VM boots, so that each table records how much the machine's own speed
 * moved while it was measured (docs/benchmarks-log.md, session 12).
 *
 *   speed-probe [STEPS]     (default 4000000)
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv)
{
	long steps = argc > 1 ? atol(argv[1]) : 4000000;
	static uint64_t table[4096];
	struct timespec a, b;
	uint64_t x = 1;

	if (steps <= 0) {
		fprintf(stderr, "speed-probe: STEPS must be a positive number\n");
		return 2;
	}
	clock_gettime(CLOCK_MONOTONIC, &a);
	for (long i = 0; i < steps; i++) {
		x = x * 6364136223846793005ULL + 1442695040888963407ULL;
		table[(x >> 20) & 4095] += x;
		if ((x & 0xff) == 7)
			x ^= table[i & 4095];
	}
	clock_gettime(CLOCK_MONOTONIC, &b);
	/* The result depends on the table, so the loop cannot be left out. */
	printf("%.1f %u\n", (b.tv_sec - a.tv_sec) * 1e3 + (b.tv_nsec - a.tv_nsec) / 1e6,
	       (unsigned)(x & 1));
	return 0;
}
