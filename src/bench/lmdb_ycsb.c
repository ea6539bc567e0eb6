/* A YCSB-like driver over LMDB (Debian liblmdb), for `winefs bench app`.
 *
 * Usage: lmdb_ycsb DIR RECORDS VALUE_SIZE OPS PHASES SEED
 *   PHASES is a string of letters run in order in one process, on one environment:
 *   L load RECORDS records; A 50% read / 50% update; B 95% read / 5% update; C read only;
 *   D 95% read of the latest records / 5% insert; F 50% read / 50% read-modify-write.
 *   Keys are chosen like YCSB's: scrambled zipfian (theta 0.99) for A, B, C and F, skewed
 *   latest for D; key names are "user" + FNV-1a of the record number.
 *
 * The environment is opened with MDB_WRITEMAP | MDB_NOSYNC: LMDB ftruncates data.mdb to the
 * map size and reads and writes records through one big shared mapping (the case the
 * mapping-heavy workloads stress). Every phase ends with mdb_env_sync(env, 1), inside the timing.
 * One operation is one transaction (a read-only transaction is reset and renewed).
 *
 * Output, one line per phase on standard output (parsed by src/bench/app.rs):
 *   phase=A ops=N secs=S ops_per_s=X minflt=N majflt=N
 * (page faults are getrusage(RUSAGE_SELF) deltas over the phase), after one line
 *   config records=N value_size=N ops=N seed=N mapsize=N
 * Errors: one line on standard error and exit status 1.
 */
#include <lmdb.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#define THETA 0.99
#define LOAD_BATCH 1000

static void die(const char *what, int rc) {
	fprintf(stderr, "lmdb_ycsb: %s: %s\n", what, mdb_strerror(rc));
	exit(1);
}

static uint64_t rng_state;

static uint64_t next_u64(void) {
	/* xorshift64* */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545F4914F6CDD1DULL;
}

static double next_unit(void) {
	return (double)(next_u64() >> 11) / (double)(1ULL << 53);
}

static uint64_t fnv64(uint64_t v) {
	uint64_t h = 0xCBF29CE484222325ULL;
	for (int i = 0; i < 8; i++) {
		h ^= v & 0xff;
		h *= 1099511628211ULL;
		v >>= 8;
	}
	return h;
}

/* YCSB's ZipfianGenerator over [0, n), with zeta extended incrementally as n grows. */
struct zipf {
	uint64_t n;
	double zetan, zeta2, alpha, eta;
};

static void zipf_grow(struct zipf *z, uint64_t n) {
	for (uint64_t i = z->n + 1; i <= n; i++)
		z->zetan += 1.0 / pow((double)i, THETA);
	z->n = n;
	z->eta = (1.0 - pow(2.0 / (double)n, 1.0 - THETA)) / (1.0 - z->zeta2 / z->zetan);
}

static void zipf_init(struct zipf *z, uint64_t n) {
	memset(z, 0, sizeof *z);
	z->zeta2 = 1.0 + 1.0 / pow(2.0, THETA);
	z->alpha = 1.0 / (1.0 - THETA);
	zipf_grow(z, n);
}

static uint64_t zipf_next(const struct zipf *z) {
	double u = next_unit();
	double uz = u * z->zetan;
	if (uz < 1.0)
		return 0;
	if (uz < 1.0 + pow(0.5, THETA))
		return 1;
	uint64_t v = (uint64_t)((double)z->n * pow(z->eta * u - z->eta + 1.0, z->alpha));
	return v >= z->n ? z->n - 1 : v;
}

static void key_of(uint64_t keynum, char *buf, MDB_val *k) {
	int len = snprintf(buf, 32, "user%020llu", (unsigned long long)fnv64(keynum));
	k->mv_data = buf;
	k->mv_size = (size_t)len;
}

static void fill_value(unsigned char *v, size_t size, uint64_t keynum, uint64_t version) {
	uint64_t x = fnv64(keynum ^ (version << 40)) | 1;
	for (size_t i = 0; i < size; i++) {
		x ^= x << 13;
		x ^= x >> 7;
		x ^= x << 17;
		v[i] = (unsigned char)x;
	}
}

