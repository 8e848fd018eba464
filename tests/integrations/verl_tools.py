"""Tools for verl's ToolAgentLoop in the agent-loop tests: subclasses of verl's real ``BaseTool``,
loaded by verl's own tool registry from a tool config (``class_name: verl_tools.AddTool``)."""

from __future__ import annotations

from typing import Any

from verl.tools.base_tool import BaseTool
from verl.tools.schemas import ToolResponse


class AddTool(BaseTool):
    """Adds two integers."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        return ToolResponse(text=str(int(parameters["a"]) + int(parameters["b"]))), 0.0, {}


class LookupTool(BaseTool):
    """Fails as a tool whose backend is down does: verl catches the exception and replies with it."""

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float, dict]:
        raise ConnectionError("the lookup backend is unreachable")


TOOL_CONFIG = """
tools:
  - class_name: verl_tools.AddTool
    config: {type: native}
    tool_schema:
      type: function
      function:
        name: add
        description: Add two integers.
        parameters:
          type: object
          properties:
            a: {type: integer, description: the first}
            b: {type: integer, description: the second}
          required: [a, b]
  - class_name: verl_tools.LookupTool
    config: {type: native}
    tool_schema:
      type: function
      function:
        name: lookup
        description: Look a fact up.
        parameters:
          type: object
          properties:
            q: {type: string, description: the query}
          required: [q]
"""
