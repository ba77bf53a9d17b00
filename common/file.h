/* file.h — opening the files moec reads (config.json, generation_config.json,
 * safetensors shards and their index, plan files): only regular files, and
 * never blocking on a FIFO or a device that stands in for one. */
#ifndef MOEC_COMMON_FILE_H
#define MOEC_COMMON_FILE_H

#include <stddef.h>

#include "moec.h"

/* Opens path read-only; MOEC_ERR_IO naming path when it cannot be opened or
 * is not a regular file. *fd (close it) and *size get the file. */
moec_status moec_file_open(const char *path, int *fd, size_t *size);
/* Reads the regular file path whole: *data (free it) gets its *len bytes
 * and a NUL after them. MOEC_ERR_FORMAT when it is larger than max bytes. */
moec_status moec_file_read(const char *path, size_t max, char **data, size_t *len);
/* moec_file_read for a file a folder may lack (generation_config.json):
 * when path does not exist, MOEC_OK with *data NULL. */
moec_status moec_file_read_optional(const char *path, size_t max, char **data, size_t *len);

/* The folder `path` names a file in: "." for a bare name, "/" for a file
 * at the root (into dir, cap bytes). */
void moec_path_parent(const char *path, char *dir, size_t cap);

/* 1 when path names an existing regular file that is also an entry of the
 * folder dir (the same device and inode: the same name, another spelling of
 * it, a hard or symbolic link), with the entry's name in name (cap bytes);
 * else 0. An output written there would overwrite one of dir's inputs. */
int moec_path_in_folder(const char *path, const char *dir, char *name, size_t cap);

/* handler (which removes a program's temporary files and dies of the
 * signal) on SIGINT, SIGTERM and SIGHUP; NULL puts back each signal's
 * disposition as it was before. A signal ignored at start (nohup's SIGHUP,
 * SIGINT of a background job) is left ignored. */
void moec_cleanup_on_signals(void (*handler)(int));

/* Configs are a few kB; anything past 16 MiB is not one. */
#define MOEC_FILE_CONFIG_MAX ((size_t)16 << 20)

#endif
