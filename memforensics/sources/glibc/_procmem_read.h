/* How the C modules (_chunkwalk.c, _listscout.c) read a target's memory, and when they may
 * pin what they read.
 *
 * A read is a pread of the target's /proc/PID/mem, which takes no pin and copies nothing in the
 * target. process_vm_readv reads many scattered pages in one call (about twice the speed here,
 * a copy's stop that much shorter), but it pins each page it reads, and a read-only pin of an
 * anonymous page the target shares copy-on-write with another process (a forked server's
 * heap, a KSM-merged page) makes the kernel (Linux 5.19 and later) give the target a private
 * copy of the page first: a read would grow the target's memory by the pages read. So a page
 * goes through process_vm_readv only where its pagemap entry, read while every thread of the
 * target is held (no fork can share it meanwhile), says it is present and mapped by the
 * target alone (bit 56); a page mapped once but not yet marked exclusive is then made so by the
 * kernel without a copy. Everything else is read with pread. (Not excluded: a page mapped once
 * whose exclusive mark a fork cleared and which the kernel will not take back in place, a part
 * of a split transparent huge page, is still copied; that needs a heap in huge pages and a
 * child forked earlier that has since exited.) */
#ifndef MEMFORENSICS_PROCMEM_READ_H
#define MEMFORENSICS_PROCMEM_READ_H

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <unistd.h>

#define PM_PRESENT (1ULL << 63)
#define PM_EXCLUSIVE (1ULL << 56) /* "page exclusively mapped" (Linux 4.2 and later) */
#define PINNED_BATCH 512          /* runs per process_vm_readv (IOV_MAX is 1024) */

/* ``count`` entries of the pagemap ``fd`` from page number ``first`` into ``entries``: how many
 * were read (0 where none could be; a short read leaves the rest as they were). */
static size_t pagemap_read(int fd, uint64_t *entries, size_t count, uint64_t first) {
    ssize_t got;
    do
        got = pread(fd, entries, count * sizeof *entries, (off_t)(first * sizeof *entries));
    while (got < 0 && errno == EINTR);
    return got > 0 ? (size_t)got / sizeof *entries : 0;
}

/* A pagemap entry's page may be pinned by a held target's read: present and its alone. */
static int pinnable(uint64_t entry) {
    return (entry & PM_PRESENT) && (entry & PM_EXCLUSIVE);
}

/* [buf, buf + length) read from the target's address until done; what cannot be read (a page
 * unmapped meanwhile) reads as zeros. 1 when every byte was read. */
static int pread_fill(int fd, unsigned char *buf, size_t length, uint64_t address) {
    size_t done = 0;
    while (done < length) {
        ssize_t got = pread(fd, buf + done, length - done, (off_t)(address + done));
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            memset(buf + done, 0, length - done);
            return 0;
        }
        done += (size_t)got;
    }
    return 1;
}

/* Runs of pinnable pages queued for one process_vm_readv of many; pid 0: none is (pread). */
typedef struct {
    pid_t pid;
    int fd, complete;
    int runs;
    struct iovec local[PINNED_BATCH], remote[PINNED_BATCH];
} Pinned;

/* Read the queued runs. Where process_vm_readv stops short (a page unmapped meanwhile) the run
 * is finished with pread and the next runs are asked for again; where the call is refused
 * (EPERM under a seccomp policy, ENOSYS) pid turns 0 and pread reads the rest. */
static void pinned_flush(Pinned *pinned) {
    int first = 0;
    while (first < pinned->runs) {
        size_t got = 0;
        if (pinned->pid > 0) {
            ssize_t ret = process_vm_readv(pinned->pid, pinned->local + first,
                                           (unsigned long)(pinned->runs - first),
                                           pinned->remote + first,
                                           (unsigned long)(pinned->runs - first), 0);
            if (ret < 0 && errno != EFAULT) {
                pinned->pid = 0;
                continue;
            }
            got = ret < 0 ? 0 : (size_t)ret;
            while (first < pinned->runs && got >= pinned->local[first].iov_len) {
                got -= pinned->local[first].iov_len;
                first++;
            }
            if (first == pinned->runs) break;
        }
        unsigned char *at = pinned->local[first].iov_base;
        if (!pread_fill(pinned->fd, at + got, pinned->local[first].iov_len - got,
                        (uint64_t)(uintptr_t)pinned->remote[first].iov_base + got))
            pinned->complete = 0;
        first++;
    }
    pinned->runs = 0;
}

/* [buf, buf + length) from address: queued for process_vm_readv where pinned->pid > 0 (the
 * caller vouches for every page of it: pinnable() while the target is held), else read now. */
static void pinned_read(Pinned *pinned, unsigned char *buf, uint64_t address, size_t length) {
    if (pinned->pid <= 0) {
        if (!pread_fill(pinned->fd, buf, length, address)) pinned->complete = 0;
        return;
    }
    pinned->local[pinned->runs] = (struct iovec){buf, length};
    pinned->remote[pinned->runs] = (struct iovec){(void *)(uintptr_t)address, length};
    if (++pinned->runs == PINNED_BATCH) pinned_flush(pinned);
}

#endif
