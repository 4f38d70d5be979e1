"""The memory of validated mechanisms (SQLite) and deployment signatures."""
from .signature import SIMILAR, deployment_signature, signature_key, similarity
from .store import (Failure, Mechanism, MemoryStore, MemoryStoreError, MemoryView,
                    default_memory_path)

__all__ = ["SIMILAR", "deployment_signature", "signature_key", "similarity", "Failure",
           "Mechanism", "MemoryStore", "MemoryStoreError", "MemoryView", "default_memory_path"]
