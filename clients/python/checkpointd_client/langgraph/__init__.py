"""LangGraph checkpointer backed by checkpointd (`pip install 'checkpointd-client[langgraph]'`):
time travel that rewinds the graph's state and, with a workspace, its files."""

from checkpointd_client.langgraph.records import thread_plan_id
from checkpointd_client.langgraph.saver import CheckpointdSaver

__all__ = ["CheckpointdSaver", "thread_plan_id"]
