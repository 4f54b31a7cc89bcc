"""The x86-64 general registers as ptrace lays them out (struct user_regs_struct).

Shared by the guardian (which reads and writes them with ctypes, in the watchdog) and the
session (which tells the watchdog their values), without the session importing ctypes.
"""

# struct user_regs_struct, in order.
USER_REGS = (
    "r15",
    "r14",
    "r13",
    "r12",
    "rbp",
    "rbx",
    "r11",
    "r10",
    "r9",
    "r8",
    "rax",
    "rcx",
    "rdx",
    "rsi",
    "rdi",
    "orig_rax",
    "rip",
    "cs",
    "eflags",
    "rsp",
    "ss",
    "fs_base",
    "gs_base",
    "ds",
    "es",
    "fs",
    "gs",
)
