/*
 * ci/lib/instr-window.c: an LD_PRELOAD library for ci/bench-instr that makes
 * a benchmark client's instruction count under callgrind exact.
 *
 * Two things make the count of a perftest-style client depend on timing
 * rather than on the code: busy polling (an empty poll of the completion
 * queue, or of the target buffer in write_lat, per spin while the message is
 * on its way: tens per iteration under valgrind) and what runs around the
 * loop (perftest measures the CPU frequency by spinning on gettimeofday; the
 * latency statistics sort the samples, N log N and data-dependent). So the
 * library hooks rxe's doorbell, the write() of an IB_USER_VERBS_CMD_POST_SEND
 * command that its post_send makes to the uverbs file, and:
 *
 * - in the client, after each doorbell, waits until the message's exchange
 *   is over: until the peer's system call for a doorbell it began after
 *   this one has returned (its answer is sent; RDMA_INSTR_PEER names the
 *   file where the peer counts them, RDMA_INSTR_PEER_MAX how many it rings
 *   in all), then at least
 *   RDMA_INSTR_WAIT_US microseconds, then until the device's packet counter
 *   (the sysfs file RDMA_INSTR_COUNTER) has not moved for
 *   RDMA_INSTR_QUIET_US. Every poll then finds its completion at once, and
 *   the work per message no longer depends on how fast the answer came.
 *   ("After this one", not "as many": perftest's write_lat server writes
 *   first, perf's client does.)
 * - in the client, has callgrind dump its counters right before doorbell
 *   number RDMA_INSTR_FROM and every RDMA_INSTR_EVERY doorbells after it, up
 *   to doorbell RDMA_INSTR_UNTIL (if set), so that each dump between two
 *   others covers exactly EVERY periods of the loop, from one post's system
 *   call to the next.
 * - in the server of a latency test, counts its doorbells into the file
 *   RDMA_INSTR_PUBLISH (the client's RDMA_INSTR_PEER) twice: begun before
 *   the system call (so that the client never sees an answer before its
 *   count) and done after it.
 *
 * Whatever is not set is not done. The library's own instructions are in its
 * own object, which ci/lib/callgrind-split.py leaves out of the totals; the
 * write() itself is libc's, reached through dlsym(RTLD_NEXT), and counted as
 * before. The waits use raw system calls, so no libc code runs for them.
 * rxe's post_send calls write() through the PLT, which this library
 * interposes. Neither tool sends anything else through write() that starts
 * with that command word (perftest's TCP messages are text; Rust's std sends
 * with send()).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <rdma/ib_user_verbs.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <valgrind/callgrind.h>

#if !defined(__x86_64__)
#error "instr-window.c waits with raw x86_64 system calls"
#endif

/* Longest wait after one doorbell, in microseconds: a lost answer makes the
 * client poll (the window shows it) rather than hang. */
#define WAIT_CAP_US 10000000L
#define STEP_US 200L

static ssize_t (*real_write)(int, const void *, size_t);
static long from_bell, every, until_bell, wait_us, quiet_us, peer_max, bells;
static int counter_fd = -1;
/* The peer's doorbells: [0] begun, [1] whose system call has returned. */
static volatile long *peer_bells; /* client: the server's */
static volatile long *my_bells; /* server: its own, published */

static long env_long(const char *name)
{
	const char *v = getenv(name);
	return v && *v ? atol(v) : 0;
}

