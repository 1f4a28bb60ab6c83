"""The in-sandbox toolset runner: the tools of `agent_toolset_20260401`, run inside a sandbox.

Standard library only (Python >= 3.10): it is copied into every sandbox and runs there, as the sandbox
user. `daemon` owns a persistent bash and serves tool calls on a unix socket; `client` is the relay a
provider runs once per call. The host side only imports `bundle` (the files to copy in), `client` (the
paths) and `schema` (the tool names and input schemas).
"""
