"""The seccomp filter of a local sandbox, as the classic-BPF program `bwrap --seccomp FD` loads.

It denies what Docker's default profile denies that a process without capabilities could still
reach, or that widens the kernel's attack surface: mounts (old and new API), namespaces (unshare,
setns, clone with a CLONE_NEW* flag; clone3, whose flags the filter cannot read, answers ENOSYS so
that libc falls back to clone), ptrace and reading other processes' memory or fds, kernel modules,
kexec, bpf, perf events, userfaultfd, io_uring, the kernel keyring, swap, reboot, the clock,
quotas, accounting, file handles, port I/O, `ioctl(TIOCSTI)` (typing into a terminal) and
personality flags other than the few programs use. The architecture is checked first: only the
machine's own calling convention passes (a 32-bit or x32 call would use other numbers).

Built here from struct-packed `sock_filter`s, so it needs no libseccomp.
"""

from __future__ import annotations

import errno
import os
import platform
import struct
from dataclasses import dataclass

# linux/bpf_common.h
BPF_LD, BPF_JMP, BPF_RET = 0x00, 0x05, 0x06
BPF_W, BPF_ABS, BPF_K = 0x00, 0x20, 0x00
BPF_JEQ, BPF_JGE, BPF_JSET = 0x10, 0x30, 0x40
# linux/seccomp.h
SECCOMP_RET_KILL_PROCESS = 0x80000000
SECCOMP_RET_ERRNO = 0x00050000
SECCOMP_RET_ALLOW = 0x7FFF0000
# struct seccomp_data: int nr; __u32 arch; __u64 instruction_pointer; __u64 args[6] (little-endian
# on both architectures below, so an argument's low 32 bits are at 16 + 8 * i)
NR_OFFSET, ARCH_OFFSET, ARGS_OFFSET = 0, 4, 16

X32_SYSCALL_BIT = 0x40000000
TIOCSTI = 0x5412
# CLONE_NEWNS, CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER, CLONE_NEWPID, CLONE_NEWNET,
# CLONE_NEWTIME
NAMESPACE_FLAGS = (
    0x00020000 | 0x02000000 | 0x04000000 | 0x08000000 | 0x10000000 | 0x20000000 | 0x40000000 | 0x80
)
# What programs ask personality() for: the default, UNAME26 and ADDR_NO_RANDOMIZE (setarch -R), and a query.
PERSONALITIES = (0x0, 0x0008, 0x20000, 0x20008, 0xFFFFFFFF)

DENIED = (
    "mount",
    "umount2",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
    "pivot_root",
    "chroot",
    "setns",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "pidfd_getfd",
    "kcmp",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "keyctl",
    "add_key",
    "request_key",
    "swapon",
    "swapoff",
    "reboot",
    "sethostname",
    "setdomainname",
    "settimeofday",
    "clock_settime",
    "clock_adjtime",
    "quotactl",
    "quotactl_fd",
    "acct",
    "syslog",
    "name_to_handle_at",
    "open_by_handle_at",
    "lookup_dcookie",
    "nfsservctl",
    "vhangup",
    # x86_64 only
    "iopl",
    "ioperm",
    "create_module",
    "get_kernel_syms",
    "query_module",
    "uselib",
    "ustat",
    "sysfs",
    "_sysctl",
)


@dataclass(frozen=True)
class Arch:
    audit: int  # AUDIT_ARCH_*, as seccomp_data.arch gives it
    numbers: dict[str, int]
    x32: bool = False  # whether syscall numbers with X32_SYSCALL_BIT reach this arch's table


# <asm/unistd_64.h>
X86_64 = Arch(
    audit=0xC000003E,
    x32=True,
    numbers={
        "ioctl": 16, "clone": 56, "ptrace": 101, "syslog": 103, "uselib": 134, "personality": 135,
        "ustat": 136, "sysfs": 139, "vhangup": 153, "pivot_root": 155, "_sysctl": 156, "chroot": 161,
        "acct": 163, "settimeofday": 164, "mount": 165, "umount2": 166, "swapon": 167, "swapoff": 168,
        "reboot": 169, "sethostname": 170, "setdomainname": 171, "iopl": 172, "ioperm": 173,
        "create_module": 174, "init_module": 175, "delete_module": 176, "get_kernel_syms": 177,
        "query_module": 178, "quotactl": 179, "nfsservctl": 180, "lookup_dcookie": 212,
        "clock_settime": 227, "kexec_load": 246, "add_key": 248, "request_key": 249, "keyctl": 250,
        "unshare": 272, "perf_event_open": 298, "name_to_handle_at": 303, "open_by_handle_at": 304,
        "clock_adjtime": 305, "setns": 308, "process_vm_readv": 310, "process_vm_writev": 311,
        "kcmp": 312, "finit_module": 313, "kexec_file_load": 320, "bpf": 321, "userfaultfd": 323,
        "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427, "open_tree": 428,
        "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432, "fspick": 433,
        "clone3": 435, "pidfd_getfd": 438, "mount_setattr": 442, "quotactl_fd": 443,
    },
)  # fmt: skip
# <asm-generic/unistd.h>
AARCH64 = Arch(
    audit=0xC00000B7,
    numbers={
        "lookup_dcookie": 18, "ioctl": 29, "umount2": 39, "mount": 40, "pivot_root": 41,
        "nfsservctl": 42, "chroot": 51, "vhangup": 58, "quotactl": 60, "acct": 89, "personality": 92,
        "unshare": 97, "kexec_load": 104, "init_module": 105, "delete_module": 106,
        "clock_settime": 112, "syslog": 116, "ptrace": 117, "reboot": 142, "sethostname": 161,
        "setdomainname": 162, "settimeofday": 170, "add_key": 217, "request_key": 218, "keyctl": 219,
        "clone": 220, "swapon": 224, "swapoff": 225, "perf_event_open": 241, "name_to_handle_at": 264,
        "open_by_handle_at": 265, "clock_adjtime": 266, "setns": 268, "process_vm_readv": 270,
        "process_vm_writev": 271, "kcmp": 272, "finit_module": 273, "bpf": 280, "userfaultfd": 282,
        "kexec_file_load": 294, "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427,
        "open_tree": 428, "move_mount": 429, "fsopen": 430, "fsconfig": 431, "fsmount": 432,
        "fspick": 433, "clone3": 435, "pidfd_getfd": 438, "mount_setattr": 442, "quotactl_fd": 443,
    },
)  # fmt: skip
ARCHES = {"x86_64": X86_64, "aarch64": AARCH64, "arm64": AARCH64}


