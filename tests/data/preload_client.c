/* An ordinary program for tests/preload.rs: it maps, reads and writes files with plain libc
 * calls, knowing nothing of winefs; the tests run it with and without libwinefs_preload.so.
 *
 *   fill FILE MIB SEED      create/extend to MIB MiB, map shared, store the pattern, msync;
 *                           prints "faults N"
 *   check FILE MIB SEED     map shared read-only and compare with the pattern; exit 1 if not
 *   pio FILE SEED           pwrite/pread a few blocks of a file that is mapped (direct path
 *                           inside the mapping), then read(2)/write(2) at the file offset
 *   fork FILE               map 4 MiB shared, fork; the child stores, the parent checks
 *   rw FILE SEED            no mapping: write 1 MiB, then pwrite/pread 4 KiB pieces in place
 *                           (the library leases the file for these after the first) and
 *                           compare; then read a sparse 64 MiB file; prints its blocks
 *   grow FILE               LMDB's pattern: a read-only map past the end, the file grown
 *                           with pwritev, pages read through the map, then overwritten with
 *                           pwrite: the map must show the new bytes
 *   append FILE N SEED      RocksDB's WAL pattern: N records of 1..300 bytes appended with
 *                           write(2) to a write-only descriptor (the library appends them
 *                           directly); every 1000 records fstat and stat must show the size
 *                           and "progress BYTES" is printed (after every record with a 5th
 *                           argument "every"); then another descriptor with
 *                           O_APPEND (through FUSE) adds "TAIL" at the true end; fdatasync,
 *                           close, read everything back with read(2) and compare; prints
 *                           "appended BYTES"
 *   tappend FILE            4 threads write(2) 20000 records of 64 bytes each to one shared
 *                           descriptor (each write claims its own range of the offset) while
 *                           a fifth reads at its offset; the file must hold every record
 *                           exactly once; prints "records N"
 *   shrink FILE             map 8 MiB shared and fill it, then through the same descriptor
 *                           punch a hole, zero a range (FALLOC_FL_ZERO_RANGE), punch a few
 *                           bytes, truncate to 6 MiB and back to 8: after each the mapping
 *                           must read zeros there (as a kernel mapping does); a store
 *                           through the mapping after that must reach read(2); munmap with
 *                           a length that is not a multiple of the page, then fsync; prints
 *                           each failure and exits 1 if any
 *   hold FILE MIB           map shared (read-write) and serve stdin: "r OFF" prints the byte,
 *                           "w OFF BYTE" stores it, "s OFF LEN" prints the sum of a range,
 *                           "q" exits; prints "ready" once mapped
 */
#define _GNU_SOURCE /* fallocate and its modes */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

static unsigned char pat(size_t i, unsigned seed) {
    return (unsigned char)((i / 4096) * 7 + (i % 4096) * 13 + seed);
}

static long faults(void) {
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_minflt + u.ru_majflt;
}

static int fill(const char *path, size_t mib, unsigned seed) {
    size_t len = mib << 20;
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)len)) { perror(path); return 2; }
    long f0 = faults();
    unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 2; }
    for (size_t i = 0; i < len; i++) p[i] = pat(i, seed);
    long f = faults() - f0;
    if (msync(p, len, MS_SYNC)) { perror("msync"); return 2; }
    munmap(p, len);
    close(fd);
    printf("faults %ld\n", f);
    return 0;
}

static int check(const char *path, size_t mib, unsigned seed) {
    size_t len = mib << 20;
    int fd = open(path, O_RDONLY);
    if (fd < 0) { perror(path); return 2; }
    unsigned char *p = mmap(NULL, len, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 2; }
    for (size_t i = 0; i < len; i++)
        if (p[i] != pat(i, seed)) { printf("differs at %zu: %d, not %d\n", i, p[i], pat(i, seed)); return 1; }
    munmap(p, len);
    close(fd);
    printf("same\n");
    return 0;
}

