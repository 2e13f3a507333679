"""The daemon's configuration: load a TOML file (plus --set overrides) into frozen dataclasses.

    from edge_agent.config import load_config
    cfg = load_config("configs/sim.toml", ["mqtt.port=1884"], sim=True)

The parts: schema.py (one dataclass per section, each key's type and limits; spec.py: how a key
is declared), values.py (raw TOML value -> typed value), checks.py (checks that span keys, derived
defaults), load.py (read, override, validate, hash). This package re-exports what the rest of
edge_agent imports.
"""

from __future__ import annotations

from edge_agent.config.load import Config, load_config, parse_override
from edge_agent.config.schema import SCHEMA_VERSION, SECTIONS
from edge_agent.config.spec import Secret
from edge_agent.config.values import config_keys
from edge_agent.errors import ConfigError

__all__ = ["SCHEMA_VERSION", "SECTIONS", "Config", "ConfigError", "Secret", "config_keys",
           "load_config", "parse_override"]