static double now(void) {
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void faults(long *minflt, long *majflt) {
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	*minflt = ru.ru_minflt;
	*majflt = ru.ru_majflt;
}

static MDB_env *env;
static MDB_dbi dbi;
static MDB_txn *rtxn;
static size_t value_size;
static unsigned char *valbuf, *readbuf;
static uint64_t checksum;

static MDB_txn *begin_write(void) {
	MDB_txn *t;
	int rc = mdb_txn_begin(env, NULL, 0, &t);
	if (rc)
		die("begin a write transaction", rc);
	return t;
}

/* Store the value of (keynum, version), its first byte xor-ed with `mix`, inside `t`. */
static void put_in(MDB_txn *t, uint64_t keynum, uint64_t version, unsigned char mix) {
	MDB_val k, v;
	char kb[32];
	int rc;
	key_of(keynum, kb, &k);
	fill_value(valbuf, value_size, keynum, version);
	valbuf[0] ^= mix;
	v.mv_data = valbuf;
	v.mv_size = value_size;
	if ((rc = mdb_put(t, dbi, &k, &v, 0)))
		die("put", rc);
}

static void commit(MDB_txn *t) {
	int rc = mdb_txn_commit(t);
	if (rc)
		die("commit", rc);
}

/* Copy the value of keynum (read in `t`) out to readbuf. */
static void get_in(MDB_txn *t, uint64_t keynum) {
	MDB_val k, v;
	char kb[32];
	key_of(keynum, kb, &k);
	int rc = mdb_get(t, dbi, &k, &v);
	if (rc)
		die("get", rc);
	memcpy(readbuf, v.mv_data, v.mv_size < value_size ? v.mv_size : value_size);
	checksum += readbuf[0] + readbuf[value_size - 1];
}

static void put(uint64_t keynum, uint64_t version) {
	MDB_txn *t = begin_write();
	put_in(t, keynum, version, 0);
	commit(t);
}

static void get(uint64_t keynum) {
	int rc = mdb_txn_renew(rtxn);
	if (rc)
		die("renew a read transaction", rc);
	get_in(rtxn, keynum);
	mdb_txn_reset(rtxn);
}

/* Read, then write back a changed value, in one write transaction. */
static void read_modify_write(uint64_t keynum, uint64_t version) {
	MDB_txn *t = begin_write();
	get_in(t, keynum);
	put_in(t, keynum, version, readbuf[0]);
	commit(t);
}

static void load(uint64_t records) {
	MDB_txn *t = NULL;
	for (uint64_t i = 0; i < records; i++) {
		if (!t)
			t = begin_write();
		put_in(t, i, 0, 0);
		if ((i + 1) % LOAD_BATCH == 0 || i + 1 == records) {
			commit(t);
			t = NULL;
		}
	}
}

static unsigned long long arg(const char *s, const char *name) {
	char *end;
	unsigned long long v = strtoull(s, &end, 10);
	if (*s == '\0' || *end != '\0' || v == 0) {
		fprintf(stderr, "lmdb_ycsb: %s must be a positive integer, not \"%s\"\n", name, s);
		exit(1);
	}
	return v;
}

int main(int argc, char **argv) {
	if (argc != 7) {
		fprintf(stderr, "usage: lmdb_ycsb DIR RECORDS VALUE_SIZE OPS PHASES SEED\n");
		return 1;
	}
	const char *dir = argv[1];
	uint64_t records = arg(argv[2], "RECORDS");
	value_size = arg(argv[3], "VALUE_SIZE");
	uint64_t ops = arg(argv[4], "OPS");
	const char *phases = argv[5];
	uint64_t seed = arg(argv[6], "SEED");
	rng_state = fnv64(seed) | 1;
	valbuf = malloc(value_size);
	readbuf = malloc(value_size);
	if (!valbuf || !readbuf) {
		fprintf(stderr, "lmdb_ycsb: out of memory\n");
		return 1;
	}
	/* Room for the records at half-full pages, D's inserts, and copy-on-write slack. */
	uint64_t inserts = ops / 10 + 1;
	size_t mapsize = (size_t)((records + inserts) * (value_size + 64) * 5 / 2) + (64UL << 20);
	mapsize = (mapsize + (2UL << 20) - 1) & ~((2UL << 20) - 1);
	int rc;
	if ((rc = mdb_env_create(&env)))
		die("create the environment", rc);
	if ((rc = mdb_env_set_mapsize(env, mapsize)))
		die("set the map size", rc);
	if ((rc = mdb_env_open(env, dir, MDB_WRITEMAP | MDB_NOSYNC | MDB_NORDAHEAD, 0644)))
		die(dir, rc);
	MDB_txn *t = begin_write();
	if ((rc = mdb_dbi_open(t, NULL, 0, &dbi)))
		die("open the database", rc);
	commit(t);
	if ((rc = mdb_txn_begin(env, NULL, MDB_RDONLY, &rtxn)))
		die("begin a read transaction", rc);
	mdb_txn_reset(rtxn);
	printf("config records=%llu value_size=%zu ops=%llu seed=%llu mapsize=%zu\n",
	       (unsigned long long)records, value_size, (unsigned long long)ops,
	       (unsigned long long)seed, mapsize);
	fflush(stdout);

	struct zipf z;
	zipf_init(&z, records);
	uint64_t count = records; /* records present (D inserts more) */
	uint64_t version = 1;
	for (const char *p = phases; *p; p++) {
		long min0, maj0, min1, maj1;
		uint64_t done = 0;
		faults(&min0, &maj0);
		double t0 = now();
		switch (*p) {
		case 'L':
			load(records);
			done = records;
			break;
		case 'A':
		case 'B':
		case 'C':
		case 'F': {
			double reads = *p == 'A' || *p == 'F' ? 0.5 : *p == 'B' ? 0.95 : 1.0;
			for (; done < ops; done++) {
				uint64_t key = fnv64(zipf_next(&z)) % count;
				if (next_unit() < reads)
					get(key);
				else if (*p == 'F')
					read_modify_write(key, version++);
				else
					put(key, version++);
			}
			break;
		}
		case 'D':
			for (; done < ops; done++) {
				if (next_unit() < 0.95) {
					if (z.n != count)
						zipf_grow(&z, count);
					get(count - 1 - zipf_next(&z));
				} else {
					put(count++, 0);
				}
			}
			break;
		default:
			fprintf(stderr, "lmdb_ycsb: unknown phase '%c' (L, A, B, C, D or F)\n", *p);
			return 1;
		}
		if ((rc = mdb_env_sync(env, 1)))
			die("sync", rc);
		double secs = now() - t0;
		faults(&min1, &maj1);
		printf("phase=%c ops=%llu secs=%.6f ops_per_s=%.1f minflt=%ld majflt=%ld\n", *p,
		       (unsigned long long)done, secs, (double)done / (secs > 1e-9 ? secs : 1e-9),
		       min1 - min0, maj1 - maj0);
		fflush(stdout);
	}
	mdb_txn_abort(rtxn);
	mdb_env_close(env);
	fprintf(stderr, "lmdb_ycsb: checksum %llu\n", (unsigned long long)checksum);
	return 0;
}
