"""dmem where agents already live: MCP (`mcp`), LangGraph (`langgraph`), LangChain (`langchain`).

Each module imports its framework lazily or at its top, never here: ``import dmem``
stays lean, and the frameworks are optional extras (``pip install 'dmem[mcp]'``,
``'dmem[langgraph]'``, ``'dmem[langchain]'``).
"""