static int pio(const char *path, unsigned seed) {
    size_t len = 4 << 20;
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)len)) { perror(path); return 2; }
    unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 2; }
    unsigned char buf[8192], back[8192];
    for (int k = 0; k < 8; k++) {
        off_t off = (off_t)k * 300000 + 17;
        for (size_t i = 0; i < sizeof buf; i++) buf[i] = pat(i + (size_t)off, seed);
        if (pwrite(fd, buf, sizeof buf, off) != (ssize_t)sizeof buf) { perror("pwrite"); return 2; }
        if (memcmp(p + off, buf, sizeof buf)) { printf("pwrite not seen through the mapping\n"); return 1; }
        memset(back, 0, sizeof back);
        if (pread(fd, back, sizeof back, off) != (ssize_t)sizeof back) { perror("pread"); return 2; }
        if (memcmp(back, buf, sizeof buf)) { printf("pread differs\n"); return 1; }
    }
    /* read/write at the file offset, and reads at and past the end of the file. */
    if (lseek(fd, 4096, SEEK_SET) != 4096) { perror("lseek"); return 2; }
    memset(buf, 'x', 100);
    if (write(fd, buf, 100) != 100) { perror("write"); return 2; }
    if (lseek(fd, 0, SEEK_CUR) != 4196) { printf("write left the offset at %ld\n", (long)lseek(fd, 0, SEEK_CUR)); return 1; }
    if (p[4096] != 'x' || p[4195] != 'x') { printf("write not seen through the mapping\n"); return 1; }
    lseek(fd, 4096, SEEK_SET);
    if (read(fd, back, 100) != 100 || memcmp(back, buf, 100) || lseek(fd, 0, SEEK_CUR) != 4196) {
        printf("read at the offset differs\n");
        return 1;
    }
    if (pread(fd, back, 100, (off_t)len - 10) != 10) { printf("pread across the end is not short\n"); return 1; }
    if (pread(fd, back, 100, (off_t)len) != 0) { printf("pread at the end is not 0\n"); return 1; }
    /* Growing the file goes through the daemon; the mapping's next part becomes direct. */
    if (pwrite(fd, buf, 100, (off_t)len) != 100) { perror("pwrite past the end"); return 2; }
    munmap(p, len);
    close(fd);
    printf("ok\n");
    return 0;
}

static int forked(const char *path) {
    size_t len = 4 << 20;
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0 || ftruncate(fd, (off_t)len)) { perror(path); return 2; }
    unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 2; }
    memset(p, 1, len);
    pid_t c = fork();
    if (c == 0) {
        for (size_t i = 0; i < len; i += 4096) p[i] = 2;
        munmap(p, len); /* the child's unmap must not end the parent's mapping */
        _exit(0);
    }
    int st;
    waitpid(c, &st, 0);
    for (size_t i = 0; i < len; i += 4096)
        if (p[i] != 2) { printf("the child's store at %zu is not seen\n", i); return 1; }
    /* Still mapped and usable after the child unmapped and exited. */
    memset(p, 3, len);
    munmap(p, len);
    unsigned char b;
    if (pread(fd, &b, 1, (off_t)len - 1) != 1 || b != 3) { printf("the parent's stores are lost\n"); return 1; }
    close(fd);
    printf("ok\n");
    return 0;
}

static int rw(const char *path, unsigned seed) {
    size_t len = 1 << 20;
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { perror(path); return 2; }
    unsigned char *img = malloc(len), buf[4096];
    for (size_t i = 0; i < len; i++) img[i] = pat(i, seed);
    if (write(fd, img, len) != (ssize_t)len) { perror("write"); return 2; }
    unsigned r = seed;
    for (int k = 0; k < 200; k++) {
        r = r * 1103515245 + 12345;
        off_t off = (off_t)((r >> 4) % (len - sizeof buf));
        for (size_t i = 0; i < sizeof buf; i++) buf[i] = (unsigned char)(k + i);
        if (pwrite(fd, buf, sizeof buf, off) != (ssize_t)sizeof buf) { perror("pwrite"); return 2; }
        memcpy(img + off, buf, sizeof buf);
        off_t at = (off_t)((r >> 8) % (len - sizeof buf));
        if (pread(fd, buf, sizeof buf, at) != (ssize_t)sizeof buf) { perror("pread"); return 2; }
        if (memcmp(buf, img + at, sizeof buf)) { printf("pread at %ld differs\n", (long)at); return 1; }
    }
    close(fd);
    char sparse[4096];
    snprintf(sparse, sizeof sparse, "%s.sparse", path);
    fd = open(sparse, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, 64 << 20)) { perror(sparse); return 2; }
    for (int k = 0; k < 3; k++)
        if (pread(fd, buf, sizeof buf, (off_t)k << 24) != (ssize_t)sizeof buf || buf[0] || buf[4095]) {
            printf("the sparse file does not read as zeros\n");
            return 1;
        }
    struct stat st;
    fstat(fd, &st);
    close(fd);
    printf("blocks %ld\n", (long)st.st_blocks);
    return 0;
}

