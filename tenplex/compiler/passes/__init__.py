"""The compiler's passes, in pipeline order (`compile.compile_plan`), one small frozen class per file:

`place_ranks` (optional: permute dst ranks to keep data in place) -> `lower` (diff onto an op
graph) -> `select_sources` (locality first, then the least-loaded NIC) -> `coalesce` (copies into
messages) -> `schedule` (messages into rounds within the memory budget). `choice/`: the
least-sent host and least-loaded device choices that `select_sources` makes.
"""
