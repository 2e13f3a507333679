"""What the guardian's rules hand back: `Actions` (frames for the tty and the daemon) and the
`G_STATE.flags` bits (`GuardianFlag`), apart from the rules so readers of G_STATE import no rules.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntFlag

from edge_agent.link.codec import Command, Enable, GState, Message


class GuardianFlag(IntFlag):
    """Bits of `G_STATE.flags`."""

    REALTIME = 1 << 0  # the guardian runs with SCHED_FIFO
    SESSION_OPEN = 1 << 1  # the firmware accepted our HELLO
    VERSION_MISMATCH = 1 << 2  # the firmware refused our HELLO (another protocol version)
    NEED_ENABLE = 1 << 3  # the latch was cleared; motion waits for a new ENABLE(1)
    DAEMON_LOST = 1 << 4  # the daemon's end of the socketpair closed


@dataclass(slots=True)
class Actions:
    """What to do after one input: frames for the tty (in order, first is most urgent), for the
    daemon. Firmware frames themselves are always relayed to the daemon by the caller."""

    tty: list[Message] = field(default_factory=list)
    daemon: list[GState] = field(default_factory=list)

    def extend(self, other: Actions) -> None:
        self.tty += other.tty
        self.daemon += other.daemon


def is_motion(msg: Message) -> bool:
    """A frame that can move the robot: a COMMAND asking for motion, or ENABLE(1)."""
    return (isinstance(msg, Command) and msg.moves) or (isinstance(msg, Enable) and msg.enable)
