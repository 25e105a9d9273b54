"""dmem's memory store on Milvus (Lite for file URIs, a server for http URIs).

Not the PyPI ``milvus`` server wheel: that one is installed into an isolated
directory and started by ``EmbeddedMilvusServer`` (see ``milvus.server``).
"""

from milvus.server import EmbeddedMilvusServer, milvus_lite_uri
from milvus.store import MemoryStore

__all__ = ["EmbeddedMilvusServer", "MemoryStore", "milvus_lite_uri"]
