/* Run a program and report its resource use, for `winefs bench app`.
 *
 * Usage: app_run OUTFILE PRELOAD PROGRAM [ARGS...]
 *   Runs PROGRAM (searched in PATH) with LD_PRELOAD=PRELOAD set for it alone (PRELOAD "-":
 *   none), so this process itself never loads the library; waits for it with wait4 and writes
 *   one line to OUTFILE:
 *     status=N minflt=N majflt=N utime=S stime=S maxrss_kb=N
 *   (status: the exit status, or 128 + the signal). Exits with the same status.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

int main(int argc, char **argv) {
	if (argc < 4) {
		fprintf(stderr, "usage: app_run OUTFILE PRELOAD PROGRAM [ARGS...]\n");
		return 2;
	}
	pid_t pid = fork();
	if (pid < 0) {
		fprintf(stderr, "app_run: fork: %s\n", strerror(errno));
		return 2;
	}
	if (pid == 0) {
		if (strcmp(argv[2], "-") != 0 && setenv("LD_PRELOAD", argv[2], 1) != 0)
			_exit(127);
		execvp(argv[3], argv + 3);
		fprintf(stderr, "app_run: %s: %s\n", argv[3], strerror(errno));
		_exit(127);
	}
	int st;
	struct rusage ru;
	while (wait4(pid, &st, 0, &ru) < 0) {
		if (errno != EINTR) {
			fprintf(stderr, "app_run: wait4: %s\n", strerror(errno));
			return 2;
		}
	}
	int status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
	FILE *out = fopen(argv[1], "w");
	if (!out) {
		fprintf(stderr, "app_run: %s: %s\n", argv[1], strerror(errno));
		return 2;
	}
	fprintf(out, "status=%d minflt=%ld majflt=%ld utime=%ld.%06ld stime=%ld.%06ld maxrss_kb=%ld\n",
		status, ru.ru_minflt, ru.ru_majflt, (long)ru.ru_utime.tv_sec, (long)ru.ru_utime.tv_usec,
		(long)ru.ru_stime.tv_sec, (long)ru.ru_stime.tv_usec, ru.ru_maxrss);
	fclose(out);
	return status;
}
