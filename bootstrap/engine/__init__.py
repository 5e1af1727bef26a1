"""The operations: ensure, status, repair, the interpreter override, and what they return."""
