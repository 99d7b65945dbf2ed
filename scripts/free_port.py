#!/usr/bin/env python3
"""A TCP port nobody holds on 127.0.0.1, below the kernel's ephemeral range.

A port bind(0) picks lies inside that range, where any process's next
outgoing connection may take it before the job that was given it binds it
(CI saw a torch store fail with EADDRINUSE so); below it, only another
explicit bind can, and a random start keeps concurrent jobs apart. The C
tests' launcher follows the same rule (tests/mp/launcher.c, mp_free_port).

As a module: free_port(). As a command: prints one.
"""
import random
import socket


def free_port():
    with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
        low = int(f.read().split()[0])
    for _ in range(100):
        port = random.randrange(min(20000, low // 2), low)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port below the ephemeral range")


if __name__ == "__main__":
    print(free_port())
