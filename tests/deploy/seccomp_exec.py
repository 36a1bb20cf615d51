"""Run a command under an OCI seccomp profile, as runc applies a Localhost profile: the
profile's JSON loaded into libseccomp (rules with argument conditions included, names unknown
to this architecture skipped), then exec.

    python seccomp_exec.py PROFILE.json DROP[,DROP...] COMMAND [ARG...]

DROP names syscalls to leave out of the profile's allow rules (a profile without them).
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
from typing import Any

SCMP_ACT_ALLOW = 0x7FFF0000


def errno_action(errno: int) -> int:
    return 0x00050000 | (errno & 0xFFFF)


OPS = {
    "SCMP_CMP_NE": 1,
    "SCMP_CMP_LT": 2,
    "SCMP_CMP_LE": 3,
    "SCMP_CMP_EQ": 4,
    "SCMP_CMP_GE": 5,
    "SCMP_CMP_GT": 6,
    "SCMP_CMP_MASKED_EQ": 7,
}


class ArgCmp(ctypes.Structure):
    """struct scmp_arg_cmp"""

    _fields_ = [
        ("arg", ctypes.c_uint),
        ("op", ctypes.c_int),
        ("datum_a", ctypes.c_uint64),
        ("datum_b", ctypes.c_uint64),
    ]


def apply(profile: dict[str, Any]) -> None:
    """Load ``profile`` into the kernel for this process (and what it execs)."""
    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    lib.seccomp_rule_add_array.argtypes = [
        ctypes.c_void_p,
        ctypes.c_uint32,
        ctypes.c_int,
        ctypes.c_uint,
        ctypes.POINTER(ArgCmp),
    ]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    default = profile["defaultAction"]
    assert default == "SCMP_ACT_ERRNO"
    ctx = lib.seccomp_init(errno_action(profile.get("defaultErrnoRet", 1)))
    for rule in profile["syscalls"]:
        action = (
            SCMP_ACT_ALLOW
            if rule["action"] == "SCMP_ACT_ALLOW"
            else errno_action(rule.get("errnoRet", 1))
        )
        args = rule.get("args", [])
        cmps = (ArgCmp * max(len(args), 1))(
            *[ArgCmp(a["index"], OPS[a["op"]], a["value"], a.get("valueTwo", 0)) for a in args]
        )
        for name in rule["names"]:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:
                continue  # not a syscall of this architecture (runc skips these too)
            rc = lib.seccomp_rule_add_array(ctypes.c_void_p(ctx), action, nr, len(args), cmps)
            if rc != 0:
                raise OSError(-rc, f"seccomp_rule_add {name}")
    rc = lib.seccomp_load(ctypes.c_void_p(ctx))
    if rc != 0:
        raise OSError(-rc, "seccomp_load")


def main() -> None:
    with open(sys.argv[1]) as file:
        profile = json.load(file)
    drop = set(filter(None, sys.argv[2].split(",")))
    for rule in profile["syscalls"]:
        rule["names"] = [n for n in rule["names"] if n not in drop]
    apply(profile)
    os.execv(sys.argv[3], sys.argv[3:])


if __name__ == "__main__":
    main()
