/* The floor of a 2-rank allreduce over TCP on loopback: two processes, one TCP connection
 * (TCP_NODELAY, non-blocking), and per iteration the least any library can do for a small
 * allreduce of 2 ranks: each side sends one frame to the other and busy-polls recv(2) until
 * the other's frame is in. Timed as the baseline harnesses time an allreduce (an untimed
 * exchange as the barrier, then t0, the exchange, t1; per iteration the max of the two
 * sides; median / min / mean / p90), and printed in their row format.
 *
 * Build: cc -O2 -std=c99 tcp_exchange_floor.c -o tcp_exchange_floor
 * Usage: tcp_exchange_floor [-s FRAME_BYTES[,...]] [-n ITERS] [-w WARMUP]
 *   FRAME_BYTES: bytes on the wire per message (BCL's 8 B allreduce sends a 16 B frame header,
 *   a 28 B signature bundle and the 8 B payload: 52).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void die(const char *what) { perror(what); exit(1); }

static void send_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n <= 0) die("send");
        p += n; len -= (size_t)n;
    }
}

/* Busy-poll recv(2) until len bytes are in. */
static void recv_all(int fd, void *buf, size_t len) {
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (n <= 0) die("recv");
        p += n; len -= (size_t)n;
    }
}

static void exchange(int fd, char *out, char *in, size_t len) {
    send_all(fd, out, len);
    recv_all(fd, in, len);
}

static int cmpd(const void *x, const void *y) { double a = *(const double *)x, b = *(const double *)y; return (a > b) - (a < b); }

static void pin(int cpu) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (cpus < 2) return;
    cpu_set_t set; CPU_ZERO(&set); CPU_SET(cpu % (int)cpus, &set);
    sched_setaffinity(0, sizeof set, &set);
}

int main(int argc, char **argv) {
    const char *sizes_str = "52"; int iters = 20000, warm = 1000, c;
    while ((c = getopt(argc, argv, "s:n:w:")) != -1) {
        switch (c) {
        case 's': sizes_str = optarg; break;
        case 'n': iters = atoi(optarg); break;
        case 'w': warm = atoi(optarg); break;
        default: fprintf(stderr, "usage: %s [-s FRAME_BYTES,...] [-n ITERS] [-w WARMUP]\n", argv[0]); return 2;
        }
    }
    if (iters < 1) iters = 1;
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    if (lfd < 0) die("socket");
    struct sockaddr_in a; memset(&a, 0, sizeof a);
    a.sin_family = AF_INET; a.sin_addr.s_addr = htonl(INADDR_LOOPBACK); a.sin_port = 0;
    socklen_t al = sizeof a;
    if (bind(lfd, (struct sockaddr *)&a, sizeof a) || listen(lfd, 1) || getsockname(lfd, (struct sockaddr *)&a, &al)) die("listen");
    pid_t child = fork();
    if (child < 0) die("fork");
    int rank = child == 0 ? 1 : 0, fd;
    pin(rank);
    if (rank == 1) {
        fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a)) die("connect");
    } else {
        fd = accept(lfd, NULL, NULL);
        if (fd < 0) die("accept");
    }
    close(lfd);
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one)) die("TCP_NODELAY");
    double *tl = malloc(sizeof(double) * iters), *peer = malloc(sizeof(double) * iters);
    char out[1 << 16], in[1 << 16];
    memset(out, rank + 1, sizeof out);
    if (rank == 0) {
        printf("# label=tcp-floor ranks=2 one TCP connection on 127.0.0.1, busy-polled recv(2); iters=%d warm=%d\n", iters, warm);
        printf("%12s %10s %6s %12s %12s %12s %12s %11s %11s %5s\n", "frame_B", "count", "iters", "median_us", "min_us", "mean_us", "p90_us", "algbw_GB/s", "busbw_GB/s", "ok");
        fflush(stdout);
    }
    char *dup = strdup(sizes_str), *save = NULL;
    for (char *tok = strtok_r(dup, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        size_t len = (size_t)atol(tok);
        if (len == 0 || len > sizeof out) { fprintf(stderr, "frame size %s out of range 1..%zu\n", tok, sizeof out); return 2; }
        for (int w = 0; w < warm; w++) exchange(fd, out, in, len);
        for (int it = 0; it < iters; it++) {
            exchange(fd, out, in, len); /* the barrier */
            double t0 = now();
            exchange(fd, out, in, len);
            tl[it] = now() - t0;
        }
        int ok = in[0] == (char)(2 - rank) && in[len - 1] == (char)(2 - rank);
        /* per iteration, the max of both sides (the slower side completes the exchange) */
        send_all(fd, tl, sizeof(double) * iters);
        recv_all(fd, peer, sizeof(double) * iters);
        if (rank == 0) {
            double sum = 0;
            for (int it = 0; it < iters; it++) { if (peer[it] > tl[it]) tl[it] = peer[it]; sum += tl[it]; }
            qsort(tl, iters, sizeof(double), cmpd);
            double med = (iters % 2) ? tl[iters / 2] : 0.5 * (tl[iters / 2 - 1] + tl[iters / 2]);
            double p90 = tl[(int)(0.9 * (iters - 1))];
            printf("%12zu %10d %6d %12.2f %12.2f %12.2f %12.2f %11.3f %11.3f %5s\n", len, 1, iters, med * 1e6, tl[0] * 1e6,
                   sum / iters * 1e6, p90 * 1e6, len / med / 1e9, len / med / 1e9, ok ? "ok" : "FAIL");
            fflush(stdout);
        }
    }
    free(dup); free(tl); free(peer);
    close(fd);
    if (rank == 0) { int st; waitpid(child, &st, 0); return WIFEXITED(st) ? WEXITSTATUS(st) : 1; }
    return 0;
}
