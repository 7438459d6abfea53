"""What CI's timing depends on, printed beside it: the same suite took 17.6 min on one 2-core machine of the CI's
kind and 37-40 min on another, so a test-time figure means little without the machine's speed and load next to it.

`ci_machine.py before STATE` prints the CPU, a fixed single-thread workload's time (`calibration_s`: torch's import
plus small matmuls, the suite's typical work) and any process already busy on the CPU, and keeps /proc/stat's
counters in STATE; `ci_machine.py after STATE` prints how busy the CPUs were in between, and how much the hypervisor
took (steal). Standard library and torch only; a few seconds."""
import os
import subprocess
import sys
import time
from pathlib import Path

# A fixed workload in a fresh interpreter: what an end-to-end test's role actor does first (import torch), then
# tiny-network matmuls on one thread, as the CPU learning tests' updates are.
CALIBRATION = """
import time
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
torch.set_num_threads(1)
a, b = torch.randn(256, 64), torch.randn(64, 64)
for _ in range(20000):
    a @ b
print(f"{t1 - t0:.2f} {time.perf_counter() - t1:.2f}")
"""


def cpu_counters() -> dict[str, int]:
    names = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:1 + len(names)]
    return dict(zip(names, map(int, fields)))


def busy_processes(threshold: float = 10.0) -> list[str]:
    """Processes using at least `threshold` % of a CPU over one second (before the tests, there should be none)."""
    def ticks() -> dict[int, tuple[int, str]]:
        out = {}
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                text = stat.read_text()
            except OSError:
                continue
            name, rest = text[text.index("(") + 1:text.rindex(")")], text[text.rindex(")") + 2:].split()
            out[int(stat.parent.name)] = (int(rest[11]) + int(rest[12]), name)
        return out

    first = ticks()
    time.sleep(1.0)
    hz = os.sysconf("SC_CLK_TCK")
    busy = []
    for pid, (used, name) in ticks().items():
        if pid in first and pid != os.getpid():
            share = 100.0 * (used - first[pid][0]) / hz
            if share >= threshold:
                busy.append(f"{name}[{pid}] {share:.0f} %")
    return busy


def before(state: Path) -> None:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), "unknown CPU")
    load = os.getloadavg()[0]
    busy = busy_processes()
    state.write_text(" ".join(f"{k}={v}" for k, v in cpu_counters().items()))
    timed = subprocess.run([sys.executable, "-c", CALIBRATION], capture_output=True, text=True, timeout=300)
    import_s, matmul_s = timed.stdout.split() if timed.returncode == 0 else ("?", "?")
    print(f"ci machine: {os.cpu_count()} × {model}, load {load:.2f}; calibration: import torch {import_s} s, "
          f"20k small matmuls {matmul_s} s (the machine whose suite took 17.6 min: 1.05 s and 0.30 s); "
          f"busy before the tests: {', '.join(busy) if busy else 'nothing'}")


def after(state: Path) -> None:
    start = dict(item.split("=") for item in state.read_text().split())
    delta = {k: v - int(start[k]) for k, v in cpu_counters().items()}
    total = sum(delta.values()) or 1
    idle = delta["idle"] + delta["iowait"]
    print(f"ci machine during the tests: CPUs {100 * (total - idle - delta['steal']) / total:.0f} % busy "
          f"({100 * delta['nice'] / total:.0f} % at nice > 0: Ray's workers), {100 * idle / total:.0f} % idle, "
          f"{100 * delta['steal'] / total:.1f} % stolen by the hypervisor")


if __name__ == "__main__":
    {"before": before, "after": after}[sys.argv[1]](Path(sys.argv[2]))
