"""Host CPUs: the machine that launches a GPU's kernels (`data/host_cpus.csv`), and the host of each GPU's
reference system (`data/gpu_hosts.csv`). The throughput model divides its calibrated host times (kernel launches,
Python, the trainer) by the host's single-thread speed relative to the reference host, the Xeon Platinum 8380 of
the paper's A40 server; an offloaded optimizer step runs at the host's memory bandwidth."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from tunecost.catalog._csv import parse_float, read_catalog_csv
from tunecost.errors import TunecostError

DATA = Path(__file__).parent / "data"
HOST_CPUS_PATH = DATA / "host_cpus.csv"
GPU_HOSTS_PATH = DATA / "gpu_hosts.csv"
REFERENCE_HOST = "Xeon Platinum 8380"  # the paper's A40 server: speed 1 by definition
REFERENCE_TURBO_GHZ = 3.4


@dataclass(frozen=True, kw_only=True)
class HostCpu:
    name: str
    max_turbo_ghz: float
    core: str
    per_clock: float  # performance per clock relative to the reference host's core (Sunny Cove)
    memory_channels: int
    memory_mt_s: int  # DDR transfers per second per channel, in millions
    sockets: int  # CPUs in the machine (servers 2, desktops 1)
    sources: dict[str, str]
    as_of: str

    @property
    def speed(self) -> float:
        """Single-thread speed relative to the reference host."""
        return self.max_turbo_ghz / REFERENCE_TURBO_GHZ * self.per_clock

    @property
    def memory_bytes_per_s(self) -> float:
        """The machine's datasheet memory bandwidth: sockets x channels x transfers x 8 bytes."""
        return self.sockets * self.memory_channels * self.memory_mt_s * 1e6 * 8


@dataclass(frozen=True, kw_only=True)
class GpuHost:
    """A GPU's host: named by the user, its reference system's CPU, or the reference host (`assumed`)."""

    cpu: HostCpu
    origin: str  # how it was chosen, for notes


def _key(name: str) -> str:
    return " ".join(name.lower().replace("intel", "").replace("amd", "").split())


def load_host_cpus(path: Path = HOST_CPUS_PATH) -> tuple[dict[str, HostCpu], dict[str, str]]:
    """(CPUs by name, name by lower-case name or alias)."""
    cpus: dict[str, HostCpu] = {}
    names: dict[str, str] = {}
    numbers = ("max_turbo_ghz", "per_clock", "memory_channels", "memory_mt_s", "sockets")
    for i, row in read_catalog_csv(path, ("name", "aliases", "core", *numbers, "as_of")):
        turbo, per_clock, channels, mt_s, sockets = (parse_float(path, i, k, row[k]) for k in numbers)
        if min(turbo, per_clock, channels, mt_s, sockets) <= 0:
            raise TunecostError(f"{path}: row {i}: {', '.join(numbers)} must be > 0")
        name = row["name"]
        for alias in (name, *(a for a in row["aliases"].split(";") if a.strip())):
            key = _key(alias)
            if names.get(key, name) != name:
                raise TunecostError(f"{path}: row {i}: {alias!r} already names {names[key]}")
            names[key] = name
        cpus[name] = HostCpu(
            name=name,
            max_turbo_ghz=turbo,
            core=row["core"],
            per_clock=per_clock,
            memory_channels=int(channels),
            memory_mt_s=int(mt_s),
            sockets=int(sockets),
            sources={k.removeprefix("source_"): v for k, v in row.items() if k.startswith("source_")},
            as_of=row["as_of"],
        )
    if REFERENCE_HOST not in cpus:
        raise TunecostError(f"{path}: the reference host {REFERENCE_HOST} is missing")
    return cpus, names


@lru_cache(maxsize=1)
def host_cpu_catalog() -> tuple[dict[str, HostCpu], dict[str, str]]:
    return load_host_cpus()


def find_host_cpu(name: str) -> HostCpu | None:
    """A catalog host CPU by name or alias ('8480C', 'AMD EPYC 7742'), or None."""
    cpus, names = host_cpu_catalog()
    found = names.get(_key(name))
    return None if found is None else cpus[found]


def resolve_host_cpu(name: str) -> HostCpu:
    """`find_host_cpu`, where an unknown CPU is an error listing the known ones."""
    found = find_host_cpu(name)
    if found is None:
        cpus, _ = host_cpu_catalog()
        raise TunecostError(
            f"unknown host CPU {name!r}; known: {', '.join(sorted(cpus))} (or measure the host with "
            "`tunecost calibrate-gpu` and pass --gpu-profile)"
        )
    return found


@lru_cache(maxsize=1)
def reference_system_hosts(path: Path = GPU_HOSTS_PATH) -> dict[str, tuple[str, str]]:
    """GPU catalog name -> (host CPU name, system) for GPUs sold in a reference system."""
    out: dict[str, tuple[str, str]] = {}
    for i, row in read_catalog_csv(path, ("gpu", "host_cpu", "system", "source", "as_of")):
        if row["gpu"] in out:
            raise TunecostError(f"{path}: row {i}: GPU {row['gpu']} listed twice")
        resolve_host_cpu(row["host_cpu"])
        out[row["gpu"]] = (row["host_cpu"], row["system"])
    return out


def gpu_host(gpu_name: str, host_cpu: str | None = None) -> GpuHost:
    """The host a GPU runs on: `host_cpu` when given, else its reference system's CPU, else the reference host."""
    if host_cpu:
        cpu = resolve_host_cpu(host_cpu)
        return GpuHost(cpu=cpu, origin=f"host {cpu.name} (named)")
    system = reference_system_hosts().get(gpu_name)
    if system is not None:
        cpu = resolve_host_cpu(system[0])
        return GpuHost(cpu=cpu, origin=f"host {cpu.name} ({system[1]}'s CPU, assumed; name yours with --host-cpu)")
    cpu = resolve_host_cpu(REFERENCE_HOST)
    return GpuHost(
        cpu=cpu, origin=f"host not known for {gpu_name}: assumed as fast as the reference host {REFERENCE_HOST}"
    )


def host_cpu_from_model_name(model_name: str) -> HostCpu | None:
    """The catalog CPU a processor's model name (/proc/cpuinfo's "model name": "Intel(R) Xeon(R) Platinum 8480C",
    "AMD EPYC 7742 64-Core Processor") names, or None when it names none."""
    cleaned = re.sub(r"\((R|TM)\)|@.*$|\bCPU\b|\b\d+-Core\b|\bProcessor\b", " ", model_name, flags=re.IGNORECASE)
    candidates = (cleaned, *re.findall(r"\b\d{4}[A-Z+]*", cleaned))
    return next((cpu for cpu in map(find_host_cpu, candidates) if cpu is not None), None)
