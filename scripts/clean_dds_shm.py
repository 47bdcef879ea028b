"""Remove the Fast DDS shared-memory files in /dev/shm that no running process holds.

A process killed while it creates its shared-memory port leaves the segment half made, and every
later participant that opens that port waits for it forever (boost::interprocess spin_wait under
rcl_node_init: a clean-clone run's hostile clients hung 30 minutes in create_node, 2026-12-03).
Fast DDS's own `fastdds shm clean` does this; its command line is not in the PyPI wheels. Files a
live process has open or mapped are kept, so running ROS programs are not disturbed.
"""
import os

SHM = "/dev/shm"
PREFIXES = ("fastdds_", "fast_datasharing_", "sem.fastdds_")


def held_paths() -> set:
    """Every path some process has open or mapped (processes we may not inspect are skipped)."""
    held = set()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                try:
                    held.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
                except OSError:
                    pass
            with open(f"/proc/{pid}/maps") as maps:
                for line in maps:
                    fields = line.split(maxsplit=5)
                    if len(fields) == 6:                # the sixth field is the mapped path, if any
                        held.add(fields[5].strip())
        except OSError:
            continue
    return held


def main() -> None:
    if not os.path.isdir(SHM):
        return
    held = held_paths()
    removed = 0
    for name in os.listdir(SHM):
        path = os.path.join(SHM, name)
        if name.startswith(PREFIXES) and path not in held:
            try:
                os.unlink(path)
                removed += 1
            except OSError:
                pass
    print(f"[test] {removed} Fast DDS shared-memory files no process holds removed from {SHM}")


if __name__ == "__main__":
    main()
