"""edge_agent.commands: the in-process command API (schemas, admission, dispatch, replies)."""

from edge_agent.commands.admission import Admission, AdmissionContext, Verdict, admit
from edge_agent.commands.api import CommandAPI, CommandContext, Handler
from edge_agent.commands.codes import CommandRefused, ErrorInfo, Reply
from edge_agent.commands.dedup import (
    DedupEntry,
    DedupStore,
    JsonFileDedupStore,
    MemoryDedupStore,
)
from edge_agent.commands.freshness import MOTION_COMMANDS, Epoch, Freshness
from edge_agent.commands.schema import COMMANDS, Limits
from edge_agent.vocab import ErrorCode, Mode

__all__ = [
    "COMMANDS", "MOTION_COMMANDS", "Admission", "AdmissionContext", "CommandAPI",
    "CommandContext", "CommandRefused", "DedupEntry", "DedupStore", "Epoch", "ErrorCode",
    "ErrorInfo", "Freshness", "Handler", "JsonFileDedupStore", "Limits", "MemoryDedupStore",
    "Mode", "Reply", "Verdict", "admit",
]