static volatile long *map_count(const char *path, int create)
{
	int fd = open(path, create ? O_RDWR | O_CREAT | O_TRUNC : O_RDWR, 0600);
	void *p;

	if (fd < 0)
		return NULL;
	if (create && ftruncate(fd, 2 * sizeof(long)) != 0) {
		close(fd);
		return NULL;
	}
	p = mmap(NULL, 2 * sizeof(long), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	return p == MAP_FAILED ? NULL : p;
}

__attribute__((constructor)) static void instr_window_init(void)
{
	const char *v;

	real_write = (ssize_t(*)(int, const void *, size_t))dlsym(RTLD_NEXT, "write");
	from_bell = env_long("RDMA_INSTR_FROM");
	every = env_long("RDMA_INSTR_EVERY");
	until_bell = env_long("RDMA_INSTR_UNTIL");
	wait_us = env_long("RDMA_INSTR_WAIT_US");
	quiet_us = env_long("RDMA_INSTR_QUIET_US");
	peer_max = env_long("RDMA_INSTR_PEER_MAX");
	if ((v = getenv("RDMA_INSTR_COUNTER")) && *v)
		counter_fd = open(v, O_RDONLY);
	if ((v = getenv("RDMA_INSTR_PEER")) && *v)
		peer_bells = map_count(v, 0);
	if ((v = getenv("RDMA_INSTR_PUBLISH")) && *v)
		my_bells = map_count(v, 1);
}

static long sys4(long nr, long a, long b, long c, long d)
{
	register long r10 __asm__("r10") = d;
	long ret;

	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10)
			 : "rcx", "r11", "memory");
	return ret;
}

static long now_us(void)
{
	struct timespec ts;

	sys4(SYS_clock_gettime, CLOCK_MONOTONIC, (long)&ts, 0, 0);
	return ts.tv_sec * 1000000L + ts.tv_nsec / 1000;
}

static void pause_us(long us)
{
	struct timespec ts = { us / 1000000, (us % 1000000) * 1000 };

	/* EINTR: sleep the rest, which the kernel wrote back into ts. */
	while (sys4(SYS_nanosleep, (long)&ts, (long)&ts, 0, 0) == -4)
		;
}

/* The sysfs counter's value (-1 if it cannot be read). */
static long counter(void)
{
	char buf[32];
	long n = sys4(SYS_pread64, counter_fd, (long)buf, sizeof(buf), 0), v = 0;

	if (n <= 0)
		return -1;
	for (long i = 0; i < n && buf[i] >= '0' && buf[i] <= '9'; i++)
		v = v * 10 + (buf[i] - '0');
	return v;
}

/* After a doorbell, when the peer had rung `before` of its own: until the
 * exchange is over. */
static void wait_exchange(long before)
{
	long t0 = now_us(), t, last, still;

	if (peer_bells)
		while (peer_bells[1] <= before && (peer_max <= 0 || peer_bells[1] < peer_max) &&
		       now_us() - t0 < WAIT_CAP_US)
			pause_us(STEP_US);
	if (wait_us > 0)
		pause_us(wait_us);
	if (counter_fd < 0 || quiet_us <= 0)
		return;
	last = counter();
	still = now_us();
	for (t = still; t - still < quiet_us && t - t0 < WAIT_CAP_US; t = now_us()) {
		long c;

		pause_us(STEP_US);
		c = counter();
		if (c != last) {
			last = c;
			still = now_us();
		}
	}
}

ssize_t write(int fd, const void *buf, size_t n)
{
	const struct ib_uverbs_cmd_hdr *hdr = buf;
	int bell = n >= sizeof(*hdr) && hdr->command == IB_USER_VERBS_CMD_POST_SEND;
	long before = 0;
	ssize_t r;

	if (bell) {
		bells++;
		if (from_bell > 0 && every > 0 && bells >= from_bell && (until_bell <= 0 || bells <= until_bell) &&
		    (bells - from_bell) % every == 0)
			CALLGRIND_DUMP_STATS;
		if (my_bells)
			__atomic_store_n(&my_bells[0], bells, __ATOMIC_RELEASE);
		if (peer_bells)
			before = __atomic_load_n(&peer_bells[0], __ATOMIC_ACQUIRE);
	}
	r = real_write(fd, buf, n);
	if (bell && my_bells)
		__atomic_store_n(&my_bells[1], bells, __ATOMIC_RELEASE);
	if (bell && (peer_bells || wait_us > 0 || quiet_us > 0))
		wait_exchange(before);
	return r;
}
