"""Multi-turn agentic RL: verl's tools and interactions, run off the decode loop.

Pure Python (no JAX): the multi-turn rollout sampler parses the model's tool
calls (`parse_tool_calls`), runs them per conversation (`ToolSession`,
`InteractionSession`), and appends the resulting turns' ids
(`appended_ids`), checking the trained ids against the chat template
(`sanity_check`).

- tools: BaseTool, ToolResponse, load_tool_config, load_tool_schemas (verl's tool YAML).
- interactions: BaseInteraction, load_interaction_config, select_interaction.
- parsing: ToolCall, parse_tool_calls, FORMATS (hermes, llama3_json, mistral).
- runner: ToolSession, InteractionSession, ToolOutcome, tool_messages, truncate_tool_response.
- render: appended_ids, sanity_check.
"""

from rljax.agents.interactions import BaseInteraction
from rljax.agents.interactions import load_interaction_config
from rljax.agents.interactions import select_interaction
from rljax.agents.parsing import FORMATS
from rljax.agents.parsing import parse_tool_calls
from rljax.agents.parsing import ToolCall
from rljax.agents.render import appended_ids
from rljax.agents.render import SANITY_MODES
from rljax.agents.render import sanity_check
from rljax.agents.runner import InteractionSession
from rljax.agents.runner import InteractionTurn
from rljax.agents.runner import tool_messages
from rljax.agents.runner import ToolOutcome
from rljax.agents.runner import ToolSession
from rljax.agents.runner import TRUNCATE_SIDES
from rljax.agents.runner import truncate_tool_response
from rljax.agents.tools import BaseTool
from rljax.agents.tools import load_tool_config
from rljax.agents.tools import load_tool_schemas
from rljax.agents.tools import read_tool_specs
from rljax.agents.tools import tools_by_name
from rljax.agents.tools import ToolResponse
from rljax.agents.tools import ToolSpec

__all__ = [
    "BaseInteraction",
    "BaseTool",
    "FORMATS",
    "InteractionSession",
    "InteractionTurn",
    "SANITY_MODES",
    "TRUNCATE_SIDES",
    "ToolCall",
    "ToolOutcome",
    "ToolResponse",
    "ToolSession",
    "ToolSpec",
    "appended_ids",
    "load_interaction_config",
    "load_tool_config",
    "load_tool_schemas",
    "parse_tool_calls",
    "read_tool_specs",
    "sanity_check",
    "select_interaction",
    "tool_messages",
    "tools_by_name",
    "truncate_tool_response",
]
