"""Doctor checks of this machine: the tty, real-time scheduling, memory, the state dir, the clock.

They test by doing, as the user running `doctor` (run it as the service user to see what the
service will get): open the tty, ask for SCHED_FIFO, write and fsync a file in the state
directory, ask the kernel whether the clock is synchronised.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import grp
import os
import resource
import shutil
import stat
import subprocess
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from edge_agent.doctor import Finding, error, ok, warn

if TYPE_CHECKING:
    from edge_agent.config import Config

UNIT_GROUP = "dialout"  # the unit's SupplementaryGroups= (systemd/edge-agent.service)
# filesystems where fsync does not make the snapshot (the latch!) survive a power cut
_VOLATILE_FS = {"tmpfs", "ramfs", "devtmpfs"}
_WEAK_FSYNC_FS = {"nfs", "nfs4", "cifs", "smb3", "9p", "vboxsf", "fuse", "fuseblk", "virtiofs"}


def check_tty(cfg: Config) -> list[Finding]:
    """The serial device exists, is a tty, and this user can open it read-write."""
    port = cfg.link.port
    if not port:
        return [warn("tty", "link.port is not set: only `edge-agent run --sim` can start",
                     "set link.port to the drives' adapter, e.g. /dev/serial/by-id/usb-...")]
    if "://" in port:
        return [ok("tty", f"{port} is a pyserial URL (not a local tty; not checked)")]
    try:
        st = os.stat(port)
    except FileNotFoundError:
        return [error("tty", f"{port}: no such device",
                      "plug in the drives' adapter; `ls -l /dev/serial/by-id/` shows its stable "
                      "name: put that in link.port")]
    except OSError as exc:
        return [error("tty", f"{port}: {exc.strerror}", "check the path in link.port")]
    if not stat.S_ISCHR(st.st_mode):
        return [error("tty", f"{port} is not a character device (not a tty)",
                      "link.port must name the serial adapter (/dev/ttyUSB*, /dev/ttyACM*, "
                      "/dev/serial/by-id/...)")]
    group = group_name(st.st_gid)
    try:
        fd = os.open(port, os.O_RDWR | os.O_NOCTTY | os.O_NONBLOCK)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):
            if group == UNIT_GROUP and st.st_mode & stat.S_IRGRP and st.st_mode & stat.S_IWGRP:
                # `sudo -u edge-agent doctor` lacks what the unit adds: not a miss of the install
                return [warn("tty", f"{port}: uid {os.getuid()} cannot open it, but the unit's "
                                    f"SupplementaryGroups={UNIT_GROUP} gives the service "
                                    f"group read-write ({_owner(st)} "
                                    f"{stat.S_IMODE(st.st_mode):04o})",
                             "nothing for the service; to run edge-agent by hand: "
                             f"`sudo usermod -aG {UNIT_GROUP} $USER` and log in again")]
            return [error("tty", f"{port}: permission denied for uid {os.getuid()} (the device "
                                 f"is {_owner(st)} {stat.S_IMODE(st.st_mode):04o})",
                          _group_fix(group))]
        if exc.errno == errno.EBUSY:
            return [error("tty", f"{port}: busy (another program has it open)",
                          f"find it with `fuser -v {port}` and stop it (a second edge-agent? "
                          "ModemManager?)")]
        return [error("tty", f"{port}: cannot open: {exc.strerror}",
                      "check the adapter (`dmesg | tail`) and link.port")]
    try:
        is_tty = os.isatty(fd)
    finally:
        os.close(fd)
    if not is_tty:
        return [error("tty", f"{port} opens but is not a terminal device",
                      "link.port must name the serial adapter, not another device")]
    out = [ok("tty", f"{port}: a tty, opened read-write ({_owner(st)} "
                     f"{stat.S_IMODE(st.st_mode):04o})")]
    if group != UNIT_GROUP and not st.st_mode & stat.S_IWOTH:
        out.append(warn("tty", f"{port} belongs to group {group}, the unit grants {UNIT_GROUP}",
                        f"add a drop-in (`systemctl edit edge-agent`): [Service] "
                        f"SupplementaryGroups={group}"))
    return out


def group_name(gid: int) -> str:
    try:
        return grp.getgrgid(gid).gr_name
    except KeyError:
        return str(gid)


def _owner(st: os.stat_result) -> str:
    import pwd

    try:
        user = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        user = str(st.st_uid)
    return f"{user}:{group_name(st.st_gid)}"


def _group_fix(group: str) -> str:
    if group == UNIT_GROUP:
        return (f"give group {UNIT_GROUP} read-write on it (a udev rule: MODE=\"0660\", "
                f"GROUP=\"{UNIT_GROUP}\")")
    return (f"the device's group is {group}, not {UNIT_GROUP}: add a drop-in "
            f"(`systemctl edit edge-agent`) with [Service] SupplementaryGroups={group}, or a "
            f"udev rule giving it group {UNIT_GROUP}")


def check_realtime(cfg: Config) -> list[Finding]:
    """SCHED_FIFO at the highest priority the config asks for, tried on a throwaway thread."""
    want = max(cfg.link.guardian_priority, cfg.control.priority, cfg.link.reader_priority)
    if want == 0:
        return [ok("realtime", "not asked for (all priorities 0)")]
    soft, _hard = resource.getrlimit(resource.RLIMIT_RTPRIO)
    got: list[BaseException | None] = []

    def attempt() -> None:  # a thread of its own: the policy stays with it, not with us
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(want))
            got.append(None)
        except (OSError, AttributeError) as exc:
            got.append(exc)

    t = threading.Thread(target=attempt, name="doctor-fifo")
    t.start()
    t.join()
    limit = "unlimited" if soft == resource.RLIM_INFINITY else str(soft)
    if got and got[0] is None:
        return [ok("realtime", f"SCHED_FIFO {want} allowed (RLIMIT_RTPRIO {limit}"
                               f"{', root' if os.geteuid() == 0 else ''})")]
    return [warn("realtime", f"SCHED_FIFO {want} refused ({got[0] if got else '?'}; "
                             f"RLIMIT_RTPRIO {limit}): run like this, the guardian and the "
                             "control loop would run SCHED_OTHER and jitter under load",
                 f"the unit grants it with LimitRTPRIO={want} (systemd/edge-agent.service); "
                 f"outside systemd: `ulimit -r {want}` or a line `<user> - rtprio {want}` in "
                 "/etc/security/limits.d/edge-agent.conf (or CAP_SYS_NICE)")]


def check_memory() -> list[Finding]:
    """Memory locking allowed, and swap (a page fault on the control path costs milliseconds)."""
    soft, _hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)
    limit = "unlimited" if soft == resource.RLIM_INFINITY else f"{soft // 1024} KiB"
    can_lock = _try_mlockall()
    swap = _swap_devices()
    text = f"memory locking {'allowed' if can_lock else 'refused'} (RLIMIT_MEMLOCK {limit})"
    if swap:
        return [warn("memory", f"{text}; swap is on ({', '.join(swap)}): the daemon does not "
                               "lock its pages, so the control loop may stall on a page-in",
                     "turn swap off on the robot (`swapoff -a`, remove it from /etc/fstab)"
                     + ("" if can_lock else ", or grant LimitMEMLOCK=infinity in the unit"))]
    return [ok("memory", f"{text}; no swap")]


def _try_mlockall() -> bool:
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    mcl_current = 1
    if libc.mlockall(mcl_current) != 0:
        return False
    libc.munlockall()
    return True


def _swap_devices() -> list[str]:
    try:
        lines = Path("/proc/swaps").read_text().splitlines()[1:]
    except OSError:
        return []
    return [ln.split()[0] for ln in lines if ln.strip()]


def check_state_dir(cfg: Config) -> list[Finding]:
    """The state dir is writable, fsync works there, and its filesystem keeps data at power loss."""
    d = cfg.state_dir
    probe = d / f".doctor-{os.getpid()}"
    try:
        d.mkdir(parents=True, exist_ok=True)
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        try:
            os.write(fd, b"edge-agent doctor\n")
            os.fsync(fd)
        finally:
            os.close(fd)
        dfd = os.open(d, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError as exc:
        return [error("state_dir", f"{d}: cannot write and fsync a file: {exc.strerror}",
                      "under systemd keep state_dir = \"/var/lib/edge-agent\" (the unit's "
                      "StateDirectory= creates it for the service user); otherwise create it, "
                      "owned by the user that runs the daemon, mode 0700")]
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    fs, opts = _filesystem_of(d)
    if fs in _VOLATILE_FS:
        return [warn("state_dir", f"{d} is on {fs}: fsync succeeds but the snapshot (the e-stop "
                                  "latch) and the journal are lost at power-off",
                     "put state_dir on a disk filesystem (ext4, xfs, btrfs)")]
    if fs in _WEAK_FSYNC_FS or fs.startswith("fuse."):
        return [warn("state_dir", f"{d} is on {fs}: fsync and flock are not reliable there",
                     "put state_dir on a local disk filesystem (ext4, xfs, btrfs)")]
    if {"nobarrier", "barrier=0"} & set(opts):
        return [warn("state_dir", f"{d} is on {fs} mounted with {','.join(opts)}: write "
                                  "barriers are off, fsync does not survive a power cut",
                     "remount without nobarrier / barrier=0")]
    free = shutil.disk_usage(d).free
    return [ok("state_dir", f"{d}: writable, fsync works ({fs}, {free // 2**20} MiB free)")]


def _filesystem_of(path: Path) -> tuple[str, list[str]]:
    """(fstype, mount options) of the mount holding `path`, from /proc/self/mountinfo."""
    target = os.path.realpath(path)
    best, fs = "", "unknown"
    opts: list[str] = []
    try:
        lines = Path("/proc/self/mountinfo").read_text().splitlines()
    except OSError:
        return fs, opts
    for ln in lines:
        left, _, right = ln.partition(" - ")
        parts, rparts = left.split(), right.split()
        if len(parts) < 6 or len(rparts) < 3:
            continue
        mnt = parts[4].replace("\\040", " ")
        inside = target == mnt or target.startswith(mnt.rstrip("/") + "/")
        if inside and len(mnt) >= len(best):
            best, fs = mnt, rparts[0]
            opts = parts[5].split(",") + rparts[2].split(",")
    return fs, opts


class _Timex(ctypes.Structure):
    # struct timex starts with `unsigned int modes`; the kernel writes the rest (≤ 208 bytes)
    _fields_ = [("modes", ctypes.c_uint), ("rest", ctypes.c_byte * 252)]


_TIME_ERROR = 5  # adjtimex(2): the clock is not synchronised (STA_UNSYNC)


def check_clock() -> list[Finding]:
    """Whether the kernel considers the clock synchronised (adjtimex; timedatectl for detail)."""
    fix = ("enable time synchronisation: `timedatectl set-ntp true` (systemd-timesyncd) or "
           "install chrony; reports and events carry wall-clock timestamps")
    state = _adjtimex_state()
    ntp = _timedatectl("NTPSynchronized")
    if state is None and ntp is None:
        return [warn("clock", "cannot tell whether the clock is synchronised (no adjtimex, "
                              "no timedatectl)", fix)]
    synced = ntp == "yes" if state is None else state != _TIME_ERROR
    how = f"adjtimex state {state}" if state is not None else f"NTPSynchronized={ntp}"
    if synced:
        return [ok("clock", f"synchronised ({how})")]
    return [warn("clock", f"not synchronised ({how})", fix)]


def _adjtimex_state() -> int | None:
    libc_name = ctypes.util.find_library("c")
    if libc_name is None:
        return None
    libc = ctypes.CDLL(libc_name, use_errno=True)
    tx = _Timex()  # modes = 0: read only
    rc = int(libc.adjtimex(ctypes.byref(tx)))
    return None if rc < 0 else rc


def _timedatectl(prop: str) -> str | None:
    exe = shutil.which("timedatectl")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "show", "-p", prop, "--value"], capture_output=True,
                             text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None