static int grow(const char *path) {
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { perror(path); return 2; }
    unsigned char a[4096], b[4096 * 4];
    memset(a, 1, sizeof a);
    if (pwrite(fd, a, sizeof a, 0) != (ssize_t)sizeof a || pwrite(fd, a, sizeof a, 4096) != (ssize_t)sizeof a) {
        perror("pwrite");
        return 2;
    }
    unsigned char *p = mmap(NULL, 16 << 20, PROT_READ, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 2; }
    for (int round = 0; round < 3; round++) {
        off_t end = 8192 + (off_t)round * sizeof b;
        memset(b, 10 + round, sizeof b);
        struct iovec iov = { b, sizeof b };
        if (pwritev(fd, &iov, 1, end) != (ssize_t)sizeof b) { perror("pwritev"); return 2; }
        if (p[end] != 10 + round || p[end + sizeof b - 1] != 10 + round) { printf("growth not seen\n"); return 1; }
        memset(a, 100 + round, sizeof a);
        if (pwrite(fd, a, sizeof a, end + 4096) != (ssize_t)sizeof a) { perror("pwrite"); return 2; }
        if (p[end + 4096] != 100 + round) {
            printf("round %d: the map shows %d at %ld after a pwrite of %d\n", round, p[end + 4096], (long)end + 4096, 100 + round);
            return 1;
        }
        unsigned char back[4096];
        if (pread(fd, back, sizeof back, end + 4096) != (ssize_t)sizeof back || back[0] != 100 + round) {
            printf("pread differs\n");
            return 1;
        }
    }
    munmap(p, 16 << 20);
    close(fd);
    printf("ok\n");
    return 0;
}

static int append(const char *path, long n, unsigned seed, int every) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) { perror(path); return 2; }
    unsigned char rec[300];
    size_t total = 0;
    unsigned r = seed;
    for (long k = 0; k < n; k++) {
        r = r * 1103515245 + 12345;
        size_t len = 1 + (r >> 8) % sizeof rec;
        for (size_t i = 0; i < len; i++) rec[i] = pat(total + i, seed);
        for (size_t done = 0; done < len;) { /* a full pool may take part of a write first */
            ssize_t k = write(fd, rec + done, len - done);
            if (k <= 0) { perror("write"); return 2; }
            done += (size_t)k;
            total += (size_t)k;
        }
        if (k % 1000 == 999) {
            struct stat a, b;
            if (fstat(fd, &a) || stat(path, &b)) { perror("stat"); return 2; }
            if ((size_t)a.st_size != total || (size_t)b.st_size != total) {
                printf("after %zu bytes fstat says %ld and stat %ld\n", total, (long)a.st_size, (long)b.st_size);
                return 1;
            }
        }
        if (every || k % 1000 == 999) {
            printf("progress %zu\n", total);
            fflush(stdout);
        }
    }
    int fa = open(path, O_WRONLY | O_APPEND);
    if (fa < 0 || write(fa, "TAIL", 4) != 4) { perror("append"); return 2; }
    close(fa);
    if (fdatasync(fd)) { perror("fdatasync"); return 2; }
    close(fd);
    fd = open(path, O_RDONLY);
    unsigned char *back = malloc(total + 4096);
    size_t got = 0;
    ssize_t k;
    while ((k = read(fd, back + got, 4096)) > 0) got += (size_t)k;
    close(fd);
    if (got != total + 4 || memcmp(back + total, "TAIL", 4)) {
        printf("read back %zu bytes, wanted %zu and TAIL\n", got, total + 4);
        return 1;
    }
    for (size_t i = 0; i < total; i++)
        if (back[i] != pat(i, seed)) { printf("byte %zu differs\n", i); return 1; }
    printf("appended %zu\n", total);
    return 0;
}

