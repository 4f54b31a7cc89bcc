/* The one read of a target's memory the C modules (_chunkwalk.c, _listscout.c) make: pread of
 * its /proc/PID/mem. Never process_vm_readv: that call pins the pages it reads, and a
 * read-only pin of an anonymous page the target shares copy-on-write with another process (a
 * forked server's heap) makes the kernel (Linux 5.19 and later) give the target a private
 * copy of the page first, so a read would grow the target's memory by the pages read.
 * /proc/PID/mem takes no pin and copies nothing in the target. */
#ifndef MEMFORENSICS_PROCMEM_READ_H
#define MEMFORENSICS_PROCMEM_READ_H

#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

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

#endif