class UnsupportedArch(Exception):
    pass


def _stmt(code: int, k: int) -> bytes:
    return struct.pack("=HBBI", code, 0, 0, k)


def _jump(code: int, k: int, *, true: int, false: int) -> bytes:
    return struct.pack("=HBBI", code, true, false, k)


def _load(offset: int) -> bytes:
    return _stmt(BPF_LD | BPF_W | BPF_ABS, offset)


def _ret(value: int) -> bytes:
    return _stmt(BPF_RET | BPF_K, value)


def _errno(number: int) -> bytes:
    return _ret(SECCOMP_RET_ERRNO | number)


def _if_nr(number: int, body: list[bytes]) -> list[bytes]:
    """`if nr == number: body` (the body must end in a return: it may load an argument into A)."""
    return [_jump(BPF_JMP | BPF_JEQ | BPF_K, number, true=0, false=len(body)), *body]


def program(machine: str | None = None) -> bytes:
    """The filter for this machine's architecture (or `machine`, as platform.machine() names it)."""
    machine = machine or platform.machine()
    arch = ARCHES.get(machine)
    if arch is None:
        raise UnsupportedArch(f"no seccomp filter is defined for the {machine} architecture")
    nr = arch.numbers
    code = [
        _load(ARCH_OFFSET),
        _jump(BPF_JMP | BPF_JEQ | BPF_K, arch.audit, true=1, false=0),
        _ret(SECCOMP_RET_KILL_PROCESS),
        _load(NR_OFFSET),
    ]
    if arch.x32:
        code += [_jump(BPF_JMP | BPF_JGE | BPF_K, X32_SYSCALL_BIT, true=0, false=1), _errno(errno.ENOSYS)]
    for name in DENIED:
        if name in nr:
            code += _if_nr(nr[name], [_errno(errno.EPERM)])
    code += _if_nr(nr["clone3"], [_errno(errno.ENOSYS)])
    for name in ("clone", "unshare"):  # the flags are the first argument of both
        code += _if_nr(
            nr[name],
            [
                _load(ARGS_OFFSET),
                _jump(BPF_JMP | BPF_JSET | BPF_K, NAMESPACE_FLAGS, true=0, false=1),
                _errno(errno.EPERM),
                _ret(SECCOMP_RET_ALLOW),
            ],
        )
    # ioctl's request is an unsigned int: the kernel ignores the upper 32 bits, so the low ones decide.
    code += _if_nr(
        nr["ioctl"],
        [
            _load(ARGS_OFFSET + 8),
            _jump(BPF_JMP | BPF_JEQ | BPF_K, TIOCSTI, true=0, false=1),
            _errno(errno.EPERM),
            _ret(SECCOMP_RET_ALLOW),
        ],
    )
    allowed = [_load(ARGS_OFFSET)]
    for index, value in enumerate(PERSONALITIES):
        # each test jumps, on a match, over the tests left and the EPERM to the ALLOW
        allowed.append(_jump(BPF_JMP | BPF_JEQ | BPF_K, value, true=len(PERSONALITIES) - index, false=0))
    code += _if_nr(nr["personality"], [*allowed, _errno(errno.EPERM), _ret(SECCOMP_RET_ALLOW)])
    code.append(_ret(SECCOMP_RET_ALLOW))
    return b"".join(code)


def memfd(machine: str | None = None) -> int:
    """A file descriptor holding the program, at offset 0, for bwrap's --seccomp."""
    fd = os.memfd_create("workbench-seccomp", os.MFD_CLOEXEC)
    os.write(fd, program(machine))
    os.lseek(fd, 0, os.SEEK_SET)
    return fd
