/* file.c — see file.h. The file is opened with O_NONBLOCK and checked with
 * fstat on the descriptor itself: opening a FIFO for reading blocks until a
 * writer comes, and a stat before the open would leave a window in which
 * the name could be swapped. Reads of a regular file ignore O_NONBLOCK. */
#include "file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "err.h"

static const char *file_kind(mode_t mode)
{
    if (S_ISDIR(mode))
        return "a directory";
    if (S_ISFIFO(mode))
        return "a FIFO";
    if (S_ISCHR(mode) || S_ISBLK(mode))
        return "a device";
    if (S_ISSOCK(mode))
        return "a socket";
    return "not a file";
}

/* moec_file_open; with `missing` not NULL, a path that does not exist sets
 * *missing and gives MOEC_OK. */
static moec_status file_open(const char *path, int *fd, size_t *size, int *missing)
{
    *fd = -1;
    *size = 0;
    int f = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (f < 0 && missing && errno == ENOENT) {
        *missing = 1;
        return MOEC_OK;
    }
    if (f < 0)
        return MOEC_ERR(MOEC_ERR_IO, "cannot open %s: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(f, &sb) != 0) {
        int e = errno;
        close(f);
        return MOEC_ERR(MOEC_ERR_IO, "cannot stat %s: %s", path, strerror(e));
    }
    if (!S_ISREG(sb.st_mode)) {
        close(f);
        return MOEC_ERR(MOEC_ERR_IO, "%s is not a regular file (it is %s)", path,
                        file_kind(sb.st_mode));
    }
    *fd = f;
    *size = (size_t)sb.st_size;
    return MOEC_OK;
}

moec_status moec_file_open(const char *path, int *fd, size_t *size)
{
    return file_open(path, fd, size, NULL);
}

static moec_status file_read(const char *path, size_t max, char **data, size_t *len,
                             int *missing)
{
    *data = NULL;
    *len = 0;
    int fd;
    size_t size;
    MOEC_TRY(file_open(path, &fd, &size, missing));
    if (fd < 0)
        return MOEC_OK;
    if (size > max) {
        close(fd);
        return MOEC_ERR(MOEC_ERR_FORMAT, "%s is %zu bytes, more than the %zu a file of its kind "
                        "may have", path, size, max);
    }
    char *buf = malloc(size + 1);
    if (!buf) {
        close(fd);
        return MOEC_ERR(MOEC_ERR_OOM, "out of memory reading %s (%zu bytes)", path, size);
    }
    size_t got = 0;
    while (got < size) { /* a file that shrank since fstat is read to its end */
        ssize_t k = read(fd, buf + got, size - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0) {
            int e = errno;
            free(buf);
            close(fd);
            return MOEC_ERR(MOEC_ERR_IO, "cannot read %s: %s", path, strerror(e));
        }
        if (k == 0)
            break;
        got += (size_t)k;
    }
    close(fd);
    buf[got] = '\0';
    *data = buf;
    *len = got;
    return MOEC_OK;
}

moec_status moec_file_read(const char *path, size_t max, char **data, size_t *len)
{
    return file_read(path, max, data, len, NULL);
}

moec_status moec_file_read_optional(const char *path, size_t max, char **data, size_t *len)
{
    int missing = 0;
    return file_read(path, max, data, len, &missing);
}

void moec_path_parent(const char *path, char *dir, size_t cap)
{
    const char *slash = strrchr(path, '/');
    if (!slash)
        snprintf(dir, cap, ".");
    else if (slash == path)
        snprintf(dir, cap, "/");
    else
        snprintf(dir, cap, "%.*s", (int)(slash - path), path);
}

int moec_path_in_folder(const char *path, const char *dir, char *name, size_t cap)
{
    struct stat out, in;
    if (!path || !dir || stat(path, &out) != 0 || !S_ISREG(out.st_mode))
        return 0;
    DIR *d = opendir(dir);
    if (!d) /* a folder that cannot be listed: its reader says so */
        return 0;
    int found = 0;
    for (struct dirent *e; !found && (e = readdir(d)) != NULL;) {
        found = fstatat(dirfd(d), e->d_name, &in, 0) == 0 && in.st_dev == out.st_dev &&
                in.st_ino == out.st_ino;
        if (found && name)
            snprintf(name, cap, "%s", e->d_name);
    }
    closedir(d);
    return found;
}

void moec_cleanup_on_signals(void (*handler)(int))
{
    static const int sigs[3] = {SIGINT, SIGTERM, SIGHUP};
    static struct sigaction before[3];
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    for (int k = 0; k < 3; k++) {
        if (!handler)
            sigaction(sigs[k], &before[k], NULL);
        else if (sigaction(sigs[k], NULL, &before[k]) == 0 && before[k].sa_handler != SIG_IGN)
            sigaction(sigs[k], &sa, NULL);
    }
}
