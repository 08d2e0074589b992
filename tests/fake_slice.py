"""A fake TPU pod slice on this machine, for the tests and benchmarks of pod launches.

As Ray's own TPU tests do, the slice is a `ray.cluster_utils.Cluster` whose nodes carry a TPU
VM's resources and labels (`{"TPU": 4}`, `TPU-<pod type>-head` on worker 0, the slice's name,
worker id, pod type and topology) and, like a real TPU VM's hosts, its environment
(`TPU_NAME`, `TPU_WORKER_ID`, `TPU_ACCELERATOR_TYPE`). Each host's actor runs on XLA:CPU when
the node is told `PJRT_DEVICE=CPU`, as a notebook that ran `%tpu_setup --device cpu` is.

Two things a fresh machine needs that a machine with earlier runs' files hides:

- Every file Ray writes goes into one new folder under this run's temp folder (or /tmp where
  that path is too long for Ray's Unix sockets), removed at the end: Ray's session (logs,
  sockets) and the address file `Cluster` writes into Ray's default temp folder whatever the
  node's `temp_dir` (`RAY_TMPDIR` points it here, and the folder is created).
- Every node, and the driver, use the loopback: Ray swaps 127.0.0.1 for the machine's network
  address unless it runs as on a laptop (`RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`, read by the
  nodes' processes at start and by this process's `ray_constants`), and each node is given
  `node_ip_address=127.0.0.1`. `listening_addresses()` lets a test check it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile

LOOPBACK = "127.0.0.1"
STORE = 80 * 1024 * 1024  # object store per node: the work and results are small

# Read by every Ray process at import (the nodes inherit it): no network address, loopback.
os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"


@contextlib.contextmanager
def fake_slice(
    hosts: int = 4,
    *,
    pod_type: str = "v4-32",
    topology: str = "2x2x4",
    name: str = "tpu-nb-test-slice",
    pjrt_device: str | None = "CPU",
):
    """A running fake slice of `hosts` hosts with this process connected (ray.init); yields
    the Cluster. `pjrt_device=None` leaves PJRT_DEVICE unset on the hosts, as on a real
    TPU VM (where "auto" then picks the TPU)."""
    import ray
    from ray._private import ray_constants
    from ray.cluster_utils import Cluster

    saved = {k: os.environ.get(k) for k in ("TPU_NAME", "RAY_TMPDIR")}
    ray_constants.ENABLE_RAY_CLUSTER = False  # this process may have imported Ray already
    # Ray reads a multi-host slice's name from TPU_NAME (GKE) in the node's processes. A short
    # session path: Unix socket paths are limited to about 100 characters.
    os.environ["TPU_NAME"] = name
    session = tempfile.mkdtemp(prefix="tpu_nb-ray-", dir=_short_enough(tempfile.gettempdir()))
    os.environ["RAY_TMPDIR"] = session
    os.makedirs(os.path.join(session, "ray"), exist_ok=True)  # Cluster's address file
    cluster = None
    try:
        for attempt in range(_STARTS):
            cluster = Cluster()
            try:
                _add_hosts(cluster, hosts, pod_type, topology, name, pjrt_device, session)
                break
            except Exception as error:
                # On a loaded machine (2 cores, other processes' tests beside it) a raylet can
                # miss Ray's fixed 30 s to register with the GCS: start the slice once more.
                cluster.shutdown()
                if attempt == _STARTS - 1 or "timed out during startup" not in str(error):
                    raise
        ray.init(address=cluster.address, log_to_driver=False, _node_ip_address=LOOPBACK)
        yield cluster
    finally:
        ray.shutdown()
        if cluster is not None:
            cluster.shutdown()
        shutil.rmtree(session, ignore_errors=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


_STARTS = 2  # tries to start the slice


def _add_hosts(cluster, hosts, pod_type, topology, name, pjrt_device, session) -> None:
    for worker in range(hosts):
        resources = {"TPU": 4}
        if worker == 0:
            resources[f"TPU-{pod_type}-head"] = 1
        env = {
            "TPU_NAME": name,
            "TPU_WORKER_ID": str(worker),
            "TPU_ACCELERATOR_TYPE": pod_type,
            "PJRT_DEVICE": pjrt_device or "",
        }
        cluster.add_node(
            num_cpus=1,
            object_store_memory=STORE,
            resources=resources,
            labels={
                "ray.io/tpu-slice-name": name,
                "ray.io/tpu-worker-id": str(worker),
                "ray.io/tpu-pod-type": pod_type,
                "ray.io/tpu-topology": topology,
            },
            node_ip_address=LOOPBACK,
            env_vars=env,
            # The head first; the other nodes start together. No dashboard: it is a
            # busy process the tests do not use.
            wait=worker == 0,
            temp_dir=session,
            **({"include_dashboard": False} if worker == 0 else {}),
        )
    cluster.wait_for_nodes()


# What Ray puts under its folder before its longest socket's name:
# "/session_2026-11-26_19-12-42_941400_30766/sockets/plasma_store" and the folder's own name.
_RAY_SOCKET_TAIL = 64 + len("/tpu_nb-ray-xxxxxxxx")
_SOCKET_PATH_MAX = 107  # AF_UNIX paths on Linux


def _short_enough(folder: str) -> str:
    """`folder` if Ray's socket paths under it fit AF_UNIX's limit, else /tmp (a run's own
    temp folder nested in another can be too long; the slice's folder is removed anyway)."""
    return folder if len(folder) + _RAY_SOCKET_TAIL <= _SOCKET_PATH_MAX else "/tmp"


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    with contextlib.suppress(OSError):
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
    return inodes


def _address(hex_address: str) -> str:
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    if len(raw) == 4:
        ip = ".".join(str(b) for b in reversed(raw))
    else:  # IPv6 in /proc: four little-endian 32-bit words
        words = [raw[i : i + 4][::-1] for i in range(0, 16, 4)]
        full = b"".join(words)
        ip = (
            ".".join(str(b) for b in full[12:])
            if full[:12] == b"\0" * 10 + b"\xff\xff"
            else ":".join(full[i : i + 2].hex() for i in range(0, 16, 2))
        )
    return f"{ip}:{int(port, 16)}"


def listening_addresses(pids) -> list[str]:
    """The TCP addresses the processes `pids` listen on (Linux /proc), IPv4-mapped IPv6
    addresses written as IPv4."""
    inodes: set[str] = set()
    for pid in pids:
        inodes |= _socket_inodes(pid)
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError), open(table) as f:
            next(f)
            for row in f:
                fields = row.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    found.append(_address(fields[1]))
    return found


def descendants(pid: int | None = None) -> list[int]:
    """Every process started, directly or not, by `pid` (default: this one)."""
    parents: dict[int, int] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{name}/stat") as f:
                parents[int(name)] = int(f.read().rsplit(")", 1)[1].split()[1])
    found, frontier = [], [pid or os.getpid()]
    while frontier:
        parent = frontier.pop()
        children = [p for p, pp in parents.items() if pp == parent]
        found += children
        frontier += children
    return found