#define TA_THREADS 4
#define TA_RECORDS 20000
static int ta_fd;

static void *ta_writer(void *arg) {
    unsigned t = (unsigned)(uintptr_t)arg;
    unsigned char rec[64];
    for (unsigned k = 0; k < TA_RECORDS; k++) {
        memset(rec, (int)(t * 31 + k), sizeof rec);
        memcpy(rec, &t, 4);
        memcpy(rec + 4, &k, 4);
        if (write(ta_fd, rec, sizeof rec) != (ssize_t)sizeof rec) { perror("write"); exit(2); }
    }
    return NULL;
}

static volatile int ta_done;

/* Reads at the shared offset while the writers append: at the end of the file each read finds
 * nothing and must leave the offset where the writers put it. */
static void *ta_reader(void *arg) {
    (void)arg;
    unsigned char buf[64];
    while (!ta_done)
        if (read(ta_fd, buf, sizeof buf) < 0) { perror("read"); exit(2); }
    return NULL;
}

static int tappend(const char *path) {
    ta_fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (ta_fd < 0) { perror(path); return 2; }
    pthread_t th[TA_THREADS], rd;
    pthread_create(&rd, NULL, ta_reader, NULL);
    for (uintptr_t t = 0; t < TA_THREADS; t++) pthread_create(&th[t], NULL, ta_writer, (void *)t);
    for (int t = 0; t < TA_THREADS; t++) pthread_join(th[t], NULL);
    ta_done = 1;
    pthread_join(rd, NULL);
    if (fdatasync(ta_fd)) { perror("fdatasync"); return 2; }
    close(ta_fd);
    size_t want = (size_t)TA_THREADS * TA_RECORDS * 64;
    unsigned char *back = malloc(want + 64);
    int fd = open(path, O_RDONLY);
    size_t got = 0;
    ssize_t k;
    while ((k = read(fd, back + got, want + 64 - got)) > 0) got += (size_t)k;
    close(fd);
    if (got != want) { printf("the file holds %zu bytes, wanted %zu\n", got, want); return 1; }
    unsigned char *seen = calloc((size_t)TA_THREADS * TA_RECORDS, 1);
    for (size_t at = 0; at < got; at += 64) {
        unsigned t, r;
        memcpy(&t, back + at, 4);
        memcpy(&r, back + at + 4, 4);
        if (t >= TA_THREADS || r >= TA_RECORDS || seen[t * TA_RECORDS + r]++) {
            printf("a torn or repeated record at %zu\n", at);
            return 1;
        }
        for (int i = 8; i < 64; i++)
            if (back[at + i] != (unsigned char)(t * 31 + r)) { printf("record at %zu is torn\n", at); return 1; }
    }
    printf("records %d\n", TA_THREADS * TA_RECORDS);
    return 0;
}

static int hold(const char *path, size_t mib) {
    size_t len = mib << 20;
    int fd = open(path, O_RDWR | O_CREAT, 0644);
    if (fd < 0) { perror(path); return 2; }
    unsigned char *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 2; }
    close(fd); /* the mapping alone keeps the file */
    printf("ready\n");
    fflush(stdout);
    char line[128];
    while (fgets(line, sizeof line, stdin)) {
        unsigned long off, n;
        unsigned v;
        if (sscanf(line, "r %lu", &off) == 1) {
            printf("%u\n", p[off]);
        } else if (sscanf(line, "w %lu %u", &off, &v) == 2) {
            p[off] = (unsigned char)v;
            printf("done\n");
        } else if (sscanf(line, "s %lu %lu", &off, &n) == 2) {
            unsigned long long s = 0;
            for (unsigned long i = 0; i < n; i++) s += p[off + i];
            printf("%llu\n", s);
        } else if (line[0] == 'q') {
            break;
        }
        fflush(stdout);
    }
    return 0;
}

