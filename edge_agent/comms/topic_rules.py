"""Topic rules without paho (the config checks use them at load time, before MQTT starts):
command names as topic levels, and what makes a topic valid on every major broker."""

from __future__ import annotations


def name_levels(name: str) -> str:
    """A command name as topic levels: `task.start` → `task/start` (a `.` inside a level is
    refused by NATS, which maps levels to subjects; every broker accepts a level per word)."""
    return name.replace(".", "/")


PORTABLE_LEVEL_FORBIDDEN = ".+#*>"


def portability_problem(topic: str, *, wildcards: bool = False) -> str | None:
    """Why `topic` (a prefix or a topic) is not valid on every major broker, or None.

    Mosquitto, EMQX and HiveMQ accept any UTF-8 but `+ #` inside a level; NATS maps levels to
    subjects: it refuses `.` and spaces in a level (and disconnects the publisher) and treats
    `*` `>` as its wildcards; RabbitMQ maps `/` to `.`; a topic starting with `$` is the
    broker's own ($SYS)."""
    levels = topic.split("/")
    if not topic or "" in levels:
        return "has an empty level (a leading, trailing or double '/')"
    if topic.startswith("$"):
        return "starts with '$': brokers keep such topics for themselves ($SYS)"
    for i, lvl in enumerate(levels):
        if wildcards and (lvl == "+" or (lvl == "#" and i == len(levels) - 1)):
            continue
        bad = sorted({c for c in lvl if c in PORTABLE_LEVEL_FORBIDDEN or c.isspace()
                      or not c.isprintable()})
        if bad:
            shown = " ".join(repr(c) for c in bad)
            return (f"level {lvl!r} holds {shown}: not valid on every broker (NATS refuses "
                    "'.' and spaces inside a level and disconnects the publisher; '+' '#' "
                    "and NATS's '*' '>' are wildcards); use letters, digits, '-' and '_', "
                    "and '/' between levels")
    return None
