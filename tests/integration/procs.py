"""Which processes a test started and where they listen, read from /proc (Linux)."""

from __future__ import annotations

import os
from pathlib import Path


def descendants(root: int) -> set[int]:
    """`root` and every process under it."""
    parent: dict[int, int] = {}
    for p in os.listdir("/proc"):
        if p.isdigit():
            try:
                stat_line = Path(f"/proc/{p}/stat").read_text()
            except OSError:
                continue
            parent[int(p)] = int(stat_line.rsplit(")", 1)[1].split()[1])
    tree, todo = {root}, [root]
    while todo:
        cur = todo.pop()
        kids = [p for p, pp in parent.items() if pp == cur and p not in tree]
        tree.update(kids)
        todo.extend(kids)
    return tree


def command_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def listeners(pids: set[int]) -> list[str]:
    """Listening TCP addresses held by `pids`, as this network namespace sees them
    (dotted IPv4, or /proc's hex for IPv6); a socket of another namespace is not listed."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:  # gone meanwhile
            continue
    out = []
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:  # LISTEN
                addr = cols[1].rsplit(":", 1)[0]
                if len(addr) == 8:
                    addr = ".".join(str(int(addr[i : i + 2], 16)) for i in (6, 4, 2, 0))
                out.append(addr)
    return out