static int any_nonzero(const unsigned char *p, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (p[i]) return 1;
    return 0;
}

static int shrink(const char *path) {
    const size_t mib = 1 << 20, sz = 8 * mib;
    int bad = 0;
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 || ftruncate(fd, sz)) { perror("open/ftruncate"); return 1; }
    unsigned char *m = mmap(NULL, sz, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) { perror("mmap"); return 1; }
    memset(m, 0xab, sz);
    if (msync(m, sz, MS_SYNC)) { perror("msync"); return 1; }
    struct { const char *what; int mode; off_t off, len; } cuts[] = {
        {"punch hole", FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, mib, mib},
        {"zero range", FALLOC_FL_ZERO_RANGE, 3 * mib, mib},
        {"small punch", FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, 5 * mib + 100, 10000},
    };
    for (size_t i = 0; i < sizeof cuts / sizeof cuts[0]; i++) {
        if (fallocate(fd, cuts[i].mode, cuts[i].off, cuts[i].len)) {
            printf("%s: %s\n", cuts[i].what, strerror(errno));
            bad++;
        } else if (any_nonzero(m + cuts[i].off, cuts[i].len)) {
            printf("%s: the mapping still shows the old bytes\n", cuts[i].what);
            bad++;
        }
        if (m[cuts[i].off - 1] != 0xab || m[cuts[i].off + cuts[i].len] != 0xab) {
            printf("%s: bytes around the range changed\n", cuts[i].what);
            bad++;
        }
    }
    if (ftruncate(fd, 6 * mib) || ftruncate(fd, sz)) {
        printf("truncate: %s\n", strerror(errno));
        bad++;
    } else if (any_nonzero(m + 6 * mib, 2 * mib)) {
        printf("truncate: the grown part shows the old bytes through the mapping\n");
        bad++;
    }
    memcpy(m + 7 * mib + 3, "stored", 6);
    char buf[6];
    if (pread(fd, buf, 6, 7 * mib + 3) != 6 || memcmp(buf, "stored", 6)) {
        printf("truncate: a store through the mapping after it did not reach the file\n");
        bad++;
    }
    /* The kernel unmaps whole pages: nothing of the last page may stay behind to be written
     * back by fsync. */
    if (munmap(m + 4096, sz - 4096 - 333) || fsync(fd)) { perror("munmap/fsync"); bad++; }
    munmap(m, 4096);
    close(fd);
    return bad != 0;
}

int main(int argc, char **argv) {
    if (argc >= 5 && !strcmp(argv[1], "fill")) return fill(argv[2], strtoul(argv[3], 0, 10), strtoul(argv[4], 0, 10));
    if (argc >= 5 && !strcmp(argv[1], "check")) return check(argv[2], strtoul(argv[3], 0, 10), strtoul(argv[4], 0, 10));
    if (argc >= 4 && !strcmp(argv[1], "pio")) return pio(argv[2], strtoul(argv[3], 0, 10));
    if (argc >= 3 && !strcmp(argv[1], "fork")) return forked(argv[2]);
    if (argc >= 3 && !strcmp(argv[1], "grow")) return grow(argv[2]);
    if (argc >= 4 && !strcmp(argv[1], "rw")) return rw(argv[2], strtoul(argv[3], 0, 10));
    if (argc >= 5 && !strcmp(argv[1], "append")) return append(argv[2], strtol(argv[3], 0, 10), strtoul(argv[4], 0, 10), argc >= 6);
    if (argc >= 3 && !strcmp(argv[1], "tappend")) return tappend(argv[2]);
    if (argc >= 4 && !strcmp(argv[1], "hold")) return hold(argv[2], strtoul(argv[3], 0, 10));
    if (argc >= 3 && !strcmp(argv[1], "shrink")) return shrink(argv[2]);
    fprintf(stderr, "usage: see the comment at the top of preload_client.c\n");
    return 2;
}
